#!/usr/bin/env bash
# Start the web server and one django-q2 worker cluster; stop both on Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
HOST=${HOST:-127.0.0.1}
PORT=${PORT:-8000}
mkdir -p var
.venv/bin/python manage.py qcluster >var/worker.log 2>&1 &
worker=$!
trap 'kill $worker 2>/dev/null || true; wait $worker 2>/dev/null || true' EXIT INT TERM
cat <<MSG

  Gridgate is starting at http://$HOST:$PORT/
    admin:      http://$HOST:$PORT/admin/
    API:        http://$HOST:$PORT/api/v1/
    API docs:   http://$HOST:$PORT/api/docs/
  Demo logins: admin/admin (staff), alice/alice (member of qpu-users), bob/bob
  Worker (django-q2 qcluster) log: var/worker.log   Stop with Ctrl-C.

MSG
.venv/bin/python manage.py runserver --noreload "$HOST:$PORT"
