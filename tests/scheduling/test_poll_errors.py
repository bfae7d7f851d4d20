"""R-JOB-3 while polling: an unexpected exception is transient (the job may still be running on
the device); only the driver's PermanentDriverError fails it."""

import pytest

from apps.scheduling import passes, services
from apps.scheduling.drivers import PermanentDriverError
from apps.scheduling.drivers.fake import FakeDriver
from apps.scheduling.models import Job, JobStatus

pytestmark = pytest.mark.django_db


def running_job(qpu_pool, owner, open_session):
    session = open_session(qpu_pool, owner)
    job = services.submit_job(user=owner, session_id=session.pk, payload={}, shots=1)
    passes.run_pool(qpu_pool.pk)  # dispatched and submitted
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING and job.remote_id
    Job.objects.filter(pk=job.pk).update(next_poll_at=None)  # due now
    return job


def test_unexpected_exception_while_polling_is_transient(qpu_pool, fake_device, open_session, owner, monkeypatch):
    job = running_job(qpu_pool, owner, open_session)

    def broken(self, device, remote_id):
        raise KeyError("a driver bug")

    monkeypatch.setattr(FakeDriver, "poll", broken)
    passes.poll_running(qpu_pool.pk)
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING  # not failed: polled again later
    assert "KeyError" in job.error and job.next_poll_at is not None
    monkeypatch.undo()
    for _ in range(2):  # the fake device answers running, then completed
        Job.objects.filter(pk=job.pk).update(next_poll_at=None)  # due now (no waiting out the cadence)
        passes.poll_running(qpu_pool.pk)
    job.refresh_from_db()
    assert job.status == JobStatus.COMPLETED


def test_permanent_driver_error_while_polling_fails_the_job(qpu_pool, fake_device, open_session, owner, monkeypatch):
    job = running_job(qpu_pool, owner, open_session)

    def gone(self, device, remote_id):
        raise PermanentDriverError("the device lost the run")

    monkeypatch.setattr(FakeDriver, "poll", gone)
    passes.poll_running(qpu_pool.pk)
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and "lost the run" in job.error
