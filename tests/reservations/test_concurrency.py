"""R-RES-1 under concurrency: two reservations saved at the same moment never overbook a pool
(the pool's calendar lock is taken before the overbooking check and held until the save commits)."""

from concurrent.futures import ThreadPoolExecutor

import pytest
from django.core.exceptions import ValidationError
from django.db import connection

from apps.reservations.models import Reservation, ReservationQuerySet, WindowKind
from apps.reservations.services import save_reservation
from apps.resources.models import ResourcePool
from apps.resources.services import save_pool
from tests import factories
from tests.concurrency import held_together
from tests.reservations.conftest import ELEVEN, TEN

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def reserve(pool, user, *, slots, title) -> str:
    """Save a window of ``slots`` from TEN to ELEVEN for ``user`` on a thread of its own."""
    window = Reservation(pool=pool, kind=WindowKind.RESERVATION, start=TEN, end=ELEVEN, slots=slots, title=title)
    try:
        save_reservation(window, users=[user])
        return "saved"
    except ValidationError:
        return "refused"
    finally:
        connection.close()


def test_two_overlapping_reservations_saved_at_once_never_overbook_the_pool(monkeypatch):
    """Each request checks the pool's free slots, then saves: with the calendar lock removed both
    checks pass before either save (4 slots reserved of 2); with it the second waits for the first
    to commit."""
    pool = factories.pool("fresnel", slots_total=2)
    user = factories.user("alice")
    held_together(monkeypatch, Reservation, "clean_overbooking", after=True)

    with ThreadPoolExecutor(max_workers=2) as executor:
        outcomes = list(executor.map(lambda i: reserve(pool, user, slots=2, title=f"R{i}"), range(2)))
    assert sorted(outcomes) == ["refused", "saved"]
    assert Reservation.objects.live().count() == 1


def test_a_pools_slots_lowered_while_a_reservation_is_saved_never_leave_it_overbooked(monkeypatch):
    """One reservation holds 1 of 2 slots. An operator lowers the pool to 1 slot while another
    saves a second 1-slot reservation beside it: each check passes on its own (1 <= 1, 1 + 1 <= 2),
    so with the calendar lock removed from the pool's side both commit and 2 slots are reserved of
    1; with it the second sees the first's commit and is refused."""
    pool = factories.pool("fresnel", slots_total=2)
    user = factories.user("alice")
    save_reservation(
        Reservation(pool=pool, kind=WindowKind.RESERVATION, start=TEN, end=ELEVEN, slots=1, title="R0"), users=[user]
    )
    held_together(monkeypatch, ReservationQuerySet, "peak", after=True)

    def lower():
        try:
            save_pool(pool=ResourcePool.objects.get(pk=pool.pk), fields={"slots_total": 1})
            return "lowered"
        except Exception as exc:  # InvalidFields
            return type(exc).__name__
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=2) as executor:
        both = [executor.submit(lower), executor.submit(reserve, pool, user, slots=1, title="R1")]
        outcomes = [future.result() for future in both]
    assert outcomes.count("lowered") + outcomes.count("saved") == 1, outcomes
    pool.refresh_from_db()
    peak, _at, _names = Reservation.objects.filter(pool=pool).peak(TEN)
    assert peak <= pool.slots_total


def test_a_reservation_changed_while_it_is_cancelled_stays_cancelled(monkeypatch):
    """Staff change a window's title (PATCH) while another cancels it (DELETE, 204). The change
    read the window live and saves it after the cancel committed: with a full save it writes back
    the ``cancelled_at`` it read (none), and the cancelled window holds its slots again."""
    import threading

    from django.contrib.auth.models import Permission

    from apps.reservations.api import serializers
    from tests.conftest import client_for

    pool = factories.pool("fresnel", slots_total=2)
    user = factories.user("alice")
    operator = factories.user("operator", is_staff=True)
    operator.user_permissions.set(Permission.objects.filter(content_type__app_label="reservations"))
    window = save_reservation(
        Reservation(pool=pool, kind=WindowKind.RESERVATION, start=TEN, end=ELEVEN, slots=2, title="Run"), users=[user]
    )
    url = f"/api/v1/reservations/{window.pk}/"
    read, cancelled = threading.Event(), threading.Event()
    original = serializers.save_reservation

    def save(reservation, **kwargs):
        read.set()  # the change read the window and validated the request
        cancelled.wait(30)
        return original(reservation, **kwargs)

    monkeypatch.setattr(serializers, "save_reservation", save)
    answers = {}

    def change():
        try:
            answers["patch"] = client_for(operator).patch(url, {"title": "Course"}, format="json").status_code
        finally:
            connection.close()

    def cancel():
        try:
            assert read.wait(30)
            answers["delete"] = client_for(operator).delete(url).status_code
        finally:
            cancelled.set()
            connection.close()

    threads = [threading.Thread(target=change), threading.Thread(target=cancel)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert answers["delete"] == 204
    window.refresh_from_db()
    assert window.cancelled_at is not None  # the cancel that answered 204 holds
    assert not Reservation.objects.live().filter(pk=window.pk).exists()
