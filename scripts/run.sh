#!/usr/bin/env bash
# Start the production web server (gunicorn, config/gunicorn.conf.py) and one supervised django-q2
# worker cluster (manage.py worker); Ctrl-C or SIGTERM stops both, each within GRIDGATE_STOP_GRACE
# seconds, and the script exits only when both are gone. If either dies, the other is stopped too.
set -uo pipefail
cd "$(dirname "$0")/.."
HOST=${HOST:-127.0.0.1}
PORT=${PORT:-8000}
PY=${PYTHON:-.venv/bin/python}
export HOST PORT
mkdir -p var

# Each in its own session: a terminal's Ctrl-C reaches only this script, whose trap then sends
# each exactly one SIGTERM (gunicorn's graceful stop; the worker supervisor's bounded stop).
# A second signal in the middle of a stop is what wedges gunicorn's thread workers.
# The traps come first: a stop asked while the two are starting still reaches whichever started.
web= worker=
stop() {
  trap - INT TERM EXIT
  # $! as well: a signal between a start and its "x=$!" must not leave that one running.
  kill -TERM $web $worker $! 2>/dev/null
  wait $web $worker $! 2>/dev/null
}
trap 'stop; exit 0' INT TERM
trap stop EXIT
setsid "$PY" manage.py worker >>var/worker.log 2>&1 &
worker=$!
setsid "$PY" -m gunicorn -c config/gunicorn.conf.py config.wsgi:application &
web=$!

cat <<MSG

  Gridgate is starting at http://$HOST:$PORT/  (gunicorn, config/gunicorn.conf.py)
    admin:      http://$HOST:$PORT/admin/
    API:        http://$HOST:$PORT/api/v1/
    API docs:   http://$HOST:$PORT/api/docs/
  Demo logins: admin/admin (staff), alice/alice (member of qpu-users), bob/bob
  Worker (manage.py worker: django-q2 qcluster + ticker) log: var/worker.log   Stop with Ctrl-C.

MSG
# Returns when either process ends (or a signal arrives: the trap then stops both).
wait -n "$web" "$worker"
status=$?
stop
exit "$status"
