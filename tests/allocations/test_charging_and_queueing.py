"""R-ALLOC-1: jobs are charged their device time once; at the limit a project's jobs wait with
``allocation_exhausted`` (a running job overdraws by at most itself) while other projects'
run; a raised grant or a new period releases them."""

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.allocations import services as charges
from apps.allocations.models import Allocation, Charge
from apps.notifications.models import Delivery, Event, Subscription
from apps.scheduling import passes, services
from apps.scheduling.models import Job, JobStatus
from tests.allocations.conftest import DEVICE_TIME

pytestmark = pytest.mark.django_db


def run(pool, times=20):
    for _ in range(times):
        Job.objects.filter(status=JobStatus.RUNNING).update(next_poll_at=None)
        passes.run_pool(pool.pk)


def submit(session, n):
    return [services.submit_job(user=session.user, session_id=session.pk, payload={"i": i}, shots=1) for i in range(n)]


def test_project_overdraws_by_one_job_then_waits_while_the_other_project_runs(
    qpu, owner, member, team, grant, open_session, api
):
    mine = grant(qpu, user=owner, device_seconds=60)  # 60 s left; each job needs 120 s
    theirs = grant(qpu, group=team, device_seconds=10_000)
    my_session, their_session = open_session(qpu, owner), open_session(qpu, member)
    assert (my_session.allocation_id, their_session.allocation_id) == (mine.pk, theirs.pk)
    my_jobs = submit(my_session, 3)
    their_jobs = submit(their_session, 3)

    run(qpu)

    statuses = dict(Job.objects.values_list("pk", "status"))
    assert statuses[my_jobs[0].pk] == JobStatus.COMPLETED  # it ran with 60 s left: overdraw ≤ one job
    assert [statuses[j.pk] for j in my_jobs[1:]] == [JobStatus.PENDING, JobStatus.PENDING]
    assert all(statuses[j.pk] == JobStatus.COMPLETED for j in their_jobs)
    mine.refresh_from_db()
    assert mine.used_device_seconds == DEVICE_TIME
    assert mine.remaining_at(timezone.now())[0] == 60 - DEVICE_TIME
    answer = api(owner).get(f"/api/v1/jobs/{my_jobs[1].pk}/")
    assert answer.status_code == 200
    assert answer.data["pending_code"] == "allocation_exhausted"


def test_raising_the_grant_releases_the_waiting_jobs_within_one_dispatch(qpu, owner, grant, open_session):
    mine = grant(qpu, user=owner, device_seconds=60)
    jobs = submit(open_session(qpu, owner), 2)
    run(qpu)
    assert Job.objects.get(pk=jobs[1].pk).status == JobStatus.PENDING

    Allocation.objects.filter(pk=mine.pk).update(device_seconds=1000)
    passes.run_pool(qpu.pk)  # one pass: dispatched

    assert Job.objects.get(pk=jobs[1].pk).status == JobStatus.RUNNING


def test_a_new_period_releases_the_waiting_jobs(qpu, owner, grant, open_session):
    start = timezone.now() - timedelta(days=1, minutes=1)
    mine = grant(qpu, user=owner, device_seconds=60, period="rolling", window_days=1, starts_at=start, ends_at=None)
    session = open_session(qpu, owner)
    # Spent in the previous window: this window starts afresh.
    Allocation.objects.filter(pk=mine.pk).update(used_device_seconds=500, used_period_start=start)
    job = submit(session, 1)[0]

    passes.run_pool(qpu.pk)

    assert Job.objects.get(pk=job.pk).status != JobStatus.PENDING


def test_charges_sum_to_the_device_times_and_each_job_is_charged_once(qpu, owner, grant, open_session):
    mine = grant(qpu, user=owner, device_seconds=100_000)
    submit(open_session(qpu, owner), 4)
    run(qpu)
    jobs = list(Job.objects.filter(status=JobStatus.COMPLETED))
    assert len(jobs) == 4

    for job in jobs:  # a second record of the same end (a retried pass) adds nothing
        assert charges.charge_job(job=job, seconds=job.runtime_seconds, now=timezone.now()) is False

    assert Charge.objects.count() == 4
    assert sum(Charge.objects.values_list("device_seconds", flat=True)) == sum(j.runtime_seconds for j in jobs)
    mine.refresh_from_db()
    assert mine.used_device_seconds == 4 * DEVICE_TIME


def test_a_pool_without_allocations_is_unlimited_and_still_charged_to_the_ledger(qpu, owner, open_session):
    session = open_session(qpu, owner)
    assert session.allocation_id is None
    submit(session, 3)
    run(qpu)
    assert Job.objects.filter(status=JobStatus.COMPLETED).count() == 3
    assert list(Charge.objects.values_list("allocation_id", flat=True)) == [None, None, None]


def test_thresholds_are_told_once_each_at_80_and_100_percent_with_the_charge(qpu, owner, grant, open_session):
    """R-ALLOC-1 and R-NOTE-1: the charge that crosses 80 % (and the one that crosses 100 %)
    enqueues its project's notification in its own transaction, once per period."""
    owner.email = "owner@example.org"
    owner.save(update_fields=["email"])
    for event in (Event.ALLOCATION_80, Event.ALLOCATION_100):
        Subscription.objects.create(user=owner, event=event, channel="email")
    grant(qpu, user=owner, device_seconds=2.5 * DEVICE_TIME)  # 40 %, 80 %, 120 %
    submit(open_session(qpu, owner), 3)
    run(qpu)
    told = sorted(Delivery.objects.values_list("event", "subject"))
    assert [event for event, _ in told] == [Event.ALLOCATION_100, Event.ALLOCATION_80]
    assert all(subject.endswith(":device_seconds") for _, subject in told)
    submit(open_session(qpu, owner), 1)  # beyond 100 %: nothing more to tell this period
    run(qpu)
    assert Delivery.objects.count() == 2


def test_session_answer_names_its_allocation_and_what_is_left(qpu, owner, grant, api):
    mine = grant(qpu, name="lattice", user=owner, device_seconds=300)
    answer = api(owner).post("/api/v1/sessions/", {"resource_class": qpu.classes.get().pk}, format="json")
    assert answer.status_code == 201, answer.content
    assert answer.data["allocation"] == mine.pk
    assert answer.data["allocation_remaining"]["device_seconds"] == 300
    assert answer.data["allocation_remaining"]["name"] == "lattice"


def test_a_session_may_name_only_its_own_allocation(qpu, owner, member, grant, api):
    others = grant(qpu, user=member, device_seconds=300)
    answer = api(owner).post(
        "/api/v1/sessions/", {"resource_class": qpu.classes.get().pk, "allocation": others.pk}, format="json"
    )
    assert answer.status_code == 404


def test_submission_answer_carries_what_is_left(qpu, owner, grant, open_session, api):
    grant(qpu, user=owner, device_seconds=300)
    session = open_session(qpu, owner)
    answer = api(owner).post(f"/api/v1/sessions/{session.pk}/jobs/", {"payload": {}, "shots": 1}, format="json")
    assert answer.status_code == 201, answer.content
    assert answer.data["allocation_remaining"]["device_seconds"] == 300


def test_submission_answer_without_an_allocation_says_null(qpu, owner, open_session, api):
    session = open_session(qpu, owner)
    answer = api(owner).post(f"/api/v1/sessions/{session.pk}/jobs/", {"payload": {}, "shots": 1}, format="json")
    assert answer.status_code == 201, answer.content
    assert answer.data["allocation_remaining"] is None


def test_a_project_with_exactly_nothing_left_waits(qpu, owner, grant, open_session, api):
    """A grant of one job's device time: the first job spends it all, the second waits."""
    grant(qpu, user=owner, device_seconds=DEVICE_TIME)
    first, second = submit(open_session(qpu, owner), 2)
    run(qpu)
    assert Job.objects.get(pk=first.pk).status == JobStatus.COMPLETED
    assert Job.objects.get(pk=second.pk).status == JobStatus.PENDING
    assert api(owner).get(f"/api/v1/jobs/{second.pk}/").data["pending_code"] == "allocation_exhausted"


def test_a_grant_that_has_ended_leaves_its_projects_jobs_waiting(qpu, owner, grant, open_session, api):
    """Outside a fixed grant's dates nothing is left, however little it spent."""
    start = timezone.now() - timedelta(days=30)
    grant(qpu, user=owner, device_seconds=100_000, starts_at=start, ends_at=start + timedelta(days=29))
    job = submit(open_session(qpu, owner), 1)[0]
    passes.run_pool(qpu.pk)
    assert Job.objects.get(pk=job.pk).status == JobStatus.PENDING
    assert api(owner).get(f"/api/v1/jobs/{job.pk}/").data["pending_code"] == "allocation_exhausted"


def test_a_new_session_spends_the_users_grant_in_its_period_not_an_older_one_that_ended(qpu, owner, grant, api):
    ended = timezone.now() - timedelta(days=30)
    grant(qpu, name="last year", user=owner, device_seconds=300, starts_at=ended, ends_at=ended + timedelta(days=1))
    current = grant(qpu, name="this year", user=owner, device_seconds=300)
    answer = api(owner).post("/api/v1/sessions/", {"resource_class": qpu.classes.get().pk}, format="json")
    assert answer.status_code == 201, answer.content
    assert answer.data["allocation"] == current.pk


def test_a_new_session_spends_the_users_own_grant_before_their_groups(qpu, owner, grant, api):
    from django.contrib.auth.models import Group

    lab = Group.objects.create(name="lab")
    lab.user_set.add(owner)
    grant(qpu, name="lab's", group=lab, device_seconds=300)
    own = grant(qpu, name="own", user=owner, device_seconds=300)
    answer = api(owner).post("/api/v1/sessions/", {"resource_class": qpu.classes.get().pk}, format="json")
    assert answer.status_code == 201, answer.content
    assert answer.data["allocation"] == own.pk


def test_a_job_charged_late_for_the_previous_period_keeps_the_new_periods_spending(qpu, owner, grant, open_session):
    """Two workers record two jobs' ends across a daily window's boundary, the earlier commit
    last: the late charge goes to the ledger, in its own period, and the new window's spending is
    what was charged in it."""
    start = timezone.now() - timedelta(days=1, hours=1)
    mine = grant(qpu, user=owner, device_seconds=1000, period="rolling", window_days=1, starts_at=start, ends_at=None)
    before, after = submit(open_session(qpu, owner), 2)
    now = timezone.now()
    assert charges.charge_job(job=after, seconds=30, now=now)
    assert charges.charge_job(job=before, seconds=50, now=start + timedelta(hours=23))
    mine.refresh_from_db()
    assert (mine.used_device_seconds, mine.used_period_start) == (30, start + timedelta(days=1))
    assert mine.remaining_at(now)[0] == 970
    assert Charge.objects.get(job=before).period_start == start
