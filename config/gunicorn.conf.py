"""gunicorn settings for `make run` (scripts/run.sh) and production (docs/deployment.md).

Processes and threads: requests wait on PostgreSQL and munged, so a few threads per process
overlap those waits; the CPU work needs processes, since one process's threads take turns on its
GIL. 4 processes x 4 threads served more than 2 x 8 with the same 16 threads on 2 cores, at the
same ratios to the floor (bench/http_load.py, interleaved runs; docs/deployment.md has the
figures), for a little more memory (the processes share the preloaded application).
Each thread keeps its own persistent database connection (CONN_MAX_AGE): size PostgreSQL's
max_connections for workers x threads per host. Every value can be overridden by an environment
variable.
"""

import os

bind = f"{os.environ.get('HOST', '127.0.0.1')}:{os.environ.get('PORT', '8000')}"
worker_class = "gthread"
workers = int(os.environ.get("GRIDGATE_WEB_WORKERS", "4"))
threads = int(os.environ.get("GRIDGATE_WEB_THREADS", "4"))
# runserver's listen backlog of 10 reset connections of a burst (docs/deployment.md).
backlog = int(os.environ.get("GRIDGATE_WEB_BACKLOG", "2048"))
# SIGTERM: stop accepting, finish in-flight requests for up to the grace period, then exit.
graceful_timeout = int(os.environ.get("GRIDGATE_STOP_GRACE", "30"))
timeout = int(os.environ.get("GRIDGATE_WEB_TIMEOUT", "120"))
keepalive = 5
# What gunicorn refuses before the application sees a request (docs/deployment.md, "Request
# size limits"): the request line (path and query string), each header, and how many headers.
# 8190 is gunicorn's largest bounded line and nginx's default buffer (large_client_header_buffers
# 4 8k), so a request the proxy passes on is not refused here for its size. Its refusals (414,
# 431, 400) are answered as the API's JSON errors, not gunicorn's HTML page.
from apps.core import gunicorn_errors  # noqa: E402 - standard library only, no Django

limit_request_line = gunicorn_errors.limit("GRIDGATE_WEB_LIMIT_REQUEST_LINE", 8190, low=256, high=8190)
limit_request_fields = gunicorn_errors.limit("GRIDGATE_WEB_LIMIT_REQUEST_FIELDS", 100, low=10, high=32768)
limit_request_field_size = gunicorn_errors.limit("GRIDGATE_WEB_LIMIT_REQUEST_FIELD_SIZE", 8190, low=256, high=65536)
gunicorn_errors.install(line=limit_request_line, fields=limit_request_fields, size=limit_request_field_size)
# Load the application once in the master: a configuration error (e.g. DEBUG off without
# ALLOWED_HOSTS) stops the server at start with its message instead of looping worker boots.
preload_app = True
# gunicorn 27's control socket defaults to one path per user ($HOME/.gunicorn/gunicorn.ctl): two
# servers of one account on a host (a second site, the scale-out test's two web processes) would
# take each other's socket, and a stop could wait on the other's. Gridgate does not use gunicornc.
control_socket_disable = True
accesslog = os.environ.get("GRIDGATE_WEB_ACCESS_LOG") or None  # "-" for stdout
errorlog = "-"
loglevel = os.environ.get("GRIDGATE_LOG_LEVEL", "info").lower()

# Request metrics of every worker process in one /metrics (apps/metrics/middleware.py):
# prometheus-client's multiprocess mode keeps each process's values in files under
# PROMETHEUS_MULTIPROC_DIR, which must be set before the application is imported (this file is
# read first) and hold only this server's files. Unset: a fresh private directory per server,
# removed when the master that created it exits, so two servers on one host never mix or wipe
# each other's files. GRIDGATE_METRICS_DIR_CREATED names that master by pid: a USR2 re-exec
# inherits the environment, and the old master exiting would otherwise remove the directory the
# new one uses (every request observation then fails). The new master, seeing another master's
# directory, makes its own. Production: prefer systemd's RuntimeDirectory= (docs/deployment.md),
# which no tmp cleaner touches.
_inherited = os.environ.get("GRIDGATE_METRICS_DIR_CREATED")
if not os.environ.get("PROMETHEUS_MULTIPROC_DIR") or (_inherited and _inherited != str(os.getpid())):
    import tempfile

    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="gridgate-metrics-")
    os.environ["GRIDGATE_METRICS_DIR_CREATED"] = str(os.getpid())


def on_starting(server):
    """A directory given by the operator may hold a previous run's files (pids of dead processes
    whose counts would be added again): remove those files, and only those, before any worker
    starts (runs once per server start, not on reload)."""
    from pathlib import Path

    if os.environ.get("GRIDGATE_METRICS_DIR_CREATED"):
        # The master's pid now (--daemon forks after this file was read): on_exit compares it.
        os.environ["GRIDGATE_METRICS_DIR_CREATED"] = str(os.getpid())
    directory = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.db"):
        stale.unlink(missing_ok=True)


def when_ready(server):
    """Before the first worker forks (the application is preloaded): import Pulser, which the
    payload check of every job submission reads sequences with (R-DEV-1), once, shared by the
    workers. Imported lazily, it stalled each worker's first submission for seconds (numpy,
    matplotlib, its schemas) while that client and the requests queued behind it waited."""
    from apps.scheduling.drivers.sequences import pulser_deserializer

    pulser_deserializer()


def child_exit(server, worker):
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def on_exit(server):
    """Remove the directory this master created (never one the operator gave, never one another
    master created and still uses)."""
    if os.environ.get("GRIDGATE_METRICS_DIR_CREATED") == str(os.getpid()):
        import shutil

        shutil.rmtree(os.environ["PROMETHEUS_MULTIPROC_DIR"], ignore_errors=True)
