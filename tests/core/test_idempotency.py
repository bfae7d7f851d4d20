"""Idempotency-Key bound to the work (SPEC §7, §10): a request killed mid-way leaves no stuck key,
concurrent repeats run the work once, a response lost after the commit is replayed."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest
import requests
from django.db import connection
from rest_framework.renderers import JSONRenderer
from rest_framework.test import APIClient

from apps.accounts.services import issue_token
from apps.core.models import IdempotencyKey
from apps.sessions.models import Session

ROOT = Path(__file__).resolve().parents[2]


def database_url() -> str:
    db = connection.settings_dict
    auth = db["USER"] + (f":{db['PASSWORD']}" if db.get("PASSWORD") else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(port: int) -> subprocess.Popen:
    """A real web process on the test database (runserver without autoreload)."""
    env = dict(os.environ, DATABASE_URL=database_url(), ALLOWED_HOSTS="127.0.0.1", DEBUG="false")
    process = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(600):  # bounded: at most about a minute on a busy machine
        try:
            requests.get(f"http://127.0.0.1:{port}/api/v1/health/", timeout=1)
            return process
        except requests.ConnectionError:
            if process.poll() is not None:
                raise RuntimeError("the server exited at start") from None
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("the server did not start")


def wait_for_a_lock_waiter(conn) -> None:
    """Until a backend of the test database waits on a lock (the request is inside its work)."""
    for _ in range(600):
        waiting = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchone()[0]
        if waiting:
            return
        time.sleep(0.1)
    raise AssertionError("the request never reached its work")


def post_and_lose_the_answer(url, body, headers) -> None:
    try:
        requests.post(url, json=body, headers=headers, timeout=60)
    except requests.RequestException:
        pass  # the server is killed under this request: no answer is expected


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_request_killed_mid_work_leaves_no_stuck_key_and_the_retry_succeeds(owner, local_pool):
    token = issue_token(owner)[1]
    body = {"resource_class": local_pool.classes.get().pk}
    headers = {"Authorization": f"Token {token}", "Idempotency-Key": "killed-1"}
    port = free_port()
    server = start_server(port)
    url = f"http://127.0.0.1:{port}/api/v1/sessions/"
    try:
        with psycopg.connect(database_url().replace("postgres://", "postgresql://")) as blocker:
            # Hold the pool's usage row lock: admission (inside the request's work, after the
            # key's INSERT) waits on it, and the server is killed right there.
            blocker.execute("SELECT 1 FROM resources_poolusage WHERE pool_id = %s FOR UPDATE", [local_pool.pk])
            with psycopg.connect(database_url().replace("postgres://", "postgresql://"), autocommit=True) as watch:
                first = threading.Thread(target=post_and_lose_the_answer, args=(url, body, headers), daemon=True)
                first.start()
                wait_for_a_lock_waiter(watch)
                server.send_signal(signal.SIGKILL)
                server.wait(timeout=30)
            blocker.rollback()
        server = start_server(port)
        retry = requests.post(url, json=body, headers=headers, timeout=60)
        assert retry.status_code == 201, retry.text
        assert "Idempotent-Replayed" not in retry.headers
        again = requests.post(url, json=body, headers=headers, timeout=60)
        assert again.status_code == 201 and again.json()["id"] == retry.json()["id"]
        assert again.headers["Idempotent-Replayed"] == "true"
        assert Session.objects.count() == 1
    finally:
        server.kill()
        server.wait(timeout=30)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_repeats_with_one_key_run_the_work_once_and_all_get_its_answer(owner, local_pool):
    body = {"resource_class": local_pool.classes.get().pk}

    def attempt(_):
        try:
            client = APIClient()
            client.force_authenticate(owner)
            response = client.post("/api/v1/sessions/", body, format="json", HTTP_IDEMPOTENCY_KEY="race-1")
            return response.status_code, response.json().get("id")
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=8) as pool:
        outcomes = list(pool.map(attempt, range(16)))
    assert {status for status, _ in outcomes} == {201}, outcomes
    assert len({sid for _, sid in outcomes}) == 1
    assert Session.objects.count() == 1 and IdempotencyKey.objects.count() == 1


@pytest.mark.django_db
def test_response_lost_after_the_commit_is_replayed_not_redone(api, owner, local_pool, monkeypatch):
    """A duplicate request: the work committed, then the response failed (a 500); the retry with
    the same key must get the first answer, not a second session."""
    real_render = JSONRenderer.render
    failed = []

    def fail_once(self, data, accepted_media_type=None, renderer_context=None):
        if (renderer_context or {}).get("response") is not None and not failed:  # the server's answer
            failed.append(True)
            raise RuntimeError("the connection dropped while answering")
        return real_render(self, data, accepted_media_type, renderer_context)

    monkeypatch.setattr(JSONRenderer, "render", fail_once)
    client = api(owner)
    body = {"resource_class": local_pool.classes.get().pk}
    lost = client.post("/api/v1/sessions/", body, format="json", HTTP_IDEMPOTENCY_KEY="lost-1")
    assert lost.status_code == 500
    retry = client.post("/api/v1/sessions/", body, format="json", HTTP_IDEMPOTENCY_KEY="lost-1")
    assert retry.status_code == 201 and retry["Idempotent-Replayed"] == "true"
    assert Session.objects.count() == 1 and retry.json()["id"] == str(Session.objects.get().pk)


@pytest.mark.django_db
def test_refused_request_leaves_no_key_and_no_work(api, owner, local_pool):
    response = api(owner).post(
        "/api/v1/sessions/", {"resource_class": 0}, format="json", HTTP_IDEMPOTENCY_KEY="refused-1"
    )
    assert response.status_code == 400
    assert not IdempotencyKey.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("key", ["", " ", "k" * 256])
def test_idempotency_key_of_a_bad_length_is_400_json(api, owner, local_pool, key):
    response = api(owner).post(
        "/api/v1/sessions/", {"resource_class": local_pool.classes.get().pk}, format="json", HTTP_IDEMPOTENCY_KEY=key
    )
    assert response.status_code == 400 and "Idempotency-Key" in response.json()["detail"]
    assert not Session.objects.exists()
