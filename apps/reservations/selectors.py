"""What the calendar says, read where it is needed (R-RES-1, R-RES-2): nothing derived from a
window is written on a timer. The dispatcher, the pending codes and the pool's status (QRMI
``status()``, the Slurm licence) read :func:`now_for`; admission reads the open reservations in
its own statement (``apps.sessions.statements``)."""

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from django.contrib.auth import get_user_model
from django.db.models import Q

from apps.reservations.models import Reservation, WindowKind


def holders_of(windows) -> dict[int, set[int]]:
    """{reservation id: the ids of its holders, its users and its groups' members} (two queries)."""
    ids = [window.pk for window in windows]
    out: dict[int, set[int]] = {pk: set() for pk in ids}
    if not ids:
        return out
    for window_id, user_id in Reservation.users.through.objects.filter(reservation_id__in=ids).values_list(
        "reservation_id", "user_id"
    ):
        out[window_id].add(user_id)
    members = (
        get_user_model()
        .groups.through.objects.filter(
            group_id__in=Reservation.groups.through.objects.filter(reservation_id__in=ids).values("group_id")
        )
        .values_list("group_id", "user_id")
    )
    by_group = defaultdict(set)
    for group_id, user_id in members:
        by_group[group_id].add(user_id)
    for window_id, group_id in Reservation.groups.through.objects.filter(reservation_id__in=ids).values_list(
        "reservation_id", "group_id"
    ):
        out[window_id] |= by_group[group_id]
    return out


def lock_open_reservations(pool_id: int, at: datetime, *, also=()) -> list[Reservation]:
    """The pool's reservations open at ``at``, their rows locked until the transaction ends (with
    the windows ``also`` names, whose counters the caller may change), by id: lock order as
    admission's statement."""
    held = Q(pool_id=pool_id, kind=WindowKind.RESERVATION, cancelled_at__isnull=True, start__lte=at, end__gt=at)
    rows = list(Reservation.objects.filter(held | Q(pk__in=list(also))).select_for_update().order_by("id"))
    return [row for row in rows if row.pool_id == pool_id and row.kind == WindowKind.RESERVATION and row.holds_at(at)]


def mark_started(window_ids, at: datetime) -> None:
    Reservation.objects.filter(pk__in=list(window_ids), started_at__isnull=True).update(started_at=at)


def to_start(at: datetime) -> list[int]:
    """Pools with a reservation open at ``at`` that has not made room for its holders yet (the
    tick's work list). Every other window that has begun is marked as passed (a maintenance
    window, one that ended before a tick saw it), so that ``reservations_to_start`` holds only
    windows still to come or to start."""
    begun = list(
        Reservation.objects.filter(cancelled_at__isnull=True, started_at__isnull=True, start__lte=at).values_list(
            "pk", "pool_id", "kind", "end"
        )
    )
    due = {pool_id for _, pool_id, kind, end in begun if kind == WindowKind.RESERVATION and end > at}
    passed = [pk for pk, pool_id, kind, end in begun if not (kind == WindowKind.RESERVATION and end > at)]
    if passed:
        mark_started(passed, at)
    return sorted(due)


def any_to_start(pool_id: int, at: datetime) -> bool:
    """Whether a reservation of the pool is open at ``at`` and has not made room yet (a refused
    admission's probe, through ``reservations_to_start``)."""
    return Reservation.objects.filter(
        pool_id=pool_id,
        kind=WindowKind.RESERVATION,
        cancelled_at__isnull=True,
        started_at__isnull=True,
        start__lte=at,
        end__gt=at,
    ).exists()


@dataclass(frozen=True)
class Reserved:
    """An open reservation as the dispatcher sees it: the device it covers (None: every device of
    the pool) and its holders."""

    device_id: int | None
    holders: frozenset
    title: str


@dataclass(frozen=True)
class Window:
    """A live window of the calendar as the ETA sees it: what it blocks and when."""

    device_id: int | None  # None: every device of the pool
    kind: str
    start: datetime
    end: datetime
    holders: frozenset  # a reservation's; empty for maintenance


@dataclass(frozen=True)
class CalendarNow:
    """What the calendar says of one pool at one instant: the pool's maintenance (its title, ''
    when none), its devices' ({device id: title}), its open reservations; with ``ahead``, every
    live window from now to that far ahead (``upcoming``, the open ones included)."""

    maintenance: str = ""
    device_maintenance: dict = field(default_factory=dict)
    reserved: tuple = ()
    upcoming: tuple = ()

    def paused(self, device_id: int) -> str:
        """The maintenance title that pauses this device now, or ''."""
        return self.maintenance or self.device_maintenance.get(device_id, "")

    def reserved_on(self, device_ids) -> list[Reserved]:
        """The open reservations that cover one of ``device_ids``."""
        ids = set(device_ids)
        return [r for r in self.reserved if r.device_id is None or r.device_id in ids]

    def first_on(self, devices) -> list[tuple[list, frozenset]]:
        """R-RES-1 on the dispatcher: for each open reservation covering some of ``devices`` (the
        free ones), those devices and the holders whose jobs go first on them."""
        out = []
        for r in self.reserved:
            covered = [d for d in devices if r.device_id is None or d.pk == r.device_id]
            if covered:
                out.append((covered, r.holders))
        return out


NOTHING = CalendarNow()


def now_for(pool_ids, at: datetime, ahead=None) -> dict[int, CalendarNow]:
    """{pool id: CalendarNow} at ``at`` for ``pool_ids`` (pools without a window get
    ``NOTHING``): one query, and two more when a reservation is read. With ``ahead`` (a
    timedelta), the same query also reads the windows that start until ``at + ahead``
    (``CalendarNow.upcoming``, for the ETA)."""
    pool_ids = list(pool_ids)
    windows = list(
        Reservation.objects.filter(
            pool_id__in=pool_ids, cancelled_at__isnull=True, start__lte=at + ahead if ahead else at, end__gt=at
        )
        .only("pool_id", "device_id", "kind", "title", "start", "end", "cancelled_at")
        .order_by("start", "id")
    )
    if not windows:
        return dict.fromkeys(pool_ids, NOTHING)
    holders = holders_of([w for w in windows if w.kind == WindowKind.RESERVATION])
    maintenance: dict[int, str] = {}
    devices: dict[int, dict] = defaultdict(dict)
    reserved: dict[int, list] = defaultdict(list)
    upcoming: dict[int, list] = defaultdict(list)
    for window in windows:
        held = frozenset(holders.get(window.pk, ()))
        upcoming[window.pool_id].append(Window(window.device_id, window.kind, window.start, window.end, held))
    for window in [w for w in windows if w.start <= at]:
        if window.kind == WindowKind.MAINTENANCE:
            if window.device_id is None:
                maintenance.setdefault(window.pool_id, window.title)
            else:
                devices[window.pool_id].setdefault(window.device_id, window.title)
        else:
            reserved[window.pool_id].append(Reserved(window.device_id, frozenset(holders[window.pk]), window.title))
    return {
        pool_id: CalendarNow(
            maintenance.get(pool_id, ""),
            dict(devices.get(pool_id, {})),
            tuple(reserved[pool_id]),
            tuple(upcoming[pool_id]) if ahead else (),
        )
        if pool_id in upcoming
        else NOTHING
        for pool_id in pool_ids
    }


@dataclass(frozen=True)
class Slot:
    """A typed slot of a pool's schedule (R-RES-4)."""

    kind: str  # reservation, maintenance, open
    start: datetime
    end: datetime
    slots: int | None
    title: str
    device: int | None
    mine: bool
    reservation: int | None


def schedule(pool, user, start: datetime, end: datetime) -> list[Slot]:
    """R-RES-4: the pool's schedule over [start, end): its live windows that share an instant with
    it, as they are (``mine`` when ``user`` holds the reservation), and the open slots between
    them, when no window of the pool holds (``slots``: all of the pool's). Holders are never
    named: others see a window's title, its slots and whether it is theirs. Three queries."""
    windows = list(Reservation.objects.overlapping(start, end).filter(pool_id=pool.pk).order_by("start", "id"))
    holders = holders_of([w for w in windows if w.kind == WindowKind.RESERVATION])
    out = []
    cursor = start
    for window in windows:
        if window.start > cursor:
            out.append(Slot("open", cursor, window.start, pool.slots_total, "open", None, False, None))
        cursor = max(cursor, window.end)
        out.append(
            Slot(
                window.kind,
                window.start,
                window.end,
                window.slots if window.kind == WindowKind.RESERVATION else 0,
                window.title,
                window.device_id,
                user.pk in holders.get(window.pk, ()),
                window.pk,
            )
        )
    if cursor < end:
        out.append(Slot("open", cursor, end, pool.slots_total, "open", None, False, None))
    return sorted(out, key=lambda slot: (slot.start, slot.kind == "open", slot.reservation or 0))


NOTICE_HOURS = 24  # a session in a reservation's way is told this long before its start


def revocation_notices(sessions, at: datetime | None = None) -> dict:
    """R-RES-1's announcement: ``{session id: notice}`` for the active sessions among ``sessions``
    that the start of a reservation within ``NOTICE_HOURS`` (or open and not started yet) would
    revoke if it started now: sessions of people who do not hold it, beyond the shared slots
    left at its start, newest first (as ``apps.sessions.services.start_reservations`` chooses).
    Others' sessions ending before then, or older ones, are not in its way. One query when no
    window is near; four when one is."""
    from datetime import timedelta

    from django.utils import timezone

    at = at or timezone.now()
    active = [s for s in sessions if s.status == "active"]
    pool_ids = {s.pool_id for s in active}
    if not pool_ids:
        return {}
    windows = list(
        Reservation.objects.live()
        .filter(
            pool_id__in=pool_ids,
            kind=WindowKind.RESERVATION,
            end__gt=at,
            start__lte=at + timedelta(hours=NOTICE_HOURS),
        )
        .filter(Q(started_at__isnull=True) | Q(start__gt=at))
        .select_related("pool")
        .order_by("start", "id")
    )
    if not windows:
        return {}
    from apps.sessions.models import Session

    holders = holders_of(windows)
    everyone = defaultdict(list)
    for session in Session.objects.active().filter(pool_id__in={w.pool_id for w in windows}).order_by("created_at"):
        everyone[session.pool_id].append(session)
    notices = {}
    for window in windows:
        at_start = [w for w in windows if w.pool_id == window.pool_id and w.start <= window.start < w.end]
        alive = [s for s in everyone[window.pool_id] if s.expires_at > window.start]
        mine = [s for s in alive if s.user_id in holders[window.pk]]
        others = [s for s in alive if s.user_id not in holders[window.pk]]
        held = sum(w.slots for w in at_start)
        beyond = max(sum(s.slots for s in mine) - window.slots, 0)  # holders' slots beyond theirs
        keep = (window.pool.slots_total or 0) - held - beyond
        kept = 0
        for session in others:  # oldest first: the newest go
            kept += session.slots
            if kept > keep and session.pk not in notices:
                notices[session.pk] = {
                    "reason": "reservation",
                    "at": window.start,
                    "until": window.end,
                    "title": window.title,
                    "message": (
                        f"Pool '{window.pool.name}' is reserved for others from {window.start:%Y-%m-%d %H:%M} UTC "
                        f"({window.title}): this session is revoked then (reason 'reservation') unless older "
                        "sessions of others end first. Release it, or open it again after the window."
                    ),
                }
    return {pk: notice for pk, notice in notices.items() if pk in {s.pk for s in active}}
