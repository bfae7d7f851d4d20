"""Enqueueing happens after commit, and a broker failure never turns a committed request into a
500; the tick loop's passes do the work anyway."""

import pytest

from apps.core import ticker
from apps.scheduling.models import Device, Job, JobStatus
from tests.scheduling.pulser_sequences import analog_sequence

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_broker_down_really_refuses_tasks(broker_down):
    from django_q.tasks import async_task

    with pytest.raises(Exception, match="Connect|connect|refused"):
        async_task("math.floor", 1.5)


def test_job_submitted_while_the_broker_is_down_answers_201_and_is_run_by_the_tick_loop(
    api, owner, qpu_pool, open_session, broker_down, settings
):
    settings.GRIDGATE_JOB_POLL_INTERVAL = 0  # every tick polls (the fake device completes on its 2nd poll)
    Device.objects.create(pool=qpu_pool, name="fake", driver="fake", config={"script": ["running", "completed"]})
    session = open_session(qpu_pool, owner)
    body = {"payload": {"sequence": analog_sequence()}, "shots": 5}
    url = f"/api/v1/sessions/{session.pk}/jobs/"
    response = api(owner).post(url, body, format="json", HTTP_IDEMPOTENCY_KEY="job-1")
    assert response.status_code == 201, response.content
    # A client that retries anyway (it saw a timeout) gets the same job, not a duplicate.
    again = api(owner).post(url, body, format="json", HTTP_IDEMPOTENCY_KEY="job-1")
    assert again.status_code == 201 and again.json()["id"] == response.json()["id"]
    assert Job.objects.count() == 1
    job = Job.objects.get(pk=response.json()["id"])
    assert job.status == JobStatus.PENDING  # committed, and no task reached a worker
    loop = ticker.Ticker("test")
    for _ in range(20):  # bounded: a few steps of the loop
        loop.last_run.clear()  # every pass due at each step
        loop.run_due()
        job.refresh_from_db()
        if job.status == JobStatus.COMPLETED:
            break
    assert job.status == JobStatus.COMPLETED


def test_cancel_while_the_broker_is_down_answers_200(api, owner, qpu_pool, open_session, broker_down):
    Device.objects.create(pool=qpu_pool, name="fake", driver="fake", config={"script": ["running"] * 50})
    session = open_session(qpu_pool, owner)
    client = api(owner)
    job_id = client.post(
        f"/api/v1/sessions/{session.pk}/jobs/", {"payload": {"sequence": analog_sequence()}, "shots": 5}, format="json"
    ).json()["id"]
    ticker.Ticker("test").run_due()  # dispatched: running on the device
    assert Job.objects.get(pk=job_id).status == JobStatus.RUNNING
    response = client.post(f"/api/v1/jobs/{job_id}/cancel/")
    assert response.status_code == 200, response.content


def test_a_silent_redis_fails_the_enqueue_within_its_socket_timeouts(monkeypatch):
    """A Redis that accepts connections and never answers (a wedged server, a proxy in between)
    fails an enqueue within the socket timeouts the settings add to GRIDGATE_REDIS_URL, instead of
    holding the committed request for the minutes redis-py waits by default."""
    import os
    import socket
    import subprocess
    import sys

    from django_q.conf import Conf
    from django_q.tasks import async_task

    from tests.core.test_settings import ROOT

    printed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from django.conf import settings; print(settings.Q_CLUSTER['redis'])",
        ],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "GRIDGATE_REDIS_URL": "redis://:pw@broker.example:6379/3",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    url = printed.stdout.strip()
    assert "socket_connect_timeout=" in url and "socket_timeout=" in url, printed.stderr
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes connections; nobody ever reads or answers
        port = silent.getsockname()[1]
        monkeypatch.setattr(Conf, "ORM", None)
        monkeypatch.setattr(Conf, "REDIS", url.replace("broker.example:6379", f"127.0.0.1:{port}"))
        # Without the timeouts this waits forever (pytest-timeout would fail the test instead).
        with pytest.raises(Exception, match="[Tt]imeout|timed out"):
            async_task("math.floor", 1.5)
