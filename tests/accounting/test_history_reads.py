"""The operators' utilization charts and the accounting report read the period's sessions and jobs,
not every session and job that ended before it (SPEC §9): the default view is the last 24 hours of a
site that keeps years of history.

Measured on PostgreSQL's own plans (EXPLAIN ANALYZE) over a history of sessions and jobs that ended
a month before the period."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.accounting.selectors import usage, utilization
from apps.scheduling.models import Job, JobStatus
from apps.sessions.models import Session, SessionStatus
from tests import factories
from tests.plans import HISTORY_ROWS, rows_read

pytestmark = [pytest.mark.django_db, pytest.mark.postgres]

TABLES = ("compute_sessions_session", "scheduling_job")
#: rows of the period (a few sessions and jobs) and planner slack; the history is thirty times more
READ_AT_MOST = 100


@pytest.fixture
def month_old_history():
    user = factories.user("u", password=None)
    pool = factories.pool("qpu", slots_total=10, class_name="c")
    device = factories.device(pool, "d1")
    now = timezone.now()
    old = now - timedelta(days=30)
    sessions = Session.objects.bulk_create(
        Session(
            user=user,
            resource_class=pool.classes.get(),
            pool=pool,
            external_id=str(i),
            created_at=old,
            expires_at=old + timedelta(hours=1),
            idle_expires_at=old + timedelta(hours=1),
            status=SessionStatus.REVOKED,
            revoked_at=old + timedelta(minutes=30),
            revocation_reason="released",
        )
        for i in range(HISTORY_ROWS)
    )
    Job.objects.bulk_create(
        Job(
            session=session,
            pool=pool,
            user=user,
            payload={},
            shots=1,
            status=JobStatus.COMPLETED,
            device=device,
            created_at=old,
            scheduled_at=old + timedelta(seconds=5),
            started_at=old + timedelta(seconds=5),
            finished_at=old + timedelta(minutes=1),
            runtime_seconds=55,
        )
        for session in sessions
    )
    # The period's own: one session still open with a job that ran an hour ago.
    live = factories.session(pool, user)
    Job.objects.create(
        session=live,
        pool=pool,
        user=user,
        payload={},
        shots=1,
        status=JobStatus.COMPLETED,
        device=device,
        created_at=now - timedelta(hours=1),
        scheduled_at=now - timedelta(hours=1),
        finished_at=now - timedelta(minutes=59),
        runtime_seconds=60,
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return now


def _reads(call) -> dict[str, int]:
    with CaptureQueriesContext(connection) as ctx:
        call()
    found = {}
    for query in ctx.captured_queries:
        sql = query["sql"]
        for table in TABLES:
            if sql.startswith("SELECT") and (rows := rows_read(sql, table)) > READ_AT_MOST:
                found[f"{table}: {sql[:120]} … {sql[-260:]}"] = rows
    return found


def test_the_last_day_of_utilization_reads_the_days_sessions_and_jobs(month_old_history):
    now = month_old_history
    result = utilization(now - timedelta(days=1), now, now=now)
    assert sum(result.pools[0].busy_seconds) == pytest.approx(60)  # the day's job, not the month-old ones
    assert _reads(lambda: utilization(now - timedelta(days=1), now, now=now)) == {}


def test_the_last_day_of_accounting_reads_the_days_sessions_and_jobs(month_old_history):
    now = month_old_history
    (row,) = usage(now - timedelta(days=1), now + timedelta(minutes=1))
    assert row["device_seconds"] == 60  # the day's job, not the month-old ones
    assert _reads(lambda: usage(now - timedelta(days=1), now + timedelta(minutes=1))) == {}
