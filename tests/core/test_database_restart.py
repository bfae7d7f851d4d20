"""A database restart under the production server: its persistent connections die with it, and
with no per-request ping (config/env.py) each thread's next request finds out. That request must
be a 503 JSON answer with Retry-After, never a 500, and the thread's next one must work again."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
import requests
from django.db import connection

from apps.accounts.services import issue_token

ROOT = Path(__file__).resolve().parents[2]
WORKERS, THREADS = 1, 2


def database_url() -> str:
    db = connection.settings_dict
    auth = db["USER"] + (f":{db['PASSWORD']}" if db.get("PASSWORD") else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_gunicorn(port: int, tmp_path: Path) -> subprocess.Popen:
    env = dict(
        os.environ,
        DATABASE_URL=database_url(),
        ALLOWED_HOSTS="127.0.0.1",
        DEBUG="false",
        PORT=str(port),
        GRIDGATE_WEB_WORKERS=str(WORKERS),
        GRIDGATE_WEB_THREADS=str(THREADS),
        GRIDGATE_VAR_DIR=str(tmp_path),
    )
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    env.pop("CONN_HEALTH_CHECKS", None)  # the default is what is tested
    process = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", "config/gunicorn.conf.py", "config.wsgi:application"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(1200):  # bounded: about two minutes on a busy machine
        try:
            requests.get(f"http://127.0.0.1:{port}/api/v1/health/", timeout=1)
            return process
        except requests.RequestException:  # not listening yet, or still loading the application
            if process.poll() is not None:
                raise RuntimeError("gunicorn exited at start") from None
            time.sleep(0.1)
    process.kill()
    process.wait()
    raise RuntimeError("gunicorn did not start")


def terminate_other_backends() -> int:
    """``pg_terminate_backend`` of every connection to the test database but this test's own:
    what a database restart does to the server's persistent connections."""
    with psycopg.connect(database_url().replace("postgres://", "postgresql://"), autocommit=True) as conn:
        return conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database()"
            " AND backend_type = 'client backend' AND pid NOT IN (pg_backend_pid(), %s)",
            [connection.connection.info.backend_pid],
        ).fetchone()[0]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_database_restart_costs_each_thread_one_503_json_answer_never_a_500(owner, local_pool, tmp_path):
    key = issue_token(owner)[1]
    headers = {"Authorization": f"Token {key}"}
    port = free_port()
    server = start_gunicorn(port, tmp_path)
    base = f"http://127.0.0.1:{port}/api/v1"
    try:
        with requests.Session() as http:
            # Every server thread opens its persistent connection.
            for _ in range(4 * THREADS):
                assert http.get(f"{base}/sessions/", headers=headers, timeout=30).status_code == 200
            assert terminate_other_backends() >= 1
            answers = []
            for i in range(8 * WORKERS * THREADS):
                if i % 2:
                    response = http.post(
                        f"{base}/sessions/",
                        json={"resource_class": local_pool.classes.get().pk},
                        headers=headers,
                        timeout=30,
                    )
                else:
                    response = http.get(f"{base}/sessions/", headers=headers, timeout=30)
                answers.append(response)
        statuses = [response.status_code for response in answers]
        assert 500 not in statuses, statuses
        failed = [response for response in answers if response.status_code == 503]
        assert len(failed) <= WORKERS * THREADS, statuses  # at most one per thread
        for response in failed:
            assert response.headers["Content-Type"].startswith("application/json")
            assert response.json()["detail"] and response.headers["Retry-After"]
        # Every thread has reconnected: the last round is all served.
        assert all(status in (200, 201) for status in statuses[-2 * WORKERS * THREADS :]), statuses
    finally:
        server.terminate()
        server.wait(timeout=60)
