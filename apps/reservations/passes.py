"""The calendar's one timed step: a reservation's start (R-RES-1), within one tick."""

from django.utils import timezone

from apps.notifications import services as notifications
from apps.notifications.models import Event
from apps.reservations import selectors
from apps.sessions import services as sessions


def start_windows() -> dict:
    """Make room for the holders of every reservation that opened since the last tick
    (``apps.sessions.services.start_reservations``); nothing when none did (one index probe)."""
    now = timezone.now()
    return {pool_id: sessions.start_reservations(pool_id=pool_id, now=now) for pool_id in selectors.to_start(now)}


def notify_started(windows, holders: dict, pool_name: str) -> None:
    """R-NOTE-1: tell the holders of ``windows`` (reservations that start now) that they started,
    in the transaction that marks them started (``sessions.start_reservations``): one statement.
    The start is part of the key: a window staff moved starts again, and is told again."""
    notifications.notify_many(
        (
            Event.RESERVATION_STARTING,
            user_id,
            f"reservation:{window.pk}:{window.start:%Y%m%dT%H%M%S}",
            {
                "summary": f"Your reservation {window.title} on {pool_name} has started",
                "reservation": {
                    "id": window.pk,
                    "title": window.title,
                    "pool": pool_name,
                    "device": window.device_id,
                    "slots": window.slots,
                    "start": window.start,
                    "end": window.end,
                },
            },
        )
        for window in windows
        for user_id in sorted(holders.get(window.pk, ()))
    )
