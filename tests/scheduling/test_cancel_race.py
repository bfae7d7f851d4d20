"""A cancel recorded before the dispatcher hands a job to its device wins.

The user saw the job pending and pressed Cancel; the dispatcher had just claimed it (the job reads
running) but not yet called the driver. The job must never reach the device."""

import pytest

from apps.scheduling import passes, services
from apps.scheduling.models import DriverRun, JobStatus

pytestmark = pytest.mark.django_db


def test_cancel_recorded_between_claim_and_hand_over_wins_and_nothing_reaches_the_device(
    api, qpu_pool, fake_device, open_session, owner
):
    session = open_session(qpu_pool, owner)
    job = services.submit_job(user=owner, session_id=session.pk, payload={"i": 1}, shots=5)
    claimed = passes.dispatch_once(qpu_pool.pk)  # the dispatcher, paused between claim and hand-over
    assert claimed.pk == job.pk

    response = api(owner).post(f"/api/v1/jobs/{job.pk}/cancel/")
    assert response.status_code == 200

    passes.submit_claimed(claimed)  # the dispatcher resumes
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED
    assert job.error == "Cancelled before it started."
    assert not DriverRun.objects.filter(remote_id=f"fake-{job.pk}").exists()  # never submitted
    fake_device.refresh_from_db()
    assert passes.dispatch_once(qpu_pool.pk) is None  # and its device is free again


def test_a_cancel_after_the_hand_over_asks_the_device_to_stop(api, qpu_pool, fake_device, open_session, owner):
    session = open_session(qpu_pool, owner)
    job = services.submit_job(user=owner, session_id=session.pk, payload={"i": 1}, shots=5)
    passes.submit_claimed(passes.dispatch_once(qpu_pool.pk))
    assert DriverRun.objects.filter(remote_id=f"fake-{job.pk}").exists()
    assert api(owner).post(f"/api/v1/jobs/{job.pk}/cancel/").status_code == 200
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING and job.cancel_requested_at is not None
