"""Issue 17: enqueueing happens after commit, and a broker failure never turns a committed request
into a 500; the tick loop's passes do the work anyway."""

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
