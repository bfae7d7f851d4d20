"""R-RES-1 in admission (R-SESS-1 extended, one rule for REST and QRMI): during a reservation,
others never hold more than slots_total − reserved; holders use their reserved slots first;
holders find their slots free at the start (within one tick), sessions in the way revoked,
newest first, reason ``reservation``."""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import time_machine
from django.db import connection
from django.db.models import Sum

from apps.reservations import passes
from apps.reservations.models import Reservation
from apps.sessions import services
from apps.sessions.models import RevocationReason, Session
from tests.concurrency import meet
from tests.reservations.conftest import ELEVEN, TEN, at


def admit(user, pool, slots=1, **kwargs):
    return services.admit(user=user, resource_class=pool.classes.get(), slots=slots, **kwargs).session


def held_by(users, pool) -> int:
    return Session.objects.active().filter(pool=pool, user__in=users).aggregate(n=Sum("slots"))["n"] or 0


def test_r_res_1_outsiders_get_only_the_shared_slots_during_the_window(qpu, alice, group_a, outsiders, reserve):
    reserve(qpu, groups=[group_a])
    with time_machine.travel(at(10, 5), tick=False):
        admit(outsiders[0], qpu)
        with pytest.raises(services.CapacityExceeded) as refused:
            admit(outsiders[1], qpu)
        assert refused.value.extra["slots_available"] == 0
        assert "reserved for others" in str(refused.value)
        # The holder takes the reserved slot, counted on the window.
        session = admit(alice, qpu)
        assert session.reservation_id is not None and session.reserved_slots == 1
        assert Reservation.objects.get().slots_used == 1


def test_r_res_1_holders_use_their_reserved_slots_first_then_the_shared_ones(qpu, alice, group_a, outsiders, reserve):
    reserve(qpu, groups=[group_a])
    with time_machine.travel(at(10, 5), tick=False):
        first, second = admit(alice, qpu), admit(alice, qpu)
        assert (first.reserved_slots, second.reserved_slots) == (1, 0)
        with pytest.raises(services.CapacityExceeded):
            admit(outsiders[0], qpu)
        services.release(user=alice, session_id=first.pk)
        assert Reservation.objects.get().slots_used == 0
        # Alice's second session holds a shared slot: the reserved one is free for holders only.
        with pytest.raises(services.CapacityExceeded):
            admit(outsiders[0], qpu)
        assert admit(alice, qpu).reserved_slots == 1


def test_r_res_1_before_and_after_the_window_everyone_shares_every_slot(qpu, group_a, outsiders, reserve):
    reserve(qpu, groups=[group_a])
    with time_machine.travel(at(9, 0), tick=False):
        admit(outsiders[0], qpu, slots=2)
        services.revoke(session_ids=[s.pk for s in Session.objects.active()])
    with time_machine.travel(at(11, 0), tick=False):
        assert admit(outsiders[1], qpu, slots=2).reserved_slots == 0


def test_r_res_1_a_holder_gets_a_slot_at_the_start_though_outsiders_filled_both_before(
    qpu, alice, group_a, outsiders, reserve
):
    """Outsiders filled both slots at 09:55; the tick at 10:00 revokes the newest (reason
    reservation) and the holder is admitted. The older outsider keeps the shared slot."""
    reserve(qpu, groups=[group_a])
    with time_machine.travel(at(9, 55), tick=False) as clock:
        older = admit(outsiders[0], qpu)
        clock.shift(1)
        newer = admit(outsiders[1], qpu)
        assert passes.start_windows() == {}  # nothing starts before 10:00
    with time_machine.travel(at(10, 0, 1), tick=False):
        assert passes.start_windows() == {qpu.pk: True}
        newer.refresh_from_db()
        older.refresh_from_db()
        assert (newer.status, newer.revocation_reason) == ("revoked", RevocationReason.RESERVATION)
        assert older.is_active
        assert admit(alice, qpu).reserved_slots == 1
        assert passes.start_windows() == {}  # once per window


def test_r_res_1_a_holder_asking_before_the_tick_makes_room_at_once(qpu, alice, group_a, outsiders, reserve):
    reserve(qpu, groups=[group_a])
    with time_machine.travel(at(9, 55), tick=False):
        admit(outsiders[0], qpu)
        admit(outsiders[1], qpu)
    with time_machine.travel(at(10, 0, 0), tick=False):
        assert admit(alice, qpu).reserved_slots == 1
        assert Session.objects.filter(revocation_reason=RevocationReason.RESERVATION).count() == 1


def test_r_res_1_a_holders_earlier_session_takes_its_reserved_slot_at_the_start(
    qpu, alice, group_a, outsiders, reserve
):
    """Alice held a slot since 09:45: at 10:00 it counts as hers of the reservation, so the
    outsider keeps the other slot (nobody is revoked) and the window is full."""
    reserve(qpu, groups=[group_a])
    with time_machine.travel(at(9, 45), tick=False):  # within the hour the sessions stay idle
        mine = admit(alice, qpu)
        theirs = admit(outsiders[0], qpu)
    with time_machine.travel(at(10, 0, 1), tick=False):
        passes.start_windows()
        mine.refresh_from_db()
        theirs.refresh_from_db()
        assert theirs.is_active and mine.reserved_slots == 1
        assert Reservation.objects.get().slots_used == 1
    with time_machine.travel(at(10, 30), tick=False):
        services.release(user=alice, session_id=mine.pk)
        assert Reservation.objects.get().slots_used == 0


def test_r_res_1_a_refusal_is_the_same_over_qrmi(qpu, alice, group_a, outsiders, reserve, settings):
    """The rule is the statement's: a QRMI acquire (a service principal opening a session for a
    user, as the SPANK plugin) is refused alike."""
    from apps.resources.models import ResourcePool
    from apps.sessions.services import UsableClass

    reserve(qpu, groups=[group_a])
    with time_machine.travel(at(10, 5), tick=False):
        admit(outsiders[0], qpu)
        with pytest.raises(services.CapacityExceeded):
            services.admit(
                user=outsiders[1],
                resource_class=UsableClass(pool_name=ResourcePool.objects.get().name),
                external_id="77",
            )


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_r_res_1_concurrent_admissions_never_give_outsiders_more_than_the_shared_slots(
    qpu, alice, group_a, outsiders, reserve, django_user_model
):
    """2 slots, 1 reserved for group A from 10:00 to 11:00: 32 threads of outsiders and holders
    admit and release at once inside the window on PostgreSQL; outsiders never hold more than
    1 slot, the pool never more than 2, and the window's counter equals its holders' part."""
    reserve(qpu, groups=[group_a])
    holders = [alice] + [django_user_model.objects.create_user(f"a{i}", password="pw") for i in range(3)]
    for user in holders[1:]:
        user.groups.add(group_a)
    people = outsiders + holders
    peak = {"outsiders": 0, "total": 0}
    lock = threading.Lock()
    barrier = threading.Barrier(32)

    def attempt(i):
        user = people[i % len(people)]
        meet(barrier)
        try:
            for _ in range(3):
                try:
                    session = admit(user, qpu)
                except services.CapacityExceeded:
                    continue
                with lock:
                    peak["outsiders"] = max(peak["outsiders"], held_by(outsiders, qpu))
                    peak["total"] = max(peak["total"], held_by(people, qpu))
                services.release(user=user, session_id=session.pk)
        finally:
            connection.close()

    with time_machine.travel(at(10, 10), tick=False), ThreadPoolExecutor(max_workers=32) as executor:
        list(executor.map(attempt, range(32)))
    assert peak["outsiders"] <= 1 and peak["total"] <= 2
    assert Reservation.objects.get().slots_used == 0
    assert Session.objects.active().count() == 0
    # And while the holders hold nothing, the outsiders' bound held at every admission (the
    # statement's rule), which the counters confirm from the sessions themselves:
    assert not Session.objects.filter(pool=qpu, user__in=outsiders, slots__gt=1).exists()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_r_res_1_concurrent_outsiders_inside_the_window_fill_only_the_shared_slot(qpu, group_a, outsiders, reserve):
    reserve(qpu, groups=[group_a])
    barrier = threading.Barrier(16)

    def attempt(i):
        meet(barrier)
        try:
            admit(outsiders[i % len(outsiders)], qpu, external_id=str(i))
            return "admitted"
        except services.CapacityExceeded:
            return "full"
        finally:
            connection.close()

    with time_machine.travel(at(10, 30), tick=False), ThreadPoolExecutor(max_workers=16) as executor:
        outcomes = list(executor.map(attempt, range(16)))
    assert outcomes.count("admitted") == 1
    assert held_by(outsiders, qpu) == 1


def test_r_res_1_window_constants_are_the_issues_example():
    assert (TEN.hour, ELEVEN.hour) == (10, 11)


def test_r_res_1_sessions_in_the_way_are_told_beforehand_on_the_session(api, qpu, alice, group_a, outsiders, reserve):
    """At 09:30 both slots are held by outsiders; the 10:00 reservation will revoke the newer:
    its session says so (``revocation_notice``), the older's does not, nor the holder's."""
    reserve(qpu, groups=[group_a], title="Hybrid run")
    with time_machine.travel(at(9, 30), tick=False) as clock:  # within the hour they stay idle
        older = admit(outsiders[0], qpu)
        clock.shift(1)
        newer = admit(outsiders[1], qpu)
        told = api(outsiders[1]).get(f"/api/v1/sessions/{newer.pk}/").json()["revocation_notice"]
        assert told["reason"] == "reservation" and told["title"] == "Hybrid run"
        assert told["at"].startswith("2030-03-04T10:00")
        assert api(outsiders[0]).get(f"/api/v1/sessions/{older.pk}/").json()["revocation_notice"] is None
    with time_machine.travel(at(10, 0, 1), tick=False):
        passes.start_windows()
        newer.refresh_from_db()
        assert newer.revocation_reason == RevocationReason.RESERVATION
        assert api(outsiders[0]).get(f"/api/v1/sessions/{older.pk}/").json()["revocation_notice"] is None


def test_r_res_1_a_reservations_counter_written_around_the_statements_is_repaired_by_the_sweep(
    qpu, alice, group_a, reserve
):
    reserve(qpu, groups=[group_a])
    with time_machine.travel(at(10, 5), tick=False):
        admit(alice, qpu)
        Reservation.objects.update(slots_used=0)  # a raw write, a restored backup
        assert services.recount_usage() == [f"reservation {Reservation.objects.get().pk}"]
        assert Reservation.objects.get().slots_used == 1
        assert services.recount_usage() == []


@pytest.mark.django_db(transaction=True)
def test_r_res_1_an_acquire_during_a_reservation_costs_the_same_statements(
    qpu, alice, group_a, outsiders, reserve, statement_budget
):
    """SPEC §9's budget holds inside a window: the calendar is read, locked and counted within the
    admission's one statement (token lookup, class lookup, the insert-if-it-fits on PostgreSQL).
    SQLite's holder pays one statement more (its reservation's counter, after the insert)."""
    from rest_framework.test import APIClient

    from tests.conftest import used_token_key

    reserve(qpu, groups=[group_a])
    klass = qpu.classes.get()
    with time_machine.travel(at(10, 5), tick=True):
        for user, sqlite in ((alice, 5), (outsiders[0], 4)):  # a holder (its reserved slot), an outsider
            client = APIClient(HTTP_AUTHORIZATION=f"Token {used_token_key(user)}")
            with statement_budget(3 if connection.vendor == "postgresql" else sqlite):
                response = client.post("/api/v1/sessions/", {"resource_class": klass.pk}, format="json")
            assert response.status_code == 201, response.content
    assert Reservation.objects.get().slots_used == 1


def test_r_res_1_a_session_past_its_lifetime_at_the_start_ends_and_a_live_one_is_not_revoked_for_it(
    api, qpu, alice, group_a, outsiders, reserve
):
    """Outsiders hold both slots; the older outsider's session reaches its lifetime at 10:00, when
    the reservation starts. Its notice said the newer session was not in the way (the older one
    ends first), but a window's start ran before the expiry sweep: it counted the session past its
    lifetime as holding a slot and revoked the newer, live one for it."""
    reserve(qpu, groups=[group_a], title="Hybrid run")
    qpu.max_lifetime = 3600
    qpu.save()
    with time_machine.travel(at(9, 0), tick=False) as clock:
        older = admit(outsiders[0], qpu)  # expires at 10:00
        qpu.max_lifetime = 4 * 3600
        qpu.save()
        clock.shift(60)
        newer = admit(outsiders[1], qpu)
        assert api(outsiders[1]).get(f"/api/v1/sessions/{newer.pk}/").json()["revocation_notice"] is None
    with time_machine.travel(at(10, 0, 1), tick=False):  # no expiry sweep has run since 09:01
        assert passes.start_windows() == {qpu.pk: True}
        older.refresh_from_db()
        newer.refresh_from_db()
        assert (older.status, older.revocation_reason) == ("revoked", RevocationReason.MAX_LIFETIME)
        assert newer.is_active
        assert admit(alice, qpu).reserved_slots == 1


def test_r_res_1_a_started_window_that_staff_change_makes_room_again_at_the_next_tick(
    api, operator, qpu, alice, group_a, outsiders, reserve
):
    """The window started at 10:00 held by out7 alone: alice's session (since 09:45) kept a
    shared slot. Staff add group A as holders at 10:10: at the next tick her session takes its
    part of the window, so the shared slot is free for an outsider. Staff raise the window to
    both slots at 10:20: at the next tick the outsider's session is revoked for it."""
    window = reserve(qpu, users=[outsiders[7]], title="Hybrid run")
    url = f"/api/v1/reservations/{window.pk}/"
    with time_machine.travel(at(9, 45), tick=False):
        mine = admit(alice, qpu)
    with time_machine.travel(at(10, 0, 1), tick=False):
        passes.start_windows()
        mine.refresh_from_db()
        assert mine.reserved_slots == 0
    with time_machine.travel(at(10, 10), tick=False) as clock:
        assert api(operator).patch(url, {"groups": ["group-a"]}, format="json").status_code == 200
        clock.shift(1)
        assert passes.start_windows() == {qpu.pk: True}
        mine.refresh_from_db()
        assert mine.reserved_slots == 1
        theirs = admit(outsiders[0], qpu)
    with time_machine.travel(at(10, 20), tick=False) as clock:
        assert api(operator).patch(url, {"slots": 2}, format="json").status_code == 200
        clock.shift(1)
        assert passes.start_windows() == {qpu.pk: True}
        theirs.refresh_from_db()
        assert (theirs.status, theirs.revocation_reason) == ("revoked", RevocationReason.RESERVATION)
        assert admit(alice, qpu).reserved_slots == 1


def test_r_res_1_a_holder_takes_the_reserved_slot_and_a_shared_one_in_one_session(
    qpu, alice, group_a, outsiders, reserve
):
    reserve(qpu, groups=[group_a])
    with time_machine.travel(at(10, 5), tick=False):
        both = admit(alice, qpu, slots=2)
        assert (both.slots, both.reserved_slots) == (2, 1)
        assert Reservation.objects.get().slots_used == 1
        with pytest.raises(services.CapacityExceeded):
            admit(outsiders[0], qpu)


def test_r_res_1_a_cancelled_reservation_keeps_no_slot_from_others(api, operator, qpu, group_a, outsiders, reserve):
    window = reserve(qpu, groups=[group_a])
    assert api(operator).delete(f"/api/v1/reservations/{window.pk}/").status_code == 204
    with time_machine.travel(at(10, 5), tick=False):
        assert [admit(outsider, qpu).reserved_slots for outsider in outsiders[:2]] == [0, 0]


@pytest.fixture
def two_windows(qpu, alice, group_a, outsiders, reserve):
    """Three slots; from 10:00 'Course' holds one for group A and 'Own' one for ``holder``; an
    outsider (09:40) and alice twice (09:45, 09:50) hold the three slots before."""

    def make(holder):
        qpu.slots_total = 3
        qpu.save()
        course = reserve(qpu, groups=[group_a], title="Course")
        own = reserve(qpu, users=[holder], title="Own")
        sessions = []
        with time_machine.travel(at(9, 40), tick=False) as clock:
            for user in (outsiders[0], alice, alice):
                sessions.append(admit(user, qpu))
                clock.shift(5 * 60)
        return course, own, sessions

    return make


def test_r_res_1_a_holder_of_two_open_reservations_takes_the_one_with_room(two_windows, qpu, alice):
    """Alice holds both windows: at 10:00 her sessions take one slot of each, so the outsider's
    session fits the one shared slot and stays; her session opened later, once she released
    one, takes the window that has room, not the full one."""
    course, own, (theirs, first, second) = two_windows(alice)
    with time_machine.travel(at(10, 0, 1), tick=False):
        passes.start_windows()
        for session in (theirs, first, second):
            session.refresh_from_db()
        assert theirs.is_active
        assert {(first.reservation_id, first.reserved_slots), (second.reservation_id, second.reserved_slots)} == {
            (course.pk, 1),
            (own.pk, 1),
        }
    with time_machine.travel(at(10, 30), tick=False):
        services.release(user=alice, session_id=second.pk)
        again = admit(alice, qpu)
        assert (again.reservation_id, again.reserved_slots) == (second.reservation_id, 1)


def test_r_res_1_the_start_revokes_sessions_of_people_holding_no_open_reservation_first(two_windows, alice, outsiders):
    """'Own' is out7's: at 10:00 alice's second session has no reserved slot left and one session
    too many holds the shared slots. The outsider's goes, older as it is: alice holds a window."""
    _course, _own, (theirs, first, second) = two_windows(outsiders[7])
    with time_machine.travel(at(10, 0, 1), tick=False):
        passes.start_windows()
        for session in (theirs, first, second):
            session.refresh_from_db()
        assert (theirs.status, theirs.revocation_reason) == ("revoked", RevocationReason.RESERVATION)
        assert first.is_active and second.is_active


def test_r_res_1_a_window_that_ended_counts_for_nothing_at_the_next_ones_start(qpu, alice, group_a, outsiders, reserve):
    """Alice keeps her session of 'Course' (10-11, two of three slots) past its end; at 11:00
    'Next' (one slot, out7's) starts: only its slot is held then, so the outsider admitted at
    10:30 still fits the shared slots and is not revoked."""
    qpu.slots_total = 3
    qpu.save()
    reserve(qpu, groups=[group_a], slots=2, title="Course")
    reserve(qpu, users=[outsiders[7]], start=ELEVEN, end=at(12), title="Next")
    with time_machine.travel(at(10, 5), tick=False) as clock:
        assert admit(alice, qpu).reserved_slots == 1
        clock.move_to(at(10, 30))
        theirs = admit(outsiders[0], qpu)
    with time_machine.travel(at(11, 0, 1), tick=False):
        passes.start_windows()
        theirs.refresh_from_db()
        assert theirs.is_active
