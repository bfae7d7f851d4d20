"""The operators' utilization page: staff only, the period chosen in a form whose hostile input is
a form error (never a 500), the known day's numbers on the page, and a query count that does not
grow with the data."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.resources.models import ResourceClass, ResourcePool
from apps.scheduling.models import Device, JobStatus
from tests.accounting.conftest import T0, H, S, make_history, make_job, make_session

pytestmark = pytest.mark.django_db


@pytest.fixture
def history(db):
    return make_history()


URL = "/utilization/"
KNOWN_DAY = f"{URL}?period=custom&since=2026-11-01&until=2026-11-01"


def test_anonymous_visitors_are_sent_to_log_in(web):
    response = web(None).get(URL)
    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_users_who_are_not_staff_are_refused(web, owner):
    assert web(owner).get(URL).status_code == 403


def test_staff_see_the_known_day_in_numbers_and_pictures(web, staff, history):
    response = web(staff).get(KNOWN_DAY)
    assert response.status_code == 200
    page = response.content.decode()
    assert "From 2026-11-01 00:00 to 2026-11-02 00:00 UTC, per hour." in page
    assert "over the period p50 10 s and p95 20 s (22 jobs)" in page
    assert "1.33 device-hours in the period (d1 0.83 h; d2 0.5 h)" in page
    assert "23 job(s) created in the period: 1 pending, 1 running, 21 completed." in page
    assert "3 case(s) created in the period: 2 done, 1 failed." in page
    assert "at most 5 of 10 (2026-11-01 01:00–02:00)" in page
    assert "Nothing in this period: quiet." in page
    assert page.count('class="col"') >= 24 + 5  # slots in every hour from 00:00, busy in five
    assert page.count('class="point point-p50"') == 3 and page.count('class="point point-p95"') == 3


def test_the_default_is_the_last_24_hours(web, staff, history):
    response = web(staff).get(URL)
    assert response.status_code == 200
    assert "per hour." in response.content.decode()


@pytest.mark.parametrize(
    "query, words",
    [
        ("period=forever", "Select a valid choice"),
        ("period=custom", "Give both dates"),
        ("period=custom&since=2026-11-02&until=2026-11-01", "on or before the To date"),
        ("period=custom&since=2026-13-45&until=2026-11-01", "Enter a valid date"),
        ("period=custom&since=yesterday&until=today", "Enter a valid date"),
        ("period=custom&since=0001-01-01&until=2026-11-01", "Pick a date between 1970-01-01 and 9000-01-01"),
        ("period=custom&since=2026-01-01&until=9999-12-31", "Pick a date between"),
        ("period=custom&since=2020-01-01&until=2026-11-01", "Pick at most 366 days"),
        ("pool=abc", "Select a valid choice"),
        ("pool=99999999999999999999999", "Select a valid choice"),
        ("pool=-1", "Select a valid choice"),
        ("period=" + "x" * 5000, "Select a valid choice"),
        ("since=%00&period=custom&until=2026-11-01", "Enter a valid date"),
    ],
)
def test_hostile_periods_are_form_errors_not_crashes(web, staff, query, words):
    response = web(staff).get(f"{URL}?{query}")
    assert response.status_code == 400
    assert words in response.content.decode()
    assert 'class="timechart' not in response.content.decode()


def test_the_admin_links_to_the_charts(web, staff):
    staff.is_superuser = True
    staff.save()
    page = web(staff).get("/admin/").content.decode()
    assert f'href="{URL}">Utilization charts</a>' in page


def test_busy_share_over_the_current_capacity_is_shown_as_it_is_not_clipped(web, staff, history):
    """Busy share is over today's devices: a pool that ran two jobs at once on a device that now
    takes one shows 200 %, in the table and on an axis that reaches it, and says what it is over."""
    shrunk = ResourcePool.objects.create(name="shrunk", public=True)
    ResourceClass.objects.create(pool=shrunk, name="c", cpu=1, memory=1, default=True)
    device = Device.objects.create(pool=shrunk, name="d7", driver="fake", max_concurrent_jobs=1)
    session = make_session(shrunk, staff, 1, T0 + 3 * H)
    for _ in range(2):
        make_job(session, JobStatus.COMPLETED, T0 + 3 * H, T0 + 3 * H, T0 + 4 * H, device)
    page = web(staff).get(KNOWN_DAY).content.decode()
    section = page[page.index(f'id="pool-{shrunk.pk}"') :]
    assert "Share of the pool&#x27;s current device capacity" in section
    assert "<td>200 %</td>" in section
    assert ">200 %</text>" in section  # the value axis goes up to it


def test_the_page_costs_the_same_queries_with_more_jobs_and_pools(web, staff, history):
    client = web(staff)

    def count() -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert client.get(KNOWN_DAY).status_code == 200
        return len(ctx.captured_queries)

    before = count()
    qpu = history["qpu"]
    session = make_session(qpu, qpu.sessions.first().user, 1, T0 + 6 * H)
    for i in range(40):
        make_job(session, JobStatus.COMPLETED, T0 + 6 * H, T0 + 6 * H + i * S, T0 + 7 * H, qpu.devices.first())
    more = ResourcePool.objects.create(name="more", public=True, slots_total=3)
    ResourceClass.objects.create(pool=more, name="c", cpu=1, memory=1, default=True)
    Device.objects.create(pool=more, name="d9", driver="fake")
    make_session(more, qpu.sessions.first().user, 2, T0 + 2 * H)
    assert count() == before
    # the session and its user, the form's pool choices, the selector's eight (seven on SQLite),
    # the usage breakdown's three (per user, group, project: apps.allocations.usage)
    assert before == (14 if connection.vendor == "postgresql" else 13)
