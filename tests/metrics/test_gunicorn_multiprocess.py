"""Several gunicorn worker processes, one /metrics that counts them all (prometheus-client's
multiprocess mode, set up by config/gunicorn.conf.py)."""

import os
import runpy
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.db import connection
from prometheus_client.parser import text_string_to_metric_families

from tests.core.test_process_stop import free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "m" * 32


def get(port, path, token=None):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - loopback
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except OSError:
        return None, ""


def health_requests_counted(port) -> float:
    status, body = get(port, "/metrics", TOKEN)
    assert status == 200
    return sum(
        s.value
        for f in text_string_to_metric_families(body)
        if f.name == "gridgate_http_request_duration_seconds"
        for s in f.samples
        if s.name.endswith("_count") and s.labels["route"] == "/api/v1/health/"
    )


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_every_gunicorn_worker_is_counted_in_one_scrape(tmp_path):
    db = connection.settings_dict
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    env.update(
        DATABASE_URL=f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
        PORT=str(port),
        DEBUG="true",
        GRIDGATE_STOP_GRACE="5",
        GRIDGATE_WEB_WORKERS="2",
        GRIDGATE_WEB_THREADS="4",
        GRIDGATE_VAR_DIR=str(tmp_path),
        GRIDGATE_METRICS_TOKEN=TOKEN,
        TMPDIR=str(tmp_path / "tmp"),  # where the server makes its private metrics directory
    )
    (tmp_path / "tmp").mkdir()
    server = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", "config/gunicorn.conf.py", "config.wsgi:application"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_until(lambda: get(port, "/api/v1/health/")[0] == 200, 120), "gunicorn never answered"
        (directory,) = (tmp_path / "tmp").glob("gridgate-metrics-*")
        sent = 1
        # Bursts of concurrent requests until both worker processes have answered some (each
        # writes its own file), bounded.
        with ThreadPoolExecutor(max_workers=8) as pool:
            for _ in range(20):
                statuses = list(pool.map(lambda _: get(port, "/api/v1/health/")[0], range(16)))
                assert statuses == [200] * 16
                sent += 16
                if len(list(directory.glob("histogram_*.db"))) >= 2:
                    break
        assert len(list(directory.glob("histogram_*.db"))) >= 2, "one worker answered every request"
        # Every scrape, whichever worker answers it, counts the requests of both.
        assert [health_requests_counted(port) for _ in range(4)] == [sent] * 4
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    assert not directory.exists(), "the server's private metrics directory outlived it"


def test_a_given_multiprocess_directory_is_emptied_of_stale_files_at_start(tmp_path, monkeypatch):
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.delenv("GRIDGATE_METRICS_DIR_CREATED", raising=False)
    (tmp_path / "histogram_4242.db").write_bytes(b"a previous run's counts")
    (tmp_path / "notes.txt").write_text("not ours")
    config = runpy.run_path(str(ROOT / "config" / "gunicorn.conf.py"))
    assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == str(tmp_path)  # the operator's choice is kept
    config["on_starting"](None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    config["on_exit"](None)
    assert tmp_path.is_dir()  # never removed: not created by the server


def test_a_directory_created_by_another_master_is_neither_shared_nor_removed(tmp_path, monkeypatch):
    """gunicorn's USR2 re-exec: the new master inherits the old one's environment. It makes its
    own directory, and only the master that created a directory removes it at exit."""
    import tempfile

    old = tmp_path / "old-master"
    old.mkdir()
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(old))
    monkeypatch.setenv("GRIDGATE_METRICS_DIR_CREATED", "1")  # another master's pid (never ours)
    config = runpy.run_path(str(ROOT / "config" / "gunicorn.conf.py"))
    own = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    assert own.parent == tmp_path / "tmp" and os.environ["GRIDGATE_METRICS_DIR_CREATED"] == str(os.getpid())
    config["on_starting"](None)
    config["on_exit"](None)
    assert not own.exists() and old.is_dir()
    # The old master's view of the same moment: a directory another pid created stays.
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(old))
    monkeypatch.setenv("GRIDGATE_METRICS_DIR_CREATED", "1")
    config["on_exit"](None)
    assert old.is_dir()
