"""The operators' busiest admin lists (jobs, sessions, cases) read a page of rows, not the history:
a list filter's choices come from the few devices, users, backends and live cases, never from a
DISTINCT over every job, session or case that ever ended (SPEC §9).

The date hierarchy offers every year, month or day between the list's first and last date (an
index's two ends), not a DISTINCT over the dates of every row (``apps/core/templatetags/
gridgate_admin.py``).

Measured on PostgreSQL's own plans (EXPLAIN ANALYZE) over a history of ended rows. The paginator's
COUNT(*) is Django's, read on every list whatever its filters, and is left out here."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from apps.cases.models import Case
from tests import factories
from tests.plans import HISTORY_ROWS, fill_history, rows_read

pytestmark = [pytest.mark.django_db, pytest.mark.postgres]

PAGE = 100  # the admin's list_per_page


def _statements(admin_client, name: str) -> list[str]:
    with CaptureQueriesContext(connection) as ctx:
        response = admin_client.get(reverse(f"admin:{name}_changelist"))
    assert response.status_code == 200
    return [query["sql"] for query in ctx.captured_queries]


def _django_own(sql: str) -> bool:
    """The paginator's counts."""
    return sql.startswith('SELECT COUNT(*) AS "__count"')


def _history_read(admin_client, name: str, table: str) -> dict[str, int]:
    return {
        sql[:200] + " … " + sql[-300:]: rows
        for sql in _statements(admin_client, name)
        if not _django_own(sql) and (rows := rows_read(sql, table)) > PAGE + 10
    }


@pytest.fixture
def qpu_pool(db):
    return factories.pool("qpu")


@pytest.fixture
def fake_device(qpu_pool):
    return factories.device(qpu_pool, "fake1")


@pytest.fixture
def history(owner, qpu_pool, fake_device, local_pool):
    fill_history(owner, qpu_pool)  # ended sessions, each with a finished job
    klass = local_pool.classes.get()
    now = timezone.now()
    Case.objects.bulk_create(
        Case(
            owner=owner,
            resource_class=klass,
            name=f"old {i}",
            command="true",
            status="failed",
            backend="local",
            run_host="old-host",
            created_at=now - timedelta(days=1),
            finished_at=now,
        )
        for i in range(HISTORY_ROWS)
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def test_the_job_list_reads_a_page_of_jobs_whatever_the_history(admin_client, history):
    assert _history_read(admin_client, "scheduling_job", "scheduling_job") == {}


def test_the_session_list_reads_a_page_of_sessions_whatever_the_history(admin_client, history):
    assert _history_read(admin_client, "compute_sessions_session", "compute_sessions_session") == {}


def test_the_case_list_reads_a_page_of_cases_whatever_the_history(admin_client, history):
    assert _history_read(admin_client, "cases_case", "cases_case") == {}


def test_the_lists_still_filter_by_device_user_backend_and_host(admin_client, history, qpu_pool, fake_device, owner):
    factories.device(qpu_pool, "idle")  # a device that never ran a job is offered too
    jobs = admin_client.get(reverse("admin:scheduling_job_changelist")).content.decode()
    assert f"?device__id__exact={fake_device.pk}" in jobs and "idle" in jobs
    sessions = admin_client.get(reverse("admin:compute_sessions_session_changelist")).content.decode()
    assert f"?user__id__exact={owner.pk}" in sessions
    cases = admin_client.get(reverse("admin:cases_case_changelist") + "?backend=local").content.decode()
    assert "?backend=local" in cases and "?backend=slurm" in cases
    Case.objects.filter(name="old 1").update(status="running", run_host="node-7")
    running = admin_client.get(reverse("admin:cases_case_changelist") + "?run_host=node-7")
    assert running.status_code == 200 and running.context["cl"].result_count == 1


def test_the_delivery_log_reads_its_newest_page_whatever_the_history(admin_client, owner):
    """Newest first, as ``Delivery.Meta.ordering``: an index in that order, else the whole log is
    read and sorted at each view."""
    from apps.notifications.models import Delivery, Subscription

    subscription = Subscription.objects.create(user=owner, event="job.finished", channel="email")
    now = timezone.now()
    Delivery.objects.bulk_create(
        Delivery(
            subscription=subscription,
            user=owner,
            event="job.finished",
            subject=f"job {i}",
            payload={},
            status="delivered",
            created_at=now - timedelta(minutes=i),
        )
        for i in range(HISTORY_ROWS)
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    assert _history_read(admin_client, "notifications_delivery", "notifications_delivery") == {}


def test_the_calendar_list_reads_a_page_of_windows_whatever_the_history(admin_client, owner, qpu_pool):
    """The windows in ``Reservation.Meta.ordering`` (start, id), and the pools that have any,
    without reading every window of the past."""
    from apps.reservations.models import Reservation

    now = timezone.now()
    Reservation.objects.bulk_create(
        Reservation(
            pool=qpu_pool,
            start=now - timedelta(days=14, hours=2 + i),
            end=now - timedelta(days=14, hours=1 + i),
            cancelled_at=now if i % 2 else None,
            started_at=now - timedelta(days=14, hours=2 + i),
            slots=1,
            title=f"past {i}",
        )
        for i in range(HISTORY_ROWS)
    )
    Reservation.objects.create(pool=qpu_pool, start=now, end=now + timedelta(hours=1), slots=1, title="this week")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    assert _history_read(admin_client, "reservations_reservation", "reservations_reservation") == {}


def test_the_date_hierarchy_still_drills_down_from_years_to_days(admin_client, owner, qpu_pool):
    from apps.scheduling.models import Job

    session = factories.session(qpu_pool, owner)
    for created in ("2024-11-03T10:00:00Z", "2026-02-25T10:00:00Z", "2026-02-27T10:00:00Z", "2026-03-02T10:00:00Z"):
        Job.objects.create(
            session=session, pool=qpu_pool, user=owner, payload={}, shots=1, status="completed", created_at=created
        )
    url = reverse("admin:scheduling_job_changelist")

    def steps(query: str) -> list[str]:
        response = admin_client.get(url + query)
        assert response.status_code == 200
        return _hierarchy(response)

    assert steps("") == ["2024", "2025", "2026"]  # 2025 holds no job: its list is empty
    assert steps("?created_at__year=2026") == ["February 2026", "March 2026"]
    assert steps("?created_at__year=2026&created_at__month=2") == ["February 25", "February 26", "February 27"]
    listed = admin_client.get(url + "?created_at__year=2026&created_at__month=3&created_at__day=2")
    assert listed.context["cl"].result_count == 1


def _hierarchy(response) -> list[str]:
    """The steps the date hierarchy links to (not its way back)."""
    import re

    page = response.content.decode()
    nav = re.search(r'<nav class="toplinks">(.*?)</nav>', page, re.S).group(1)
    return list(re.findall(r'<a href="\?[^"]*"(?! class="date-back")>([^<]+)</a>', nav))


def test_the_driver_runs_list_reads_a_page_of_runs_whatever_the_history(admin_client, qpu_pool, fake_device):
    """One run per job of the built-in and Pasqal drivers: its list, its status filter and its order
    (Meta.ordering, created_at then remote_id) never read every run kept."""
    from apps.scheduling.models import DriverRun

    DriverRun.objects.bulk_create(
        DriverRun(remote_id=f"emu-{i}", device=fake_device, payload={}, shots=1, status="completed")
        for i in range(HISTORY_ROWS)
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    assert _history_read(admin_client, "scheduling_driverrun", "scheduling_driverrun") == {}
    page = admin_client.get(reverse("admin:scheduling_driverrun_changelist") + "?status=completed")
    assert page.status_code == 200 and "?status=running" in page.content.decode()
