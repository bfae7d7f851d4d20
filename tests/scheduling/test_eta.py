"""R-JOB-5: a pending job's expected start foresees what others will submit meanwhile and that
goes first (other shares and sibling sessions in usage_fair, other sessions in weighted_fair,
nothing in fifo), and usage_fair's order counts device time charged later as weighing more."""

import math
from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from apps.scheduling import eta, passes, selectors
from apps.scheduling.models import DeviceRuntime, FairShare, Job, JobStatus
from tests.scheduling.test_strategies import dispatch_and_finish, submit
from tests.scheduling.test_usage_fair import pending, set_usage

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def still_clock():
    """The figures are the model's from the moment the jobs were set up: the clock stands still
    (a loaded machine taking a second between the set-up and the reading moved them)."""
    with time_machine.travel(timezone.now(), tick=False):
        yield


@pytest.fixture
def busy(qpu_pool, fake_device, open_session, owner):
    """A usage_fair pool whose one-job device runs owner's first job (60 s, no spread) while its
    second waits; owner has used 600 s, so its key is 660 with the running job in flight."""
    qpu_pool.strategy = "usage_fair"
    qpu_pool.save()
    for band in (1, -1):
        DeviceRuntime.objects.create(device=fake_device, band=band, count=50, mean=60.0, var=0.0)
    set_usage(qpu_pool, owner, 600.0)
    session = open_session(qpu_pool, owner)
    first, waiting = submit(session, 2)
    passes.submit_claimed(passes.dispatch_once(qpu_pool.pk))
    return waiting


def queued_share(pool, user, usage):
    """``user``'s share at ``usage`` and runnable at the last dispatch: not raised to V1 (which
    owner's dispatch set to 600), so its key is its usage."""
    set_usage(pool, user, usage)
    FairShare.objects.filter(pool=pool, user=user).update(queued=True)


def history(pool, session, n):
    """``n`` jobs of ``session`` submitted one a minute over the last ``n`` minutes, all ended."""
    now = timezone.now()
    for i, job in enumerate(submit(session, n)):
        Job.objects.filter(pk=job.pk).update(
            status=JobStatus.COMPLETED, created_at=now - timedelta(minutes=i + 1, seconds=30)
        )


def eta_of(pool, job):
    eta.clear_cache()
    return selectors.queue_info(pending(pool))[job.pk]


def test_a_job_waits_for_what_users_with_less_usage_keep_submitting(busy, qpu_pool, open_session, member):
    assert eta_of(qpu_pool, busy).eta_seconds == pytest.approx(60.0, abs=0.5)
    queued_share(qpu_pool, member, 0.0)
    history(qpu_pool, open_session(qpu_pool, member), 30)  # 60 s a minute: 0.5 device s/s
    waiting = eta_of(qpu_pool, busy)
    # Mean wait W = 60 + 0.5 W = 120 s; member's part (60 s) comes a minute at a time, so its
    # median is lower than its mean, and the spread grows by what may arrive.
    assert waiting.eta_seconds == pytest.approx(60.0 + 60.0 / 5**0.5, abs=1.0)
    assert waiting.eta_error_seconds == pytest.approx(120.0, abs=1.0)


def test_what_another_user_may_submit_first_is_capped_by_its_room_below_the_job(busy, qpu_pool, open_session, member):
    queued_share(qpu_pool, member, 650.0)  # 10 s below owner's 660: only 10 s of it can go first
    history(qpu_pool, open_session(qpu_pool, member), 30)
    waiting = eta_of(qpu_pool, busy)
    assert waiting.eta_seconds == pytest.approx(70.0, abs=0.5)
    assert waiting.eta_error_seconds == pytest.approx(0.0, abs=0.5)  # the room is used up for sure


def test_a_users_own_submissions_do_not_delay_its_job(busy, qpu_pool, open_session, owner):
    history(qpu_pool, open_session(qpu_pool, owner), 30)
    assert eta_of(qpu_pool, busy).eta_seconds == pytest.approx(60.0, abs=0.5)


def test_nothing_submitted_later_goes_first_in_a_fifo_pool(busy, qpu_pool, open_session, member):
    qpu_pool.strategy = "fifo"
    qpu_pool.save()
    history(qpu_pool, open_session(qpu_pool, member), 30)
    assert eta_of(qpu_pool, busy).eta_seconds == pytest.approx(60.0, abs=0.5)


def test_device_time_charged_later_weighs_more_in_the_order(qpu_pool, fake_device, open_session, owner, member):
    qpu_pool.strategy = "usage_fair"
    qpu_pool.usage_half_life = 60
    qpu_pool.save()
    DeviceRuntime.objects.create(device=fake_device, band=1, count=50, mean=60.0, var=0.0)
    set_usage(qpu_pool, owner, 300.0)
    queued_share(qpu_pool, member, 0.0)
    submit(open_session(qpu_pool, member), 10)
    mine = submit(open_session(qpu_pool, owner))[0]
    # member's jobs start 0, 60, 120 s from now and count 60, 120, 240 s in today's units (the
    # usage of now halves every minute): 420 > 300 after three, so owner's job is fourth, not sixth.
    assert eta_of(qpu_pool, mine).position == 4


def test_what_others_may_submit_first_shrinks_as_todays_usage_is_forgotten(busy, qpu_pool, open_session, member):
    qpu_pool.usage_half_life = 60
    qpu_pool.save()
    queued_share(qpu_pool, member, 0.0)
    ahead = open_session(qpu_pool, member)
    submit(ahead, 2)
    history(qpu_pool, ahead, 30)
    # member's two jobs end at key 60 + 120 = 180; owner's job, at key 660, starts 120 s from now,
    # when device time counts 4 times today's: member may add (660 - 180) / 4 = 120 s before it.
    # W = 60 (running) + 120 (member's two) + min(0.5 W, 120) = 300.
    assert eta_of(qpu_pool, busy).eta_seconds == pytest.approx(300.0, abs=1.0)


def test_a_session_with_fewer_turns_may_submit_first_in_a_weighted_fair_pool(
    qpu_pool, fake_device, open_session, owner, member
):
    DeviceRuntime.objects.create(device=fake_device, band=1, count=50, mean=60.0, var=0.0)
    session = open_session(qpu_pool, owner)
    waiting = submit(session, 2)[1]
    passes.submit_claimed(passes.dispatch_once(qpu_pool.pk))  # owner's session at vruntime 1
    history(qpu_pool, open_session(qpu_pool, member), 20)  # at vruntime 0, 20 s a minute
    # member's session may add one job (60 s) before owner's: W = 60 + min(W / 3, 60) = 90 s,
    # of which member's 30 s has a median of 30 / sqrt(1 + 2.25 * 1800 / 900).
    assert eta_of(qpu_pool, waiting).eta_seconds == pytest.approx(60.0 + 30.0 / 5.5**0.5, abs=1.0)


@pytest.fixture
def weighted(qpu_pool, fake_device):
    DeviceRuntime.objects.create(device=fake_device, band=1, count=50, mean=60.0, var=0.0)
    return qpu_pool


def test_a_sessions_room_starts_after_its_pending_jobs_and_counts_its_slots(weighted, open_session, owner, member):
    waiting = submit(open_session(weighted, owner), 2)[1]
    passes.submit_claimed(passes.dispatch_once(weighted.pk))  # owner's session at vruntime 1
    other = open_session(weighted, member, slots=2)
    history(weighted, other, 30)  # 30 s a minute
    submit(other)  # tagged 0, ends at 0.5: one more job (2 slots x 0.5) fits before owner's
    # W = 60 (running) + 60 (member's pending job) + min(W / 2, 60) = 180.
    assert eta_of(weighted, waiting).eta_seconds == pytest.approx(180.0, abs=1.0)


def test_an_idle_session_may_add_only_from_the_pools_virtual_time(weighted, open_session, owner, member):
    session = open_session(weighted, owner)
    jobs = submit(session, 4)
    history(weighted, open_session(weighted, member), 40)  # member's session stays at vruntime 0
    for _ in range(2):
        dispatch_and_finish(weighted, runtime=60.0)
    passes.submit_claimed(passes.dispatch_once(weighted.pk))  # V = 2, owner's last job tagged 3
    # member's session is raised to V = 2 when it submits: one job (60 s) fits, W = 60 + 60.
    assert eta_of(weighted, jobs[3]).eta_seconds == pytest.approx(120.0, abs=1.0)


def test_another_session_of_the_same_user_may_submit_first_within_its_share(qpu_pool, fake_device, open_session, owner):
    qpu_pool.strategy = "usage_fair"
    qpu_pool.save()
    DeviceRuntime.objects.create(device=fake_device, band=1, count=50, mean=60.0, var=0.0)
    busy = open_session(qpu_pool, owner)
    jobs = submit(busy, 5)
    dispatch_and_finish(qpu_pool, runtime=60.0)  # busy's session tag, and the share's, at 60
    passes.submit_claimed(passes.dispatch_once(qpu_pool.pk))
    history(qpu_pool, open_session(qpu_pool, owner), 30)  # idle: it would start at the share's 60
    # busy's last job is tagged 60 + 120 within the share: the other session may add 120 s first.
    # W = 60 (running) + 120 (busy's two before) + min(W / 2, 120) = 300.
    assert eta_of(qpu_pool, jobs[4]).eta_seconds == pytest.approx(300.0, abs=1.0)


def test_a_session_that_ended_submits_nothing_more(weighted, open_session, owner, member):
    from apps.sessions import services as session_services

    waiting = submit(open_session(weighted, owner), 2)[1]
    passes.submit_claimed(passes.dispatch_once(weighted.pk))
    other = open_session(weighted, member)
    history(weighted, other, 30)
    session_services.release(user=member, session_id=other.pk)
    assert eta_of(weighted, waiting).eta_seconds == pytest.approx(60.0, abs=0.5)


def test_the_last_hours_submissions_are_read_again_once_a_minute_not_at_each_rebuild(
    busy, qpu_pool, open_session, owner, monkeypatch
):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def reads_of_recent_submissions():
        with CaptureQueriesContext(connection) as queries:
            selectors.queue_info(pending(qpu_pool))
        return sum('"created_at" >=' in q["sql"] for q in queries.captured_queries)

    session = busy.session
    assert reads_of_recent_submissions() == 1
    submit(session)  # the queue changed: its snapshot is rebuilt
    assert reads_of_recent_submissions() == 0
    monkeypatch.setattr(selectors, "ARRIVALS_MAX_AGE", 0.0)
    submit(session)
    assert reads_of_recent_submissions() == 1


@pytest.mark.filterwarnings("error::RuntimeWarning")  # no float overflow on the way
def test_a_backlog_of_many_half_lives_still_has_positions_and_etas(qpu_pool, fake_device, open_session, owner, member):
    qpu_pool.strategy = "usage_fair"
    qpu_pool.usage_half_life = 60
    qpu_pool.save()
    DeviceRuntime.objects.create(device=fake_device, band=1, count=50, mean=600.0, var=0.0)
    last = submit(open_session(qpu_pool, owner), 150)[-1]  # 25 hours of device time: 1 500 half-lives
    submit(open_session(qpu_pool, member), 2)
    waiting = eta_of(qpu_pool, last)
    assert waiting.position == 152 and math.isfinite(waiting.eta_seconds) and waiting.eta_seconds > 0
