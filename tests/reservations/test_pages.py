"""The calendar in the admin (staff create and cancel windows, the week view, R-RES-1's rules as
form errors) and on the pool's page (the week view and the feed URL)."""

import pytest
import time_machine

from apps.reservations.models import Reservation
from tests.reservations.conftest import at

pytestmark = pytest.mark.django_db

ADD = "/admin/reservations/reservation/add/"


def form(pool, group, **more):
    return {
        "pool": pool.pk,
        "device": "",
        "kind": "reservation",
        "start_0": "2030-03-04",
        "start_1": "10:00:00",
        "end_0": "2030-03-04",
        "end_1": "11:00:00",
        "slots": 1,
        "title": "Hybrid run",
        "groups": [group.pk],
        **more,
    }


def test_staff_create_a_reservation_in_the_admin_and_see_it_in_the_week(admin_client, qpu, group_a):
    response = admin_client.post(ADD, form(qpu, group_a))
    assert response.status_code == 302, response.content.decode()[-2000:]
    window = Reservation.objects.get()
    assert list(window.groups.all()) == [group_a] and window.created_by.is_superuser
    page = admin_client.get("/admin/reservations/reservation/?week=2030-03-04")
    assert page.status_code == 200
    assert "Week view" in page.content.decode() and "Hybrid run" in page.content.decode()
    assert admin_client.get(f"/admin/reservations/reservation/{window.pk}/change/").status_code == 200


def test_the_admin_refuses_an_overbooking_and_a_reservation_without_holders(admin_client, qpu, group_a, reserve):
    reserve(qpu, groups=[group_a], slots=2, title="Course")
    refused = admin_client.post(ADD, form(qpu, group_a))
    assert refused.status_code == 200 and "overbooked" in refused.content.decode()
    nobody = admin_client.post(ADD, form(qpu, group_a, groups=[], start_0="2030-03-05", end_0="2030-03-05"))
    assert nobody.status_code == 200 and "needs holders" in nobody.content.decode()
    assert Reservation.objects.count() == 1


def test_the_admin_cancels_windows_and_never_deletes_them(admin_client, qpu, group_a, reserve):
    window = reserve(qpu, groups=[group_a])
    response = admin_client.post(
        "/admin/reservations/reservation/", {"action": "cancel", "_selected_action": [window.pk]}
    )
    assert response.status_code == 302
    window.refresh_from_db()
    assert window.cancelled_at is not None
    assert admin_client.get(f"/admin/reservations/reservation/{window.pk}/delete/").status_code in (302, 403)


def test_the_pool_page_shows_the_week_and_the_feed_url(client, qpu, alice, group_a, reserve):
    reserve(qpu, groups=[group_a], title="Hybrid run")
    with time_machine.travel(at(8), tick=False):
        client.force_login(alice)  # in the travelled time: a session cookie of 2026 has expired by 2030
        page = client.get(f"/pools/{qpu.pk}/?week=2030-03-06").content.decode()
    assert "Hybrid run" in page and "reserved for you" in page and "schedule.ics?token=" in page
    assert client.get(f"/pools/{qpu.pk}/?week=0001-01-01").status_code == 200
    assert client.get("/pools/999999/").status_code == 404


def test_the_week_view_takes_a_pool_filter_in_other_digits_without_a_500(admin_client, qpu):
    # '²'.isdigit() is True, and int('²') raises: the week view's pool filter answered 500.
    response = admin_client.get("/admin/reservations/reservation/?pool__id__exact=%C2%B2")
    assert response.status_code in (200, 302)  # the admin's own answer to a filter it cannot read


@pytest.mark.parametrize(
    "drill", ["start__year=9999", "start__year=9999&start__month=12", "start__year=9999&start__month=12&start__day=31"]
)
def test_the_admins_date_drill_down_to_the_calendars_last_year_is_no_500(admin_client, qpu, group_a, reserve, drill):
    """The API takes a window in year 9999, and the list's date drill-down then links to it: the
    day, month or year after it is past datetime's range (Django computes it as the drill-down's
    end), which raised OverflowError (a 500); it is now the admin's answer to a bad filter."""
    from datetime import UTC, datetime

    reserve(
        qpu, start=datetime(9999, 12, 31, 22, tzinfo=UTC), end=datetime(9999, 12, 31, 23, tzinfo=UTC), groups=[group_a]
    )
    assert "start__year=9999" in admin_client.get("/admin/reservations/reservation/").content.decode()
    # beside a window of 2030: the years that hold windows, not a link for every year between
    reserve(qpu, groups=[group_a])
    years = admin_client.get("/admin/reservations/reservation/").content.decode().count("start__year=")
    assert 2 <= years < 10
    answer = admin_client.get(f"/admin/reservations/reservation/?{drill}")
    assert answer.status_code == 302 and answer["Location"].endswith("?e=1")
    assert admin_client.get("/admin/compute_sessions/session/?created_at__year=9999").status_code == 302


def test_the_week_view_dates_a_window_that_begins_or_ends_outside_the_week_and_says_utc(client, qpu, alice, reserve):
    """A window longer than the week read "Mon 10:00–Mon 10:00" in every day's cell (weekday and
    hour only), and nothing said the hours and days were UTC's."""
    from datetime import UTC, datetime

    from apps.reservations.models import WindowKind

    reserve(
        qpu,
        kind=WindowKind.MAINTENANCE,
        slots=0,
        start=datetime(2030, 3, 4, 10, tzinfo=UTC),  # a Monday
        end=datetime(2030, 3, 11, 10, tzinfo=UTC),  # the next Monday
        title="Cryostat warm-up",
    )
    with time_machine.travel(at(8), tick=False):
        client.force_login(alice)
        this_week = client.get(f"/pools/{qpu.pk}/?week=2030-03-04").content.decode()
        next_week = client.get(f"/pools/{qpu.pk}/?week=2030-03-11").content.decode()
    assert "Mon 10:00–Mon 11 Mar 10:00" in this_week and "Mon 10:00–Mon 10:00" not in this_week
    assert "Mon 4 Mar 10:00–Mon 10:00" in next_week
    assert "UTC" in this_week
