"""The calendar's one timed step: a reservation's start (R-RES-1), within one tick."""

from django.utils import timezone

from apps.reservations import selectors
from apps.sessions import services as sessions


def start_windows() -> dict:
    """Make room for the holders of every reservation that opened since the last tick
    (``apps.sessions.services.start_reservations``); nothing when none did (one index probe)."""
    now = timezone.now()
    return {pool_id: sessions.start_reservations(pool_id=pool_id, now=now) for pool_id in selectors.to_start(now)}
