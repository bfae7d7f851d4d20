"""The calendar's API (SPEC §11 pinned paths): /api/v1/reservations/ (staff write by model
permission, holders read theirs, others' are 404; DELETE cancels), R-RES-1's validation as clear
400s, and R-RES-4's schedule with ``mine``, as JSON and as an iCalendar feed read with a personal
feed token and parsed by a real iCalendar library."""

import re
from datetime import timedelta

import pytest
import time_machine
from icalendar import Calendar
from rest_framework.test import APIClient

from apps.reservations.models import Reservation
from apps.reservations.services import cancel_reservation
from tests.reservations.conftest import ELEVEN, TEN, at

pytestmark = pytest.mark.django_db

URL = "/api/v1/reservations/"


def body(pool, **more):
    return {
        "pool": pool.pk,
        "kind": "reservation",
        "start": TEN.isoformat(),
        "end": ELEVEN.isoformat(),
        "slots": 1,
        "groups": ["group-a"],
        "title": "Hybrid run",
        **more,
    }


def test_staff_with_the_permission_create_change_and_cancel_a_reservation(api, operator, qpu, group_a):
    created = api(operator).post(URL, body(qpu), format="json")
    assert created.status_code == 201, created.content
    assert created.json()["groups"] == ["group-a"] and created.json()["created_by"] == "operator"
    url = f"{URL}{created.json()['id']}/"
    assert api(operator).patch(url, {"title": "Course", "users": ["operator"]}, format="json").status_code == 200
    assert api(operator).delete(url).status_code == 204
    assert api(operator).delete(url).status_code == 204  # idempotent
    window = Reservation.objects.get()
    assert window.cancelled_at is not None and window.title == "Course"  # kept, with cancelled_at
    assert api(operator).get(url).json()["cancelled_at"] is not None


def test_staff_without_the_model_permission_and_users_cannot_write(api, bare_staff, alice, qpu, group_a):
    assert api(bare_staff).post(URL, body(qpu), format="json").status_code == 403
    assert api(alice).post(URL, body(qpu), format="json").status_code == 403


def test_holders_see_theirs_and_others_get_404(api, operator, qpu, alice, group_a, outsiders, reserve):
    mine = reserve(qpu, groups=[group_a])
    assert [w["id"] for w in api(alice).get(URL).json()["results"]] == [mine.pk]
    assert api(outsiders[0]).get(URL).json()["results"] == []
    assert api(outsiders[0]).get(f"{URL}{mine.pk}/").status_code == 404
    assert api(alice).delete(f"{URL}{mine.pk}/").status_code == 403


def test_a_holder_sees_how_they_hold_a_reservation_not_who_else_does(
    api, operator, qpu, alice, group_a, outsiders, reserve
):
    """Who else holds a window (and so works on a private pool) is the operators' business, as
    for the pool's own grants: each holder saw every other holder's username and group."""
    from django.contrib.auth.models import Group

    window = reserve(qpu, users=outsiders[:2], groups=[group_a, Group.objects.create(name="group-b")])
    seen_by_alice = api(alice).get(f"{URL}{window.pk}/").json()
    assert (seen_by_alice["users"], seen_by_alice["groups"]) == ([], ["group-a"])
    listed_for_out0 = api(outsiders[0]).get(URL).json()["results"]
    assert [(w["users"], w["groups"]) for w in listed_for_out0] == [(["out0"], [])]
    seen_by_staff = api(operator).get(f"{URL}{window.pk}/").json()
    assert (seen_by_staff["users"], seen_by_staff["groups"]) == (["out0", "out1"], ["group-a", "group-b"])


def test_a_windows_holders_are_listed_by_name(api, operator, qpu, reserve, django_user_model):
    """The database returns a window's holders in no set order: the same window read twice could
    list them differently (a client diffing two reads saw a change that was none)."""
    from django.contrib.auth.models import Group

    users = [django_user_model.objects.create_user(name) for name in ("zoe", "amy")]  # ids against names
    groups = [Group.objects.create(name=name) for name in ("zeta", "alpha")]
    window = reserve(qpu, users=users, groups=groups)
    seen = api(operator).get(f"{URL}{window.pk}/").json()
    assert (seen["users"], seen["groups"]) == (["amy", "zoe"], ["alpha", "zeta"])


def test_r_res_1_overlapping_reservations_that_would_overbook_are_refused_with_a_clear_400(
    api, operator, qpu, group_a, reserve
):
    reserve(qpu, groups=[group_a], slots=1, title="Course")
    refused = api(operator).post(
        URL, body(qpu, slots=2, start=at(10, 30).isoformat(), end=at(12).isoformat()), format="json"
    )
    assert refused.status_code == 400
    message = refused.json()["slots"][0]
    assert "overbooked" in message and "'Course'" in message and "R-RES-1" in message
    # What fits beside it is accepted: one slot more, or the same after it ends.
    assert api(operator).post(URL, body(qpu, start=at(10, 30).isoformat()), format="json").status_code == 201
    assert (
        api(operator).post(URL, body(qpu, slots=2, start=ELEVEN.isoformat(), end=at(12).isoformat()), format="json")
    ).status_code == 201


def test_r_res_1_back_to_back_reservations_never_count_as_overlapping(api, operator, qpu, group_a, reserve):
    """A window holds [start, end): 'Morning' (10-11) and 'Noon' (11-12) never hold together, so
    one slot all morning fits beside them on the two-slot pool, and so do both slots just before."""
    reserve(qpu, groups=[group_a], slots=1, title="Morning")
    reserve(qpu, groups=[group_a], slots=1, start=ELEVEN, end=at(12), title="Noon")
    across = api(operator).post(URL, body(qpu, end=at(12).isoformat(), title="Across"), format="json")
    assert across.status_code == 201, across.content
    before = api(operator).post(URL, body(qpu, slots=2, start=at(9).isoformat(), end=TEN.isoformat()), format="json")
    assert before.status_code == 201, before.content


def test_r_res_1_a_reservation_that_fills_the_pool_can_be_changed(api, operator, qpu, group_a, reserve):
    """Its own slots are not counted twice: both slots of the pool, moved and renamed."""
    window = reserve(qpu, groups=[group_a], slots=2, title="Course")
    changed = api(operator).patch(
        f"{URL}{window.pk}/", {"title": "Course (room B)", "end": at(11, 30).isoformat()}, format="json"
    )
    assert changed.status_code == 200, changed.content
    window.refresh_from_db()
    assert (window.title, window.end, window.slots) == ("Course (room B)", at(11, 30), 2)


def test_r_res_1_a_full_pool_never_refuses_a_reservation_on_another_pool(api, operator, qpu, group_a, reserve):
    from tests import factories

    reserve(qpu, groups=[group_a], slots=2, title="Course")
    other = factories.pool("orion", slots_total=2)
    response = api(operator).post(URL, body(other, slots=2), format="json")
    assert response.status_code == 201, response.content


def test_r_res_1_a_pools_slots_are_never_lowered_below_what_its_reservations_hold(api, staff, qpu, group_a, reserve):
    """The pool's side of overbooking: 2 slots held at 10:30 (two overlapping reservations), so
    slots_total 1 is a 400 naming them and changes nothing; 2 is accepted, and once they have
    ended (or are cancelled) nothing holds the pool."""
    reserve(qpu, groups=[group_a], slots=1, title="Course")
    late = reserve(qpu, groups=[group_a], slots=1, start=at(10, 30), end=at(12), title="Demo")
    url = f"/api/v1/resource-pools/{qpu.pk}/"
    refused = api(staff).patch(url, {"slots_total": 1}, format="json")
    assert refused.status_code == 400
    message = refused.json()["slots_total"][0]
    assert "'Course', 'Demo' hold 2 slots" in message and "10:30" in message and "R-RES-1" in message
    qpu.refresh_from_db()
    assert qpu.slots_total == 2
    assert api(staff).patch(url, {"slots_total": 3}, format="json").status_code == 200
    assert api(staff).patch(url, {"slots_total": 2}, format="json").status_code == 200
    cancel_reservation(late)
    assert api(staff).patch(url, {"slots_total": 1}, format="json").status_code == 200
    with time_machine.travel(ELEVEN, tick=False):
        reserve(qpu, groups=[group_a], slots=1, start=ELEVEN, end=at(12), title="Next")
        qpu.slots_total = 2
        qpu.save()
        lowered = api(staff).patch(url, {"slots_total": 1}, format="json")
        assert lowered.status_code == 200, lowered.content  # 'Course' has ended; 'Next' holds 1


def test_r_res_1_the_pool_admin_page_refuses_lowering_slots_below_the_reservations(admin_client, qpu, group_a, reserve):
    from django.urls import reverse

    from tests.resources.test_admin import inline_data, pool_form

    reserve(qpu, groups=[group_a], slots=2, title="Course")
    klass = qpu.classes.get()
    fields = (
        "name",
        "cpu",
        "memory",
        "gpu",
        "max_storage",
        "default_storage",
        "max_tasks",
        "wall_time",
        "max_wall_time",
    )
    kept = {"id": str(klass.pk), "pool": str(qpu.pk), "default": "on"} | {f: str(getattr(klass, f)) for f in fields}
    data = pool_form(name=qpu.name, public="on", slots_total="1") | inline_data([kept], initial=1)
    response = admin_client.post(reverse("admin:resources_resourcepool_change", args=[qpu.pk]), data)
    assert response.status_code == 200
    assert "'Course' holds 2 slots" in response.context["adminform"].form.errors["slots_total"][0]
    qpu.refresh_from_db()
    assert qpu.slots_total == 2


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"end": TEN.isoformat()}, "end"),
        ({"slots": 3}, "slots"),
        ({"slots": 0}, "slots"),
        ({"groups": [], "users": []}, "users"),
        ({"users": ["nobody-such"]}, "users"),
        ({"groups": ["no-such-group"]}, "groups"),
        ({"title": "  "}, "title"),
        ({"kind": "maintenance", "slots": 0}, "users"),  # a maintenance window has no holders
    ],
)
def test_r_res_1_a_window_that_breaks_a_rule_is_a_400_on_its_field(api, operator, qpu, group_a, change, field):
    response = api(operator).post(URL, body(qpu, **change), format="json")
    assert response.status_code == 400
    assert field in response.json(), response.json()


def test_a_device_of_another_pool_and_a_pool_without_slots_are_refused(api, operator, qpu, group_a, local_pool):
    from apps.scheduling.models import Device

    elsewhere = Device.objects.create(pool=local_pool, name="emu", driver="fake")
    on_another_pool = api(operator).post(URL, body(qpu, device=elsewhere.pk), format="json")
    assert on_another_pool.status_code == 400 and "device" in on_another_pool.json()
    without_slots = api(operator).post(URL, body(local_pool), format="json")
    assert without_slots.status_code == 400 and "pool" in without_slots.json()
    maintenance = body(local_pool, kind="maintenance", groups=[], slots=0, title="Upgrade")
    assert api(operator).post(URL, maintenance, format="json").status_code == 201


def schedule(client, pool, **params):
    return client.get(f"/api/v1/resource-pools/{pool.pk}/schedule/", params)


def test_r_res_4_the_schedule_gives_typed_slots_with_mine(api, qpu, alice, group_a, outsiders, reserve):
    reserve(qpu, groups=[group_a], title="Hybrid run")
    reserve(qpu, kind="maintenance", slots=0, start=at(12), end=at(13), title="Calibration")
    params = {"from": at(9).isoformat(), "to": at(14).isoformat()}
    mine = schedule(api(alice), qpu, **params).json()
    kinds = [(slot["kind"], slot["title"], slot["slots"]) for slot in mine["slots"]]
    assert kinds == [
        ("open", "open", 2),
        ("reservation", "Hybrid run", 1),
        ("open", "open", 2),
        ("maintenance", "Calibration", 0),
        ("open", "open", 2),
    ]
    assert [slot["mine"] for slot in mine["slots"]] == [False, True, False, False, False]
    theirs = schedule(api(outsiders[0]), qpu, **params).json()
    assert [slot["mine"] for slot in theirs["slots"]] == [False] * 5
    assert "group-a" not in str(theirs)  # holders are never named to others


def test_r_res_4_a_window_that_starts_when_the_range_ends_is_not_in_the_schedule(api, qpu, alice, group_a, reserve):
    reserve(qpu, groups=[group_a], title="Hybrid run")  # 10-11
    before = schedule(api(alice), qpu, **{"from": at(9).isoformat(), "to": TEN.isoformat()}).json()
    assert [(slot["kind"], slot["start"], slot["end"]) for slot in before["slots"]] == [
        ("open", "2030-03-04T09:00:00Z", "2030-03-04T10:00:00Z")
    ]


def test_r_res_4_the_schedule_of_a_pool_you_cannot_see_is_404_and_bad_ranges_are_400(api, alice, qpu, outsiders):
    qpu.public = False
    qpu.save()
    assert schedule(api(alice), qpu).status_code == 404
    assert schedule(api(None), qpu).status_code in (401, 403)
    qpu.public = True
    qpu.save()
    assert schedule(api(alice), qpu, **{"from": "yesterday"}).status_code == 400
    assert schedule(api(alice), qpu, **{"from": at(10).isoformat(), "to": at(9).isoformat()}).status_code == 400
    far = {"from": at(10).isoformat(), "to": (at(10) + timedelta(days=400)).isoformat()}
    assert schedule(api(alice), qpu, **far).status_code == 400


def test_r_res_4_the_ical_feed_is_read_with_the_personal_token_and_parses(qpu, alice, group_a, reserve, api):
    reserve(qpu, groups=[group_a], title="Hybrid run")
    reserve(qpu, kind="maintenance", slots=0, start=at(12), end=at(13), title="Calibration; Monday, 8:00")
    with time_machine.travel(at(8), tick=False):
        url = schedule(api(alice), qpu).json()["ics_url"]
        response = APIClient().get(url)  # a calendar application: no header, no cookie
    assert response.status_code == 200 and response["Content-Type"].startswith("text/calendar")
    calendar = Calendar.from_ical(response.content)
    events = list(calendar.walk("VEVENT"))
    windows = {str(event["CATEGORIES"].cats[0]): event for event in events}
    assert set(windows) == {"RESERVATION", "MAINTENANCE", "OPEN"}
    reserved = windows["RESERVATION"]
    assert reserved.decoded("DTSTART") == TEN and reserved.decoded("DTEND") == ELEVEN
    assert "Hybrid run" in str(reserved["SUMMARY"]) and "yours" in str(reserved["SUMMARY"])
    assert str(windows["MAINTENANCE"]["SUMMARY"]).endswith("Calibration; Monday, 8:00")
    assert all(str(event["UID"]) for event in events) and len({str(e["UID"]) for e in events}) == len(events)


def test_r_res_4_the_feeds_events_keep_their_uids_from_one_fetch_to_the_next(qpu, alice, group_a, reserve, api):
    """A calendar application matches events by UID: the open slot before the first window begins
    whenever the feed is read, and named after that start it was a new event at every fetch."""
    reserve(qpu, groups=[group_a], title="Hybrid run")

    def uids(hour: int) -> set[str]:
        with time_machine.travel(at(hour), tick=False):
            response = APIClient().get(schedule(api(alice), qpu).json()["ics_url"])
        return {str(event["UID"]) for event in Calendar.from_ical(response.content).walk("VEVENT")}

    assert uids(8) == uids(9)


def test_r_res_4_a_forged_or_revoked_feed_token_is_refused_with_json(qpu, alice, api):
    url = schedule(api(alice), qpu).json()["ics_url"]
    forged = APIClient().get(url[:-3] + "xyz")
    assert forged.status_code in (401, 403) and "feed token" in forged.json()["detail"]
    alice.set_password("a new one")
    alice.save()
    assert APIClient().get(url).status_code in (401, 403)
    assert APIClient().get(url.split("?")[0]).status_code in (401, 403)  # no token at all


@pytest.mark.parametrize("newline", ["\r\n", "\n", "\r"])
def test_r_res_4_a_title_or_pool_name_cannot_add_lines_to_the_ical_feed(
    qpu, alice, group_a, reserve, api, staff, newline
):
    """Text in the feed is escaped (RFC 5545 TEXT): a line break in a reservation's title or in
    the pool's name (the calendar's name, the file name) cannot start a property of its own (an
    ATTENDEE, a METHOD) that a calendar application would act on, nor break the feed."""
    name = f'fresnel "B"{newline}METHOD:REQUEST'
    renamed = api(staff).patch(f"/api/v1/resource-pools/{qpu.pk}/", {"name": name}, format="json")
    assert renamed.status_code == 200, renamed.content
    reserve(qpu, groups=[group_a], title=f"Run{newline}ATTENDEE:mailto:everyone@evil.example")
    with time_machine.travel(at(8), tick=False):
        url = schedule(api(alice), qpu).json()["ics_url"]
        response = APIClient().get(url)
    assert response.status_code == 200, response.content
    lines = response.content.decode().replace("\r\n", "\n").replace("\r", "\n").split("\n")
    assert not [line for line in lines if line.startswith(("METHOD", "ATTENDEE"))], lines
    calendar = Calendar.from_ical(response.content)
    assert "METHOD" not in calendar and str(calendar["X-WR-CALNAME"]).startswith('fresnel "B"\\nMETHOD')
    (reserved,) = [event for event in calendar.walk("VEVENT") if "Run" in str(event["SUMMARY"])]
    assert f"Run{newline}ATTENDEE" in str(reserved["SUMMARY"]).replace("\n", newline) and "ATTENDEE" not in reserved
    assert response["Content-Disposition"].startswith("inline; filename=")


def test_r_res_4_a_control_character_in_a_name_never_reaches_the_ical_feed(qpu, alice, group_a, reserve, api, staff):
    """RFC 5545 TEXT carries no control character but tab: one in the pool's name or a title (an
    escape sequence, a bell) is shown as U+FFFD, so a strict reader still takes the whole feed."""
    renamed = api(staff).patch(f"/api/v1/resource-pools/{qpu.pk}/", {"name": "fres\x1b[2Jnel"}, format="json")
    assert renamed.status_code == 200, renamed.content
    reserve(qpu, groups=[group_a], title="Run\x01\x07\x7f")
    with time_machine.travel(at(8), tick=False):
        response = APIClient().get(schedule(api(alice), qpu).json()["ics_url"])
    assert response.status_code == 200, response.content
    body = response.content.decode()
    assert not re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]", body)
    assert "fres\ufffd[2Jnel" in body and "Run\ufffd\ufffd\ufffd" in body


def test_r_res_4_a_feed_shows_others_only_what_the_schedule_does(qpu, alice, group_a, outsiders, reserve, api):
    """Each feed is its reader's: "(yours)" only in a holder's, holders never named, and a feed
    token reads only pools its user may see (a private pool's feed is a 404 for anyone else)."""
    reserve(qpu, groups=[group_a], users=[alice], title="Hybrid run")
    with time_machine.travel(at(8), tick=False):
        feeds = {user: APIClient().get(schedule(api(user), qpu).json()["ics_url"]) for user in (alice, outsiders[0])}
        qpu.public = False
        qpu.save()
        hidden = APIClient().get(feeds[outsiders[0]].wsgi_request.get_full_path())
    mine, theirs = (feeds[user].content.decode() for user in (alice, outsiders[0]))
    assert "Hybrid run" in mine and "(yours)" in mine
    assert "Hybrid run" in theirs and "(yours)" not in theirs
    assert not {"alice", "group-a"} & set(re.findall(r"[\w-]+", mine + theirs))
    assert hidden.status_code == 404


@pytest.mark.parametrize("path", ["schedule/", "schedule.ics"])
def test_r_res_4_a_positive_utc_offset_typed_unescaped_in_the_query_string_is_read_as_that_offset(
    api, alice, qpu, path
):
    """In a query string '+' means a space: ``?from=2030-03-04T12:00:00+02:00`` typed as is (curl,
    a browser's address bar) reached the API as ``12:00:00 02:00`` and was a 400 "wrong format"
    naming +HH:MM among the formats, while ``-05:00`` and ``Z`` were read."""
    url = f"/api/v1/resource-pools/{qpu.pk}/{path}"
    plus = api(alice).get(f"{url}?from=2030-03-04T12:00:00+02:00&to=2030-03-04T13:00:00+02:00")
    escaped = api(alice).get(f"{url}?from=2030-03-04T12:00:00%2B02:00&to=2030-03-04T13:00:00%2B02:00")
    assert plus.status_code == escaped.status_code == 200, plus.content
    if path == "schedule/":
        assert plus.json()["from"] == escaped.json()["from"] == "2030-03-04T10:00:00Z"
        assert plus.json()["to"] == "2030-03-04T11:00:00Z"
    assert api(alice).get(f"{url}?from=2030-03-04 12:00").status_code == 200  # a space before the time


def test_the_list_keeps_the_windows_that_reach_into_a_range(api, staff, qpu, group_a, reserve):
    """The list runs oldest first, so a centre's years of windows put today's on its last page:
    ``?ends_after=`` and ``?starts_before=`` keep those that reach into a range."""
    early = reserve(qpu, start=at(8), end=at(9), groups=[group_a])
    middle = reserve(qpu, start=at(10), end=at(11), groups=[group_a])
    late = reserve(qpu, start=at(12), end=at(13), groups=[group_a])

    def ids(**params):
        response = api(staff).get(URL, params)
        assert response.status_code == 200, response.content
        return [window["id"] for window in response.json()["results"]]

    assert ids() == [early.pk, middle.pk, late.pk]
    assert ids(ends_after=at(9).isoformat()) == [middle.pk, late.pk]  # one that ends then is over
    assert ids(starts_before=at(12).isoformat()) == [early.pk, middle.pk]
    assert ids(ends_after=at(10, 30).isoformat(), starts_before=at(10, 45).isoformat()) == [middle.pk]
    # A positive offset typed unescaped ('+' is a space in a query string) is read as that offset.
    plus = api(staff).get(f"{URL}?ends_after=2030-03-04T11:30:00+02:00")
    assert [window["id"] for window in plus.json()["results"]] == [middle.pk, late.pk]


@pytest.mark.parametrize(
    "value", ["yesterday", "2030-13-01T00:00:00Z", "0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-05:00", "1e400"]
)
def test_a_moment_the_list_cannot_read_is_a_400_on_its_parameter(api, staff, qpu, value):
    for name in ("ends_after", "starts_before"):
        response = api(staff).get(URL, {name: value})
        assert response.status_code == 400, (name, value, response.content)
        assert name in response.json()
