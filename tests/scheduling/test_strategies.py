"""R-SCHED-1/2/3: strategy order, catch-up, FIFO within a session, no pre-emption."""

import pytest

from apps.scheduling import passes, services
from apps.scheduling.models import Device, Job, JobStatus
from apps.sessions.models import Session
from tests.scheduling.conftest import complete

pytestmark = pytest.mark.django_db


def submit(session, n=1, shots=10):
    return [
        services.submit_job(user=session.user, session_id=session.pk, payload={"n": i}, shots=shots) for i in range(n)
    ]


def dispatch_and_finish(pool, runtime=1.0):
    """One dispatch on a one-job device, then completion: returns the dispatched job."""
    job = passes.dispatch_once(pool.pk)
    if job is None:
        return None
    passes.submit_claimed(job)
    complete(job, runtime)
    return job


def test_fifo_dispatches_in_submission_order_across_the_pool(qpu_pool, fake_device, open_session, owner, member):
    qpu_pool.strategy = "fifo"
    qpu_pool.save()
    a, b = open_session(qpu_pool, owner, slots=5), open_session(qpu_pool, member, slots=1)
    order = [submit(s)[0].pk for s in (a, b, a, b, b, a)]
    dispatched = [dispatch_and_finish(qpu_pool).pk for _ in order]
    assert dispatched == order


def test_weighted_fair_gives_five_turns_to_a_five_slot_session_per_turn_of_one_slot(
    qpu_pool, fake_device, open_session, owner, member
):
    heavy, light = open_session(qpu_pool, owner, slots=5), open_session(qpu_pool, member, slots=1)
    submit(heavy, 110)
    submit(light, 30)
    turns = {heavy.pk: 0, light.pk: 0}
    worst = 0.0
    for _ in range(120):  # 20 rounds of 5 + 1: the bound holds on every prefix, not just at the end
        job = dispatch_and_finish(qpu_pool)
        turns[job.session_id] += 1
        worst = max(worst, abs(turns[heavy.pk] / 5 - turns[light.pk]))  # every prefix
    assert abs(turns[heavy.pk] - 100) <= 1 and abs(turns[light.pk] - 20) <= 1
    assert worst <= 1 / 5 + 1


def test_fifo_within_a_session(qpu_pool, fake_device, open_session, owner):
    session = open_session(qpu_pool, owner)
    jobs = [j.pk for j in submit(session, 5)]
    assert [dispatch_and_finish(qpu_pool).pk for _ in jobs] == jobs


def test_usage_fair_charges_measured_device_time(qpu_pool, fake_device, open_session, owner, member):
    qpu_pool.strategy = "usage_fair"
    qpu_pool.save()
    slow, quick = open_session(qpu_pool, owner), open_session(qpu_pool, member)
    submit(slow, 40)
    submit(quick, 200)
    turns = {slow.pk: 0, quick.pk: 0}
    for _ in range(110):
        job = passes.dispatch_once(qpu_pool.pk)
        passes.submit_claimed(job)
        complete(job, runtime=10.0 if job.session_id == slow.pk else 1.0)
        turns[job.session_id] += 1
    # Equal slots, 10x the device time per job: about ten quick jobs per slow one.
    assert turns[quick.pk] / turns[slow.pk] == pytest.approx(10, rel=0.15)
    slow.refresh_from_db()
    assert slow.vruntime == pytest.approx(10.0 * turns[slow.pk])


def test_usage_fair_charges_nothing_at_dispatch(qpu_pool, fake_device, open_session, owner):
    qpu_pool.strategy = "usage_fair"
    qpu_pool.save()
    session = open_session(qpu_pool, owner)
    submit(session)
    passes.dispatch_once(qpu_pool.pk)
    session.refresh_from_db()
    assert session.vruntime == 0


def test_new_session_catches_up_and_takes_no_burst(qpu_pool, fake_device, open_session, owner, member):
    old = open_session(qpu_pool, owner, external_id="old")
    submit(old, 100)
    for _ in range(50):
        dispatch_and_finish(qpu_pool)
    old.refresh_from_db()
    newcomer = open_session(qpu_pool, member, external_id="new")
    submit(newcomer, 50)
    newcomer.refresh_from_db()
    # R-SCHED-2: raised to the pool's virtual time (the vruntime old was served at last).
    assert newcomer.vruntime == pytest.approx(old.vruntime - 1) == pytest.approx(49)
    first_ten = [dispatch_and_finish(qpu_pool).session_id for _ in range(10)]
    assert first_ten.count(newcomer.pk) <= 6  # its share (5 of 10) + 1


def test_returning_session_does_not_cash_in_idle_time(qpu_pool, fake_device, open_session, owner, member):
    a, b = open_session(qpu_pool, owner), open_session(qpu_pool, member)
    submit(a, 1)
    dispatch_and_finish(qpu_pool)  # a ran once, then went quiet
    submit(b, 60)
    for _ in range(40):
        dispatch_and_finish(qpu_pool)
    submit(a, 20)  # a returns with a low vruntime: catch-up raises it to the pool's V
    a.refresh_from_db(), b.refresh_from_db()
    assert a.vruntime == pytest.approx(b.vruntime - 1)  # b was last served at 39
    nxt = [dispatch_and_finish(qpu_pool).session_id for _ in range(10)]
    assert nxt.count(a.pk) <= 6


def test_running_job_is_never_preempted(qpu_pool, fake_device, open_session, owner, member):
    low = open_session(qpu_pool, owner, slots=1)
    submit(low, 1)
    running = passes.dispatch_once(qpu_pool.pk)
    passes.submit_claimed(running)
    Session.objects.filter(pk=low.pk).update(vruntime=1e9)
    high = open_session(qpu_pool, member, slots=50)
    submit(high, 3)
    assert passes.dispatch_once(qpu_pool.pk) is None  # the only device is busy
    running.refresh_from_db()
    assert running.status == JobStatus.RUNNING and running.device_id == fake_device.pk


def test_device_capacity_and_offline_devices(qpu_pool, fake_device, open_session, owner):
    Device.objects.filter(pk=fake_device.pk).update(max_concurrent_jobs=2)
    offline = Device.objects.create(pool=qpu_pool, name="off", driver="fake", online=False)
    session = open_session(qpu_pool, owner)
    submit(session, 5)
    claimed = [passes.dispatch_once(qpu_pool.pk) for _ in range(3)]
    assert claimed[2] is None
    assert {j.device_id for j in claimed[:2]} == {fake_device.pk}
    assert not Job.objects.filter(device=offline).exists()
