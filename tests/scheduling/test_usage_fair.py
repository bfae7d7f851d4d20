"""R-SCHED-6 (usage_fair: decayed device time across users or groups, then SFQ across each one's
sessions) and R-JOB-4/5 (pending codes, ETA from measured device times)."""

import pytest
from django.contrib.auth.models import Group
from django.core.management import call_command

from apps.scheduling import passes, runtimes, selectors, shares
from apps.scheduling.models import DeviceRuntime, FairShare, Job, JobStatus, PoolQueue
from apps.sessions.models import Session
from tests.scheduling.conftest import complete
from tests.scheduling.test_strategies import dispatch_and_finish, submit

pytestmark = pytest.mark.django_db

HOUR = 3600.0


@pytest.fixture
def usage_pool(qpu_pool):
    qpu_pool.strategy = "usage_fair"
    qpu_pool.usage_half_life = 3600
    qpu_pool.save()
    return qpu_pool


def share_of(pool, user=None, group=None) -> FairShare:
    return FairShare.objects.get(pool=pool, user=user, group=group)


def set_usage(pool, user, usage, ago=0.0, weight=1.0):
    import time

    FairShare.objects.update_or_create(
        pool=pool, user=user, defaults={"usage": usage, "usage_at": time.time() - ago, "weight": weight}
    )


def next_user(pool):
    job = passes.dispatch_once(pool.pk)
    passes.submit_claimed(job)
    return job


def test_the_user_with_the_least_decayed_device_time_goes_first(usage_pool, fake_device, open_session, owner, member):
    set_usage(usage_pool, owner, 100.0)
    set_usage(usage_pool, member, 30.0)
    submit(open_session(usage_pool, owner))
    submit(open_session(usage_pool, member))
    assert next_user(usage_pool).user_id == member.pk


def test_usage_halves_every_half_life(usage_pool, fake_device, open_session, owner, member):
    set_usage(usage_pool, owner, 100.0, ago=2 * HOUR)  # 25 now
    set_usage(usage_pool, member, 30.0)
    submit(open_session(usage_pool, owner))
    submit(open_session(usage_pool, member))
    assert next_user(usage_pool).user_id == owner.pk
    view = {v.share.user_id: v for v in shares.overview(usage_pool, __import__("time").time())}
    assert view[owner.pk].usage == pytest.approx(25.0, rel=1e-3)


def test_weights_scale_a_users_share(usage_pool, fake_device, open_session, owner, member):
    set_usage(usage_pool, owner, 100.0, weight=4.0)  # 25 per unit of weight
    set_usage(usage_pool, member, 30.0)
    submit(open_session(usage_pool, owner))
    submit(open_session(usage_pool, member))
    assert next_user(usage_pool).user_id == owner.pk


def test_a_weight_two_user_gets_twice_the_device_time(usage_pool, fake_device, open_session, owner, member):
    set_usage(usage_pool, owner, 0.0, weight=2.0)
    submit(open_session(usage_pool, owner), 120)
    submit(open_session(usage_pool, member), 120)
    served = {owner.pk: 0.0, member.pk: 0.0}
    for _ in range(90):
        job = dispatch_and_finish(usage_pool, runtime=3.0)
        served[job.user_id] += 3.0
    assert served[owner.pk] / served[member.pk] == pytest.approx(2.0, rel=0.05)


def test_completion_charges_the_share_its_measured_device_time(usage_pool, fake_device, open_session, owner):
    submit(open_session(usage_pool, owner))
    dispatch_and_finish(usage_pool, runtime=7.5)
    assert share_of(usage_pool, owner).usage == pytest.approx(7.5)


def test_a_job_is_charged_to_its_share_once(usage_pool, fake_device, open_session, owner):
    submit(open_session(usage_pool, owner))
    job = next_user(usage_pool)
    complete(job, 5.0)
    from apps.scheduling.drivers import DriverState

    job.refresh_from_db()
    assert not passes._finish(job, DriverState("completed", runtime_seconds=5.0), expect_remote_id=job.remote_id)
    assert share_of(usage_pool, owner).usage == pytest.approx(5.0)


def test_group_shares_pool_the_device_time_of_their_members(
    usage_pool, fake_device, open_session, owner, member, outsider
):
    usage_pool.share_by = "group"
    usage_pool.save()
    lab = Group.objects.create(name="lab")
    lab.user_set.add(owner, member)
    usage_pool.groups.add(lab)
    submit(open_session(usage_pool, owner))
    dispatch_and_finish(usage_pool, runtime=10.0)
    assert share_of(usage_pool, group=lab).usage == pytest.approx(10.0)
    # member has used nothing, but their group has: the outsider (own share, 0) goes first.
    submit(open_session(usage_pool, member))
    submit(open_session(usage_pool, outsider))
    assert next_user(usage_pool).user_id == outsider.pk


def test_a_newcomer_starts_at_the_pools_virtual_time_and_takes_no_burst(
    usage_pool, fake_device, open_session, owner, member, outsider
):
    submit(open_session(usage_pool, owner), 60)
    submit(open_session(usage_pool, member), 60)
    for _ in range(40):
        dispatch_and_finish(usage_pool, runtime=2.0)
    newcomer = submit(open_session(usage_pool, outsider), 30)
    info = selectors.queue_info(pending(usage_pool))
    assert info[newcomer[2].pk].position >= 7  # the queue shows it interleaved, not ahead of all
    first_round = [dispatch_and_finish(usage_pool, runtime=2.0).user_id for _ in range(9)]
    # Three equal shares: 3 turns of 9 each; a newcomer at usage 0 would have taken all nine.
    assert first_round.count(outsider.pk) <= 3 + 1
    assert share_of(usage_pool, outsider).catch_up > 0 and share_of(usage_pool, outsider).usage == pytest.approx(
        6.0, rel=1e-3
    )


def test_a_user_back_after_a_long_pause_keeps_only_the_decayed_part_of_its_usage(
    usage_pool, fake_device, open_session, owner, member
):
    set_usage(usage_pool, owner, 1000.0, ago=10 * HOUR)  # about 1 s left
    submit(open_session(usage_pool, member), 40)
    for _ in range(20):
        dispatch_and_finish(usage_pool, runtime=5.0)
    submit(open_session(usage_pool, owner), 20)
    turns = [dispatch_and_finish(usage_pool, runtime=5.0).user_id for _ in range(10)]
    assert 4 <= turns.count(owner.pk) <= 6  # its share from now on, no burst and no penalty


def test_sessions_of_one_user_share_its_turns_by_slots(usage_pool, fake_device, open_session, owner, member):
    big, small = open_session(usage_pool, owner, slots=3), open_session(usage_pool, owner, slots=1)
    submit(big, 60)
    submit(small, 60)
    submit(open_session(usage_pool, member), 80)
    turns = {big.pk: 0, small.pk: 0, "member": 0}
    worst = 0.0
    for _ in range(80):
        job = dispatch_and_finish(usage_pool, runtime=1.0)
        turns["member" if job.user_id == member.pk else job.session_id] += 1
        worst = max(worst, abs(turns[big.pk] / 3 - turns[small.pk]))
    assert abs((turns[big.pk] + turns[small.pk]) - turns["member"]) <= 2  # level 1: equal users
    assert worst <= 1 / 3 + 1 + 1e-9  # level 2: SFQ's bound (one job of each) on every prefix


def test_a_session_of_a_user_returning_to_the_queue_catches_up_with_its_siblings(
    usage_pool, fake_device, open_session, owner
):
    steady, later = open_session(usage_pool, owner), open_session(usage_pool, owner)
    submit(steady, 40)
    for _ in range(20):
        dispatch_and_finish(usage_pool)
    submit(later, 20)
    turns = [dispatch_and_finish(usage_pool).session_id for _ in range(10)]
    assert turns.count(later.pk) <= 6  # its half + 1, not ten in a row
    assert Session.objects.get(pk=later.pk).vruntime >= 19


def test_usage_is_recomputed_from_the_job_history(usage_pool, fake_device, open_session, owner, member):
    submit(open_session(usage_pool, owner), 2)
    dispatch_and_finish(usage_pool, runtime=4.0)
    dispatch_and_finish(usage_pool, runtime=6.0)
    FairShare.objects.filter(pool=usage_pool).update(usage=999.0)
    call_command("recompute_usage", usage_pool.name, verbosity=0)
    assert share_of(usage_pool, owner).usage == pytest.approx(10.0, rel=1e-3)


def test_fifo_and_weighted_fair_pools_keep_no_shares(qpu_pool, fake_device, open_session, owner):
    submit(open_session(qpu_pool, owner))
    dispatch_and_finish(qpu_pool, runtime=3.0)
    assert not FairShare.objects.exists()
    assert PoolQueue.objects.get(pool=qpu_pool).share_vtime == 0


# -- R-JOB-4/5: codes and ETA --------------------------------------------------------------------
def pending(pool):
    return list(Job.objects.select_related("pool").filter(pool=pool, status=JobStatus.PENDING))


def test_jobs_of_a_share_that_used_more_wait_as_share_exhausted(usage_pool, fake_device, open_session, owner, member):
    set_usage(usage_pool, owner, 500.0)
    mine = submit(open_session(usage_pool, owner))[0]
    theirs = submit(open_session(usage_pool, member))[0]
    info = selectors.queue_info(pending(usage_pool))
    assert info[mine.pk].code == "share_exhausted" and info[mine.pk].position == 2
    assert info[theirs.pk].code == "waiting_turn" and info[theirs.pk].position == 1


def test_a_job_in_back_off_waits_as_backoff(qpu_pool, open_session, owner):
    from apps.scheduling.models import Device

    Device.objects.create(pool=qpu_pool, name="flaky", driver="fake", config={"fail_submit": "transient"})
    (job,) = submit(open_session(qpu_pool, owner))
    passes.run_pool(qpu_pool.pk)
    assert selectors.queue_info(pending(qpu_pool))[job.pk].code == "backoff"


def test_a_paused_pool_and_paused_devices_have_their_own_codes(qpu_pool, fake_device, open_session, owner):
    (job,) = submit(open_session(qpu_pool, owner))
    fake_device.paused_reason = "calibration"
    fake_device.save()
    assert selectors.queue_info(pending(qpu_pool))[job.pk].code == "device_paused"
    qpu_pool.paused_reason = "maintenance"
    qpu_pool.save()
    info = selectors.queue_info(pending(qpu_pool))[job.pk]
    assert info.code == "pool_paused" and info.eta_seconds is None


def test_a_job_expected_after_its_session_ends_says_so(qpu_pool, fake_device, open_session, owner):
    from datetime import timedelta

    from django.utils import timezone

    session = open_session(qpu_pool, owner)
    jobs = submit(session, 3)
    Session.objects.filter(pk=session.pk).update(expires_at=timezone.now() + timedelta(seconds=90))
    info = selectors.queue_info(pending(qpu_pool))  # 60 s each by default: the third starts at 120 s
    assert [info[j.pk].code for j in jobs] == ["waiting_turn", "waiting_turn", "session_expiring"]


def test_eta_adds_up_the_measured_device_time_of_the_jobs_before(qpu_pool, fake_device, open_session, owner):
    DeviceRuntime.objects.create(device=fake_device, band=1, count=50, mean=20.0, var=4.0)
    jobs = submit(open_session(qpu_pool, owner), 4, shots=10)  # band 1: 10–99 shots
    info = selectors.queue_info(pending(qpu_pool))
    assert [round(info[j.pk].eta_seconds) for j in jobs] == [0, 20, 40, 60]
    assert info[jobs[3].pk].eta_error_seconds == pytest.approx((3 * 4.0) ** 0.5)


def test_eta_counts_the_running_jobs_remaining_time_and_the_capacity(qpu_pool, fake_device, open_session, owner):
    fake_device.max_concurrent_jobs = 2
    fake_device.save()
    DeviceRuntime.objects.create(device=fake_device, band=0, count=50, mean=30.0, var=0.0)
    session = open_session(qpu_pool, owner)
    submit(session, 2, shots=5)
    for _ in range(2):
        passes.submit_claimed(passes.dispatch_once(qpu_pool.pk))
    jobs = submit(session, 3, shots=5)
    info = selectors.queue_info(pending(qpu_pool))
    # Two running with about 30 s left each, capacity 2: (60 + 30·k) / 2.
    assert [info[j.pk].eta_seconds for j in jobs] == pytest.approx([30, 45, 60], abs=1.0)
    assert info[jobs[0].pk].code == "device_busy"


def test_measured_device_times_are_kept_per_shots_band(usage_pool, fake_device, open_session, owner):
    session = open_session(usage_pool, owner)
    submit(session, 3, shots=5)
    submit(session, 3, shots=500)
    for runtime in (1.0, 2.0, 3.0, 100.0, 110.0, 120.0):
        dispatch_and_finish(usage_pool, runtime=runtime)
    table = runtimes.Table([fake_device.pk])
    assert table.on_device(fake_device.pk, 7).mean == pytest.approx(2.0)
    assert table.on_device(fake_device.pk, 300).mean == pytest.approx(110.0)
    assert table.on_device(fake_device.pk, 50_000).mean == pytest.approx(56.0)  # no such band yet: all of them


def test_a_waiting_session_is_told_when_its_next_job_starts(qpu_pool, fake_device, open_session, owner, member):
    DeviceRuntime.objects.create(device=fake_device, band=1, count=50, mean=10.0, var=1.0)
    first, second = open_session(qpu_pool, owner), open_session(qpu_pool, member)
    submit(first, 2)
    submit(second, 1)
    sessions = list(Session.objects.select_related("pool").filter(pk__in=[first.pk, second.pk]))
    waits = selectors.session_waits(sessions)
    assert waits[first.pk][1].eta_seconds == pytest.approx(0.0, abs=0.5)
    assert waits[second.pk][1].eta_seconds == pytest.approx(10.0, abs=0.5)


def test_a_running_job_counts_at_its_expected_device_time_until_it_ends(
    usage_pool, fake_device, open_session, owner, member
):
    fake_device.max_concurrent_jobs = 2
    fake_device.save()
    DeviceRuntime.objects.create(device=fake_device, band=1, count=50, mean=60.0, var=0.0)
    DeviceRuntime.objects.create(device=fake_device, band=-1, count=50, mean=60.0, var=0.0)
    set_usage(usage_pool, member, 30.0)
    submit(open_session(usage_pool, owner), 2)
    submit(open_session(usage_pool, member), 2)
    # owner (0 s used) first; then owner's running job counts 60 s: member (30 s) takes the other slot.
    assert [next_user(usage_pool).user_id for _ in range(2)] == [owner.pk, member.pk]


def test_sessions_at_the_shares_virtual_time_keep_their_age_order(usage_pool, fake_device, open_session, owner):
    fake_device.max_concurrent_jobs = 2
    fake_device.save()
    steady = open_session(usage_pool, owner)
    submit(steady, 30)
    for _ in range(10):
        dispatch_and_finish(usage_pool)
    running = next_user(usage_pool)  # steady's job runs: steady sits at the share's virtual time
    later = open_session(usage_pool, owner)
    submit(later, 5)
    # Raised to that virtual time, the newcomer ties with steady, and the older session wins the tie.
    assert next_user(usage_pool).session_id == steady.pk
    assert running.session_id == steady.pk


def test_catch_up_is_given_on_arrival_only_not_when_a_job_ran_shorter_than_expected(
    usage_pool, fake_device, open_session, owner, member
):
    fake_device.max_concurrent_jobs = 2
    fake_device.save()
    DeviceRuntime.objects.create(device=fake_device, band=-1, count=50, mean=60.0, var=0.0)
    submit(open_session(usage_pool, owner), 30)
    submit(open_session(usage_pool, member), 30)
    for _ in range(2):
        next_user(usage_pool)
    for _ in range(20):  # both backlogged all along; each job runs 1 s, expected 60 s
        job = Job.objects.filter(pool=usage_pool, status=JobStatus.RUNNING).order_by("id").first()
        complete(job, 1.0)
        next_user(usage_pool)
    for user in (owner, member):
        assert share_of(usage_pool, user).catch_up == 0  # their arrival at V1 = 0 added nothing
    assert sum(FairShare.objects.values_list("usage", flat=True)) == pytest.approx(20.0, rel=1e-3)


def test_a_user_whose_queue_drained_catches_up_when_it_returns(usage_pool, fake_device, open_session, owner, member):
    mine = open_session(usage_pool, owner)
    submit(mine, 10)
    submit(open_session(usage_pool, member), 80)
    for _ in range(20):  # ten each; then owner has nothing pending
        dispatch_and_finish(usage_pool, runtime=2.0)
    for _ in range(30):  # member alone: its usage grows while owner waits for nothing
        dispatch_and_finish(usage_pool, runtime=2.0)
    submit(mine, 20)
    turns = [dispatch_and_finish(usage_pool, runtime=2.0).user_id for _ in range(10)]
    assert turns.count(owner.pk) <= 6  # its half + 1, not the 30 turns it sat out


def test_the_catch_up_decays_as_the_device_time_does(usage_pool, fake_device, open_session, owner):
    import time

    FairShare.objects.create(pool=usage_pool, user=owner, catch_up=100.0, usage_at=time.time() - 2 * HOUR, queued=True)
    submit(open_session(usage_pool, owner))
    dispatch_and_finish(usage_pool, runtime=5.0)
    share = share_of(usage_pool, owner)
    assert share.usage == pytest.approx(5.0) and share.catch_up == pytest.approx(25.0, rel=1e-3)


def test_a_running_job_past_its_mean_device_time_is_still_expected_to_need_more():
    expected = runtimes.Estimate(60.0, 36.0)  # log-normal device times: skewed, long tail
    # Its mean residual life (checked against a 400 000-draw simulation: 37.4, 33.6, 36.8 s).
    assert [round(expected.remaining(t).mean, 1) for t in (30, 60, 120)] == [37.3, 33.5, 36.6]
    assert runtimes.Estimate(60.0, 0.0).remaining(45).mean == 15.0  # no spread: the rest of the mean


def test_a_share_runnable_all_along_keeps_a_key_below_the_levels_virtual_time(
    usage_pool, fake_device, open_session, owner, member
):
    import time

    # Both had work at the last dispatch (queued); member's key fell below V1 since (a job ran
    # shorter than expected). Only an arrival is raised to V1: member keeps its lead.
    PoolQueue.objects.update_or_create(pool=usage_pool, defaults={"share_vtime": 80.0, "share_vtime_at": time.time()})
    FairShare.objects.create(pool=usage_pool, user=owner, usage=60.0, usage_at=time.time(), queued=True)
    FairShare.objects.create(pool=usage_pool, user=member, usage=50.0, usage_at=time.time(), queued=True)
    submit(open_session(usage_pool, owner))
    submit(open_session(usage_pool, member))
    assert next_user(usage_pool).user_id == member.pk


@pytest.mark.parametrize("half_life", [2_000_000_000, 2_147_483_647])
def test_usage_is_recomputed_with_a_half_life_of_decades(usage_pool, fake_device, open_session, owner, half_life):
    """A half-life of decades (an operator's "hardly decay", the field takes up to 2^31 − 1 s):
    the recompute's horizon, 64 half-lives back, fell before year 1 and raised (the command and
    the pool list's action failed)."""
    submit(open_session(usage_pool, owner), 1)
    dispatch_and_finish(usage_pool, runtime=4.0)
    usage_pool.usage_half_life = half_life
    usage_pool.save()
    FairShare.objects.filter(pool=usage_pool).update(usage=999.0)
    call_command("recompute_usage", usage_pool.name, verbosity=0)
    assert share_of(usage_pool, owner).usage == pytest.approx(4.0, rel=1e-3)
