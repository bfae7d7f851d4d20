"""R-SCHED-1/2: the pool's virtual time V, catch-up of sessions that become runnable, the
weighted-fair tie-break, and FIFO within a session across a transient driver error (R-SCHED-3)."""

from datetime import timedelta

import pytest

from apps.scheduling import passes, services
from apps.scheduling.models import Job, JobStatus, PoolQueue
from apps.sessions.models import Session
from tests.scheduling.conftest import complete

pytestmark = pytest.mark.django_db


def submit(session, n=1):
    return [services.submit_job(user=session.user, session_id=session.pk, payload={"n": i}, shots=1) for i in range(n)]


def turn(pool):
    """One dispatch on the pool's single one-job device, then completion: the served session."""
    job = passes.dispatch_once(pool.pk)
    assert job is not None
    passes.submit_claimed(job)
    complete(job)
    return job.session_id


def vtime(pool):
    return PoolQueue.objects.get(pool=pool).vtime


def vruntime(session):
    return Session.objects.values_list("vruntime", flat=True).get(pk=session.pk)


def test_arrival_into_an_empty_queue_takes_at_most_its_share_plus_one(
    qpu_pool, fake_device, open_session, owner, member
):
    """The newcomer burst: A runs 8 jobs and drains; B arrives while nobody has work pending and
    queues 8; A queues 8 more. B gets about half the next 8 turns, never all."""
    a = open_session(qpu_pool, owner, external_id="a")
    submit(a, 8)
    assert [turn(qpu_pool) for _ in range(8)] == [a.pk] * 8
    b = open_session(qpu_pool, member, external_id="b")
    submit(b, 8)
    assert vruntime(b) == pytest.approx(vtime(qpu_pool)) == pytest.approx(7.0)  # R-SCHED-2: V, not 0
    submit(a, 8)
    nxt = [turn(qpu_pool) for _ in range(8)]
    assert nxt.count(b.pk) <= 4 + 1  # share (4 of 8) + 1
    assert nxt.count(a.pk) >= 4 - 1


def test_one_job_at_a_time_session_keeps_its_share_against_a_backlogged_newcomer(
    qpu_pool, fake_device, open_session, owner, member
):
    """The QRMI pattern: a session that submits one job, waits for it, submits the next, is
    almost never runnable when others arrive; its history must not hand them a burst."""
    qrmi = open_session(qpu_pool, owner, external_id="qrmi")
    for _ in range(30):
        submit(qrmi)
        assert turn(qpu_pool) == qrmi.pk
    newcomer = open_session(qpu_pool, member, external_id="new")
    submit(newcomer, 20)
    turns = []
    for _ in range(10):
        submit(qrmi)  # it has nothing pending: becomes runnable again each time
        served = turn(qpu_pool)
        turns.append(served)
        if served == newcomer.pk:  # its own job is still queued: run it too
            turns.append(turn(qpu_pool))
    assert turns.count(qrmi.pk) == 10
    assert turns.count(newcomer.pk) <= 10 + 1


def test_pool_virtual_time_is_the_served_sessions_vruntime_before_the_charge(
    qpu_pool, fake_device, open_session, owner, member
):
    a, b = open_session(qpu_pool, owner, slots=2), open_session(qpu_pool, member, slots=1)
    submit(a, 3)
    submit(b, 3)
    seen = []
    for _ in range(6):
        session_id = passes.dispatch_once(qpu_pool.pk).session_id
        before = vtime(qpu_pool)
        seen.append(before)
        Job.objects.filter(session_id=session_id, status=JobStatus.RUNNING).update(status=JobStatus.COMPLETED)
    # a (older, charge 1/2) served at 0, 0.5, 1.0; b (charge 1) at 0, 1, 2: V follows, never back.
    assert seen == [0.0, 0.0, 0.5, 1.0, 1.0, 2.0]


def test_newcomer_starts_at_the_pool_virtual_time_not_at_the_largest_vruntime(
    qpu_pool, fake_device, open_session, owner, member, staff
):
    """Catch-up raises to V (the least-served runnable session's level), not to the most
    served session's vruntime (a Max where a Min was meant)."""
    low, high = open_session(qpu_pool, owner, external_id="low"), open_session(qpu_pool, member, external_id="h")
    submit(low, 5)
    submit(high, 5)
    turn(qpu_pool), turn(qpu_pool)  # both served once: V = 0
    Session.objects.filter(pk=high.pk).update(vruntime=50)
    turn(qpu_pool), turn(qpu_pool)  # low, low: V = 2
    assert vtime(qpu_pool) == pytest.approx(2.0)
    newcomer = open_session(qpu_pool, staff, external_id="n")
    submit(newcomer)
    assert vruntime(newcomer) == pytest.approx(2.0)


def test_session_with_work_pending_keeps_its_vruntime_when_it_submits_more(qpu_pool, fake_device, open_session, owner):
    """Catch-up applies when a session becomes runnable, not on every submission."""
    session = open_session(qpu_pool, owner)
    submit(session)
    PoolQueue.objects.filter(pool=qpu_pool).update(vtime=5.0)
    Session.objects.filter(pk=session.pk).update(vruntime=1.0)
    submit(session)
    assert vruntime(session) == 1.0
    Job.objects.filter(session=session).update(status=JobStatus.CANCELLED)
    submit(session)  # nothing pending any more: it becomes runnable again
    assert vruntime(session) == 5.0


def test_weighted_fair_tie_break_is_the_older_session_first(qpu_pool, fake_device, open_session, owner, member):
    """Equal vruntime: the older session goes first, whatever the ids' order. The older
    session is given the larger id, so an order by id alone picks the wrong one every time."""
    one, two = open_session(qpu_pool, owner), open_session(qpu_pool, member)
    older, younger = (one, two) if one.pk > two.pk else (two, one)
    Session.objects.filter(pk=older.pk).update(created_at=younger.created_at - timedelta(hours=1))
    submit(younger)
    submit(older)
    assert vruntime(older) == vruntime(younger)
    assert turn(qpu_pool) == older.pk


def test_fifo_within_a_session_survives_a_transient_driver_error(qpu_pool, fake_device, open_session, owner):
    """R-SCHED-3/R-JOB-3: the requeued first job waits out its back-off; the session's second
    job does not overtake it meanwhile."""
    fake_device.config = {"fail_submit": "transient", "fail_submit_times": 1}
    fake_device.save()
    session = open_session(qpu_pool, owner)
    first, second = submit(session, 2)
    job = passes.dispatch_once(qpu_pool.pk)
    assert job.pk == first.pk
    passes.submit_claimed(job)  # transient: back in the queue, with a back-off
    first.refresh_from_db()
    assert first.status == JobStatus.PENDING and first.not_before is not None
    assert passes.dispatch_once(qpu_pool.pk) is None  # the second job waits behind it
    Job.objects.filter(pk=first.pk).update(not_before=first.not_before - timedelta(minutes=5))
    assert passes.dispatch_once(qpu_pool.pk).pk == first.pk
    assert vruntime(session) == pytest.approx(1.0)  # refunded once, charged once


def test_backoff_of_one_session_does_not_hold_other_sessions(qpu_pool, fake_device, open_session, owner, member):
    fake_device.config = {"fail_submit": "transient", "fail_submit_times": 1}
    fake_device.save()
    a, b = open_session(qpu_pool, owner), open_session(qpu_pool, member)
    submit(a)
    passes.submit_claimed(passes.dispatch_once(qpu_pool.pk))  # a's job: transient, back-off
    submit(b)
    assert passes.dispatch_once(qpu_pool.pk).session_id == b.pk


def test_fifo_pool_keeps_a_sessions_order_across_a_transient_error(qpu_pool, fake_device, open_session, owner):
    qpu_pool.strategy = "fifo"
    qpu_pool.save()
    fake_device.config = {"fail_submit": "transient", "fail_submit_times": 1}
    fake_device.save()
    session = open_session(qpu_pool, owner)
    first, _second = submit(session, 2)
    passes.submit_claimed(passes.dispatch_once(qpu_pool.pk))
    assert passes.dispatch_once(qpu_pool.pk) is None
    Job.objects.filter(pk=first.pk).update(not_before=None)
    assert passes.dispatch_once(qpu_pool.pk).pk == first.pk
