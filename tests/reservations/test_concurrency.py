"""R-RES-1 under concurrency: two reservations saved at the same moment never overbook a pool
(the pool's calendar lock is taken before the overbooking check and held until the save commits)."""

from concurrent.futures import ThreadPoolExecutor

import pytest
from django.core.exceptions import ValidationError
from django.db import connection

from apps.reservations.models import Reservation, WindowKind
from apps.reservations.services import save_reservation
from tests import factories
from tests.concurrency import held_together
from tests.reservations.conftest import ELEVEN, TEN

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_two_overlapping_reservations_saved_at_once_never_overbook_the_pool(monkeypatch):
    """Each request checks the pool's free slots, then saves: with the calendar lock removed both
    checks pass before either save (4 slots reserved of 2); with it the second waits for the first
    to commit."""
    pool = factories.pool("fresnel", slots_total=2)
    user = factories.user("alice")
    held_together(monkeypatch, Reservation, "clean_overbooking", after=True)

    def reserve(i):
        window = Reservation(pool=pool, kind=WindowKind.RESERVATION, start=TEN, end=ELEVEN, slots=2, title=f"R{i}")
        try:
            save_reservation(window, users=[user])
            return "saved"
        except ValidationError:
            return "refused"
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=2) as executor:
        outcomes = list(executor.map(reserve, range(2)))
    assert sorted(outcomes) == ["refused", "saved"]
    assert Reservation.objects.live().count() == 1
