"""Creating, changing and cancelling windows (R-RES-1): the rule that depends on other rows
(never overbooking a pool) runs under the pool's calendar lock; the admin and the API call these."""

from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.utils import timezone

from apps.reservations.models import Reservation, WindowKind

#: what a change to makes a started reservation make room again at the next tick
_HOLDS = ("start", "end", "slots", "kind", "pool_id", "device_id", "cancelled_at")


def lock_calendar(pool_id: int) -> None:
    """Serialize the calendar edits of one pool (PostgreSQL: a transaction-scoped advisory lock,
    which no admission or submission takes; SQLite's IMMEDIATE transactions serialize anyway)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext('gridgate.calendar'), %s)", [pool_id])


def check_pool_slots(pool) -> None:
    """R-RES-1 from the pool's side: its ``slots_total`` is never lowered below what its
    reservations hold together at one instant from now on. Checked under the calendar lock, so a
    reservation saved meanwhile is counted here, or checked against the new total."""
    lock_calendar(pool.pk)
    peak, at, names = Reservation.objects.filter(pool_id=pool.pk).peak(timezone.now())
    if peak > pool.slots_total:
        raise ValidationError(
            {
                "slots_total": [
                    f"At {at:%Y-%m-%d %H:%M} UTC, {', '.join(repr(name) for name in names)} "
                    f"{'hold' if len(names) > 1 else 'holds'} {peak} slots of "
                    f"pool '{pool.name}': shorten or cancel them before lowering slots_total to "
                    f"{pool.slots_total} (R-RES-1)."
                ]
            }
        )


def validate_holders(kind: str, users, groups) -> None:
    """A reservation is held by someone: at least one user or group (who exist: the admin form
    and the API resolve them). A maintenance window has no holders."""
    if kind == WindowKind.RESERVATION and not users and not groups:
        raise ValidationError({"users": ["A reservation needs holders: at least one user or group."]})
    if kind == WindowKind.MAINTENANCE and (users or groups):
        raise ValidationError({"users": ["A maintenance window has no holders: it pauses the pool or device."]})


def save_reservation(reservation: Reservation, *, users=None, groups=None, actor=None) -> Reservation:
    """Create or change ``reservation`` (holders: ``users`` and ``groups`` when given) after its
    rules (``clean()``, holders, and R-RES-1's no overbooking under the pool's calendar lock)."""
    users = list(users) if users is not None else (list(reservation.users.all()) if reservation.pk else [])
    groups = list(groups) if groups is not None else (list(reservation.groups.all()) if reservation.pk else [])
    before = None
    if reservation.pk:
        before = Reservation.objects.filter(pk=reservation.pk).values(*_HOLDS).first()
    with transaction.atomic():
        lock_calendar(reservation.pool_id)
        reservation.full_clean()
        validate_holders(reservation.kind, users, groups)
        reservation.clean_overbooking()
        if reservation._state.adding and actor is not None and actor.is_authenticated:
            reservation.created_by = actor
        reservation.save()
        changed_holders = set(reservation.users.values_list("pk", flat=True)) != {u.pk for u in users} or set(
            reservation.groups.values_list("pk", flat=True)
        ) != {g.pk for g in groups}
        reservation.users.set(users)
        reservation.groups.set(groups)
        if before is not None and (changed_holders or any(before[f] != getattr(reservation, f) for f in _HOLDS)):
            # What it holds changed: its start makes room again (at the next tick, if open now).
            Reservation.objects.filter(pk=reservation.pk).update(started_at=None)
    _changed(reservation)
    return reservation


def cancel_reservation(reservation: Reservation) -> Reservation:
    """Cancel a window (kept, with ``cancelled_at``); idempotent. Its holders' sessions stay;
    what they held of it counts as shared slots from now on."""
    if reservation.cancelled_at is None:
        Reservation.objects.filter(pk=reservation.pk, cancelled_at__isnull=True).update(cancelled_at=timezone.now())
        reservation.refresh_from_db()
        _changed(reservation)
    return reservation


def _changed(reservation: Reservation) -> None:
    """Slurm mirrors the pool's calendar (R-RES-3): its licence sync runs after the commit."""
    if reservation.pool.slurm_licence:
        from apps.licences.services import request_sync

        transaction.on_commit(lambda: request_sync([reservation.pool_id]))
