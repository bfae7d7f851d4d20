"""A known day of activity for the utilization selector, page and browser tests."""

from datetime import UTC, datetime, timedelta

import pytest

from apps.cases.models import Case, CaseStatus
from apps.resources.models import ResourcePool
from apps.scheduling.models import Job, JobStatus
from apps.sessions.models import Session, SessionStatus
from tests import factories

T0 = datetime(2026, 11, 1, tzinfo=UTC)
H = timedelta(hours=1)
M = timedelta(minutes=1)
S = timedelta(seconds=1)
DAY = (T0, T0 + 24 * H)  # hourly buckets


def make_session(pool, user, slots, created, revoked=None):
    return Session.objects.create(
        user=user,
        resource_class=pool.classes.get(),
        pool=pool,
        slots=slots,
        created_at=created,
        expires_at=created + 48 * H,
        idle_expires_at=created + 48 * H,
        status=SessionStatus.REVOKED if revoked else SessionStatus.ACTIVE,
        revoked_at=revoked,
        revocation_reason="released" if revoked else "",
    )


def make_job(session, status, created, scheduled=None, finished=None, device=None):
    return Job.objects.create(
        session=session,
        pool=session.pool,
        user=session.user,
        payload={},
        shots=1,
        status=status,
        created_at=created,
        scheduled_at=scheduled,
        finished_at=finished,
        device=device,
    )


@pytest.fixture
def history(db):
    return make_history()


def make_history(username: str = "u") -> dict:
    """A day (2026-11-01 UTC) of a QPU pool (two devices), a case pool and a quiet pool, with
    every edge the sums must clip. The exact answers are in tests/accounting/test_utilization.py."""
    user = factories.user(username, password=None)
    qpu = factories.pool("qpu", slots_total=10, class_name="c")
    d1, d2 = factories.device(qpu, "d1"), factories.device(qpu, "d2")
    local = factories.pool("local", class_name="small")
    local_class = local.classes.get()
    ResourcePool.objects.create(name="quiet", public=True)  # without a class: nothing ran there

    s1 = make_session(qpu, user, 2, T0 + 30 * M, revoked=T0 + 2 * H)  # 1.0 in hour 0, 2.0 in hour 1
    make_session(qpu, user, 3, T0 + H)  # still active: 3.0 from hour 1 to the end
    make_session(qpu, user, 1, T0 - 2 * H, revoked=T0 + 15 * M)  # 0.25 in hour 0
    make_session(qpu, user, 4, T0 - 5 * H, revoked=T0 - H)  # before the period: nothing

    # Hour 2: twenty jobs dispatched after waiting 1..20 s, each holding d1 for a minute.
    for wait in range(1, 21):
        created = T0 + 2 * H
        make_job(s1, JobStatus.COMPLETED, created, created + wait * S, created + wait * S + M, d1)
    # Across hours 4 and 5: ten minutes in each (waited 5 s).
    make_job(s1, JobStatus.COMPLETED, T0 + 4 * H + 50 * M - 5 * S, T0 + 4 * H + 50 * M, T0 + 5 * H + 10 * M, d1)
    # Still running on d2 since 23:30 (waited 30 min); counts until now.
    make_job(s1, JobStatus.RUNNING, T0 + 23 * H, T0 + 23 * H + 30 * M, None, d2)
    make_job(s1, JobStatus.PENDING, T0 + 23 * H + 50 * M)
    # Created and dispatched before the period, finished in it: ten minutes of hour 0, no wait,
    # not among the period's jobs.
    make_job(s1, JobStatus.FAILED, T0 - H, T0 - 10 * M, T0 + 10 * M, d1)

    for status, created in [
        (CaseStatus.DONE, T0 + H),
        (CaseStatus.DONE, T0 + 3 * H),
        (CaseStatus.FAILED, T0 + 5 * H),
        (CaseStatus.DONE, T0 - H),  # before the period
    ]:
        case = Case.objects.create(owner=user, resource_class=local_class, name="c", command="true")
        Case.objects.filter(pk=case.pk).update(status=status, created_at=created, results_fetched=True)
    return {"qpu": qpu, "local": local}
