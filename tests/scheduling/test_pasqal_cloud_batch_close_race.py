"""A session ending while one of its jobs creates the session's open Pasqal Cloud batch (the
pasqal_cloud driver's ``open_batches``): the closing pass and the submission meet on the batch's
row, and the batch at Pasqal Cloud is closed whichever goes first, with the job in it once.

Where a job is added to a batch the pass has already closed, Pasqal Cloud refuses the addition and
the job opens a new batch (``test_pasqal_cloud.py``): never lost, never sent twice. The window was
the creation: the row has no batch id until Pasqal Cloud answers, and the pass closed such a row
in the database only, so the batch created a moment later stayed open at Pasqal Cloud, holding its
device, with nothing left to close it."""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from apps.scheduling import services
from apps.scheduling.drivers import pasqal_cloud
from apps.scheduling.drivers.pasqal_cloud import PasqalCloudDriver
from apps.scheduling.models import DriverRun, OpenBatch
from apps.sessions import services as sessions
from tests.scheduling.pulser_sequences import analog_sequence

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.parametrize("cloud", ["loopback"], indirect=True),  # the races hold its HTTP calls
]


def closed_while_created(monkeypatch, device, job, *, stale_read: bool):
    """Submit ``job`` (it creates the session's batch) on one thread while another ends the
    session and runs the closing pass. ``stale_read``: the pass reads the row before the
    submission records the batch's id and writes after (else: the pass runs whole first)."""
    recorded, closing_read, closed = threading.Event(), threading.Event(), threading.Event()
    record = PasqalCloudDriver._record
    closing = threading.local()

    def held_record(self, *args, **kwargs):  # Pasqal Cloud has answered; the row is not written yet
        (closing_read if stale_read else closed).wait(timeout=10)
        try:
            return record(self, *args, **kwargs)
        finally:
            recorded.set()

    monkeypatch.setattr(PasqalCloudDriver, "_record", held_record)
    real_now = pasqal_cloud.timezone.now

    class Clock:  # the pass's write asks the time first: hold it there, after its read
        @staticmethod
        def now():
            if getattr(closing, "pass_", False) and stale_read:
                closing_read.set()
                recorded.wait(timeout=10)
            return real_now()

    monkeypatch.setattr(pasqal_cloud, "timezone", Clock)
    created = threading.Event()
    create = OpenBatch.objects.create

    def noted_create(*args, **kwargs):
        row = create(*args, **kwargs)
        created.set()
        return row

    monkeypatch.setattr(OpenBatch.objects, "create", noted_create)

    def submitting():
        try:
            return PasqalCloudDriver().submit(device, job)
        finally:
            connection.close()

    def ending():
        try:
            assert created.wait(timeout=30)  # the row exists, its batch is being created
            sessions.revoke(session_ids=[job.session_id])
            closing.pass_ = True
            return pasqal_cloud.close_ended_batches()
        finally:
            closed.set()
            connection.close()

    with ThreadPoolExecutor(max_workers=2) as executor:
        submitted, ended = executor.submit(submitting), executor.submit(ending)
        return submitted.result(), ended.result()


@pytest.mark.parametrize(
    "stale_read, unreachable",
    [(False, False), (True, False), (False, True)],
    ids=["pass_first", "pass_read_before_the_record", "pass_first_then_the_close_fails_once"],
)
def test_a_batch_closed_while_its_creator_awaits_the_answer_is_closed_at_pasqal_cloud(
    qpu_pool, streaming_device, cloud, open_session, owner, stale_read, unreachable
):
    """``unreachable``: the creator's own close of the batch finds Pasqal Cloud unreachable; the
    next pass closes it."""
    session = open_session(qpu_pool, owner)
    job = services.submit_job(user=owner, session_id=session.pk, payload={"sequence": analog_sequence()}, shots=10)
    with pytest.MonkeyPatch.context() as hooks:
        if unreachable:
            hooks.setattr(pasqal_cloud, "close_at_provider", lambda device, batch_id: False)
        remote_id, _ = closed_while_created(hooks, streaming_device, job, stale_read=stale_read)
    pasqal_cloud.close_ended_batches()  # the next tick's pass, for what is still open

    (batch,) = cloud.batches.values()
    assert [j["id"] for j in cloud.jobs_of(batch["id"])] == [remote_id]  # the job, once
    assert DriverRun.objects.get(pk=f"gridgate-job-{job.pk}").external_id == remote_id
    assert batch["open"] is False  # closed at Pasqal Cloud: its device is free again
    assert OpenBatch.objects.get().closed_at is not None
    assert not OpenBatch.objects.filter(closed_at=None).exists()


def test_a_job_added_to_a_batch_the_pass_closes_meanwhile_goes_once_in_the_next_batch(
    qpu_pool, streaming_device, cloud, open_session, owner, monkeypatch
):
    session = open_session(qpu_pool, owner)
    first = services.submit_job(user=owner, session_id=session.pk, payload={"sequence": analog_sequence()}, shots=10)
    PasqalCloudDriver().submit(streaming_device, first)  # the session's open batch, with its first job
    (old,) = cloud.batches
    second = services.submit_job(user=owner, session_id=session.pk, payload={"sequence": analog_sequence()}, shots=20)
    adding, closed = threading.Event(), threading.Event()
    add = PasqalCloudDriver._add

    def held_add(self, *args, **kwargs):  # the open batch is read; its addition not sent yet
        adding.set()
        closed.wait(timeout=10)
        return add(self, *args, **kwargs)

    monkeypatch.setattr(PasqalCloudDriver, "_add", held_add)

    def submitting():
        try:
            return PasqalCloudDriver().submit(streaming_device, second)
        finally:
            connection.close()

    def ending():
        try:
            assert adding.wait(timeout=30)
            sessions.revoke(session_ids=[session.pk])
            return pasqal_cloud.close_ended_batches()
        finally:
            closed.set()
            connection.close()

    with ThreadPoolExecutor(max_workers=2) as executor:
        submitted, ended = executor.submit(submitting), executor.submit(ending)
        remote_id, closed_now = submitted.result(), ended.result()
    pasqal_cloud.close_ended_batches()  # the next tick's pass

    assert closed_now == 1 and cloud.batches[old]["open"] is False
    new = next(b for b in cloud.batches.values() if b["id"] != old)
    assert [j["id"] for j in cloud.jobs_of(new["id"])] == [remote_id]  # in the next batch, once
    assert len(cloud.jobs_of(old)) == 1  # never also in the closed one
    assert DriverRun.objects.get(pk=f"gridgate-job-{second.pk}").external_id == remote_id
    assert new["open"] is False and not OpenBatch.objects.filter(closed_at=None).exists()
