"""R-JOB-2 against R-JOB-3 under concurrency (PostgreSQL, threads): a job whose hand-over to its
device fails transiently while its owner cancels it ends cancelled; it never goes back to the
queue the owner took it out of."""

import threading

import pytest
from django.db import connection

from apps.scheduling import passes, services
from apps.scheduling.models import Device, DriverRun, Job, JobStatus
from apps.sessions.models import Session
from tests.conftest import client_for

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_a_cancel_while_the_hand_over_fails_transiently_ends_the_job(monkeypatch, qpu_pool, open_session, owner):
    """The dispatcher claimed the job (it reads running) and its device refused the submission
    for now; the owner cancels at that moment (200: a running job's cancel is requested). The
    dispatcher then put the job back in the queue: pending again after the owner's cancel was
    accepted, dispatched again after its back-off and charged to the session for a turn it
    never had."""
    Device.objects.create(
        pool=qpu_pool, name="flaky", driver="fake", config={"fail_submit": "transient", "fail_submit_times": 1}
    )
    session = open_session(qpu_pool, owner, slots=2)
    job = services.submit_job(user=owner, session_id=session.pk, payload={"i": 1}, shots=1)
    failed, cancelled = threading.Event(), threading.Event()
    original = passes._requeue

    def requeue(claimed, exc):
        failed.set()  # the device refused the hand-over; the job still reads running
        cancelled.wait(30)
        return original(claimed, exc)

    monkeypatch.setattr(passes, "_requeue", requeue)
    answers = {}

    def dispatch():
        try:
            passes.run_pool(qpu_pool.pk)
        finally:
            connection.close()

    def cancel():
        try:
            assert failed.wait(30)
            answers["cancel"] = client_for(owner).post(f"/api/v1/jobs/{job.pk}/cancel/").status_code
        finally:
            cancelled.set()
            connection.close()

    threads = [threading.Thread(target=dispatch), threading.Thread(target=cancel)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert answers["cancel"] == 200
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED  # not back in the queue
    assert not DriverRun.objects.filter(remote_id=f"fake-{job.pk}").exists()  # never on the device
    assert Session.objects.get(pk=session.pk).vruntime == 0  # and the session is not charged for it
    Job.objects.filter(pk=job.pk).update(not_before=None)
    passes.run_pool(qpu_pool.pk)
    assert Job.objects.get(pk=job.pk).status == JobStatus.CANCELLED
