"""Admission, release, revocation and expiry of sessions (SPEC §4).

Each operation is one statement of ``apps.sessions.statements`` on its common path: admission
inserts the session if it fits, revocation ends sessions and gives back what they held. What
runs after a refusal or a miss only explains it, or first expires what is due (R-SESS-3).
"""

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from apps.allocations.services import choose_for_session
from apps.core.exceptions import Conflict, Forbidden, NotFound
from apps.core.retry import retry_aborted
from apps.resources.launch import launch_spec
from apps.resources.models import ResourceClass, ResourcePool, fmt
from apps.sessions import statements
from apps.sessions.hooks import batch_capacity_changed, busy_q, sessions_revoked
from apps.sessions.models import RevocationReason, Session, SessionStatus, is_service_principal

log = logging.getLogger(__name__)


class CapacityExceeded(Conflict):
    """R-SESS-1: the request does not fit (``slots_available``, ``quota_exceeded``)."""


class SessionConflict(Conflict):
    """R-SESS-2: the same scheduler job already holds a session with other parameters."""


class NoSuchClass(NotFound):
    """The class to admit on does not exist or is not one the user may use."""


@dataclass(frozen=True)
class Admission:
    session: Session
    created: bool


@dataclass(frozen=True)
class UsableClass:
    """A class among those ``user`` may use (R-POOL-8), chosen by id (REST) or as the default
    class of the pool named ``pool_name`` (QRMI). The access check is part of admission's
    class lookup."""

    pk: int | None = None
    pool_name: str | None = None


def admit(
    *, user, resource_class: ResourceClass | UsableClass, slots: int = 1, external_id: str = "", allocation=None
) -> Admission:
    """Open a session if it fits (201), or return the active one of the same scheduler job (200).

    ``resource_class``: a class the caller already checked ``user`` may use, or a
    :class:`UsableClass`, checked here (NoSuchClass when it selects nothing).

    (1) Look the class and its pool up, with the id of ``user``'s active session on that pool
    for ``external_id`` (R-SESS-2). (2) Insert the session if it fits, counting it in its pool's
    usage (R-SESS-1: serialized on the pool's usage row, never on the pool's own row, which job
    submissions read as the pool's configuration: R-SESS-7). A refusal first makes room if it
    can (expires the pool's sessions that are due, R-SESS-3, or gives a pool made without one its
    usage row) and tries once more, then answers 409 with what is left. A concurrent identical
    request that won meanwhile is caught by the partial unique constraint (IntegrityError), and
    its session returned.
    """
    if not user.is_active:  # a service principal acting for an account that was closed
        raise Forbidden(f"User '{user.get_username()}' is deactivated: no session is opened in their name.")
    external_id = (external_id or "").strip()
    now = timezone.now()  # the request time: lifetimes count from here
    if isinstance(resource_class, ResourceClass):
        class_id, pool_name, check_access = resource_class.pk, None, False
    else:
        class_id, pool_name, check_access = resource_class.pk, resource_class.pool_name, True
        if class_id is not None and not 0 < class_id < 2**63:  # SQLite cannot even bind a larger int
            raise NoSuchClass("No such class that you can use.")
    found = statements.usable_class(
        user, class_id=class_id, pool_name=pool_name, check_access=check_access, external_id=external_id
    )
    if found is None:
        raise NoSuchClass("No such class that you can use.")
    chosen, same_job, allocation_id = found
    if same_job is not None:
        same = _unless_due(Session.objects.filter(pk=same_job).first(), now)
        if same is not None:
            return Admission(_same_or_conflict(same, chosen.pk, slots), False)
    session = _new_session(user, chosen, slots, external_id, now)
    # R-ALLOC-1: the allocation its jobs spend, chosen now: the one named (one of the user's on
    # this pool, else 404) or the user's default, read with the class; none: not limited.
    if allocation is not None:
        allocation_id = choose_for_session(user=user, pool_id=chosen.pool_id, allocation_id=allocation, now=now).pk
    session.allocation_id = allocation_id
    try:
        if statements.insert_if_it_fits(session, now) or (
            _made_room(chosen.pool_id, now) and statements.insert_if_it_fits(session, now)
        ):
            if chosen.pool.slurm_licence and not external_id:
                batch_capacity_changed.send(sender=Session, pool_ids=[chosen.pool_id])
            return Admission(session, True)
    except IntegrityError:
        same = _existing(user, chosen.pool_id, external_id) if external_id else None
        if same is None:
            raise
        return Admission(_same_or_conflict(same, chosen.pk, slots), False)
    raise _refusal(session, now)


def _new_session(user, resource_class: ResourceClass, slots: int, external_id: str, now: datetime) -> Session:
    pool = resource_class.pool
    return Session(
        user=user,
        resource_class=resource_class,
        pool=pool,
        slots=slots,
        cpu=resource_class.cpu,
        memory=resource_class.memory,
        gpu=resource_class.gpu,
        external_id=external_id,
        launch_spec=launch_spec(resource_class),
        created_at=now,
        last_activity_at=now,
        expires_at=now + timedelta(seconds=pool.max_lifetime),
        idle_expires_at=now + timedelta(seconds=pool.idle_timeout),
    )


def _existing(user, pool_id: int, external_id: str) -> Session | None:
    """The active session of ``user``'s scheduler job on the pool, as it is now."""
    found = statements.same_job(user.pk, pool_id, external_id)
    return None if found is None else Session.objects.filter(pk=found).first()


def _unless_due(same: Session | None, now: datetime) -> Session | None:
    """The session of a scheduler job found active, unless it ended since or is due for expiry:
    a due session is expired first and never handed out again (R-SESS-3)."""
    if same is None or not same.is_active:
        return None
    if min(same.expires_at, same.idle_expires_at) <= now:
        expire_due_sessions(now=now, pool_id=same.pool_id)
        return _existing(same.user, same.pool_id, same.external_id)
    return same


def _same_or_conflict(same: Session, class_id: int, slots: int) -> Session:
    if same.slots != slots or same.resource_class_id != class_id:
        raise SessionConflict(
            f"An active session ({same.id}) already exists for external id '{same.external_id}' with "
            f"different parameters (slots {same.slots}, class {same.resource_class_id}).",
            session=str(same.id),
        )
    return same


def _made_room(pool_id: int, now: datetime) -> bool:
    """After a refusal: whether anything changed that may let the session in now. The pool had no
    usage row (made here), or sessions of it were due and are expired now (R-SESS-3; the probe
    first: an active session past one of its deadlines, the idle one may still be busy), or a
    reservation that started since the last tick made room for its holders now (R-RES-1: a holder
    asking at its first second need not wait for the tick)."""
    if statements.ensure_usage(pool_id):
        return True
    if statements.any_due(pool_id, now) and any(expire_due_sessions(now=now, pool_id=pool_id).values()):
        return True
    from apps.reservations import selectors as calendar

    return calendar.any_to_start(pool_id, now) and start_reservations(pool_id=pool_id, now=now)


def _refusal(session: Session, now: datetime) -> CapacityExceeded:
    """R-SESS-1's 409: what does not fit, and ``slots_available`` (null when the pool counts no
    slots), from the pool's usage as it is now: during a reservation, what this user may still
    take (R-RES-1: its holders' free reserved slots are not available to others)."""
    room = statements.room(session, now)
    total, used, reserved = room["slots_total"], room["used"], room["reserved"]
    available = None
    if total is not None:
        shared_free = total - reserved["held"] - (used["slots"] - reserved["taken"])
        available = max(min(total - used["slots"], reserved["part"] + max(shared_free, 0)), 0)
    if "slots" in room["full"]:
        held = reserved["held"]
        why = f" ({held} of them reserved for others now, R-RES-1)" if held and not reserved["part"] else ""
        return CapacityExceeded(
            f"Pool '{room['pool']}' has {available} of {total} slots available{why}; {session.slots} requested.",
            slots_available=available,
        )
    over = [
        f"{dimension} {fmt(used[dimension])} used + {fmt(getattr(session, dimension))} > quota "
        f"{fmt(room['quota'][dimension] or 0)}"
        for dimension in room["full"]
    ]
    if not over:  # room was made since the refusal: the client may simply try again
        over = ["capacity changed while this request was refused"]
    return CapacityExceeded(
        f"Pool '{room['pool']}' quota would be exceeded: {'; '.join(over)}.",
        quota_exceeded=over,
        slots_available=available,
    )


# -- ending sessions ------------------------------------------------------------------------
def _end(session_ids, reason: str, now: datetime, **only) -> list[Session]:
    """The revocation statement (run again if the database aborts it), then its announcement
    (:func:`_announce`). ``only``: ``user_id`` and ``pool_name`` restrict it (``end_sessions``).
    Returns the sessions this call ended, as they are now.

    Outside a caller's transaction the statement commits on its own, so the pool's usage row is
    locked for the statement only, never while the announcement's statements go back and forth
    (every admission and release of the pool queues on that row).
    """
    ended = retry_aborted(lambda: statements.end_sessions(session_ids, reason, now, **only))
    _announce(ended, reason)
    return [end.session for end in ended]


def _announce(ended: list, reason: str) -> None:
    """Tell the other apps what a revocation statement ended: the scheduling app cancels the
    ended sessions' jobs, the licences app syncs a licence. After the statement committed: a job
    submitted meanwhile is in the announcement's reach, since a submission's statement needs the
    session active, so it either committed before (and the announcement cancels its job) or
    stores nothing. Should the process die between the two, the dispatcher never starts a job of
    an ended session and the scheduling app's repair cancels what is left within a minute
    (``apps.scheduling.services.cancel_jobs_of_ended_sessions``)."""
    if not ended:
        return
    log.info("revoked %d session(s): %s", len(ended), reason)
    sessions_revoked.send(sender=Session, session_ids=[end.session.id for end in ended], reason=reason)
    licensed = {end.session.pool_id for end in ended if end.slurm_licence and not end.session.external_id}
    if licensed:
        batch_capacity_changed.send(sender=Session, pool_ids=sorted(licensed))


def _session_id(value) -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise NotFound("No such session.") from None


@dataclass(frozen=True)
class Released:
    """What :func:`release` did: ``ended`` (this call ended the session; false when it had ended
    already) and ``session`` as it is now."""

    ended: bool
    session: Session

    def __bool__(self):
        return self.ended


def release(*, user, session_id, pool_name: str | None = None, as_service: bool = False) -> Released:
    """R-SESS-4: the owner, or whoever acts for others (a service principal; on the QRMI routes a
    service uid, ``as_service``), ends the session with reason ``released``. Idempotent: the
    answer is false when it had already ended (its first ``revoked_at`` stays). NotFound: no such
    session (on the pool named ``pool_name``); Forbidden: someone else's, for a caller who may not
    act for others.

    The common path is the revocation statement alone (restricted to the owner's sessions unless
    the caller acts as a service); a miss is looked up to answer it.
    """
    session_id, now = _session_id(session_id), timezone.now()
    if as_service or user.pk is not None:
        owner = None if as_service else user.pk
        ended = _end([session_id], RevocationReason.RELEASED, now, user_id=owner, pool_name=pool_name)
        if ended:
            return Released(True, ended[0])
    found = Session.objects.filter(pk=session_id)
    if pool_name is not None:
        found = found.filter(pool__name=pool_name)
    session = found.first()
    if session is None:
        raise NotFound("No such session." if pool_name is None else f"No such session on pool '{pool_name}'.")
    if session.user_id != user.pk and not as_service and not is_service_principal(user):
        raise Forbidden("This session belongs to another user.")
    if session.is_active and not as_service:  # a principal releasing someone else's session
        ended = _end([session_id], RevocationReason.RELEASED, now, pool_name=pool_name)
        if ended:
            return Released(True, ended[0])
        session.refresh_from_db()
    return Released(False, session)


def revoke(*, session_ids, reason: str = RevocationReason.MANUAL) -> int:
    """R-SESS-4: staff revocation (API, admin action); frees the slots at once. Returns how many
    of ``session_ids`` this call ended (the others had ended already)."""
    return len(_end([_session_id(pk) for pk in session_ids], reason, timezone.now()))


def end_sessions_without_access(*, pool_ids=None, user_ids=None) -> int:
    """R-POOL-8 once a grant is withdrawn: the active sessions whose owner may no longer use their
    pool (removed from its users or from a group granted it, the pool made private, the account
    deactivated) end with reason ``access``, as a staff revocation would: their slots are freed
    and their pending jobs cancelled, so no job is submitted or dispatched under a withdrawn grant.
    ``pool_ids``/``user_ids`` narrow what is looked at (the change's pools or users). Each owner's
    pools are asked of ``ResourcePool.objects.visible_to``, the rule written once. Returns how many
    sessions ended."""
    from django.contrib.auth import get_user_model

    sessions = Session.objects.active().filter(Q(pool__public=False) | Q(user__is_active=False))
    if pool_ids is not None:
        sessions = sessions.filter(pool_id__in=pool_ids)
    if user_ids is not None:
        sessions = sessions.filter(user_id__in=user_ids)
    rows = list(sessions.values_list("id", "user_id", "pool_id"))
    held: dict[int, set[int]] = {}
    for _, user_id, pool_id in rows:
        held.setdefault(user_id, set()).add(pool_id)
    usable: dict[int, set[int]] = {}  # one question per owner: the pools they may still use
    for user in get_user_model().objects.filter(pk__in=held, is_active=True):
        usable[user.pk] = set(
            ResourcePool.objects.visible_to(user).filter(pk__in=held[user.pk]).values_list("pk", flat=True)
        )
    ended = [session_id for session_id, user_id, pool_id in rows if pool_id not in usable.get(user_id, ())]
    return len(_end(ended, RevocationReason.ACCESS, timezone.now())) if ended else 0


def deletable(sessions):
    """The rows of ``sessions`` that may be deleted (the admin; ``cleanup`` prunes the same): ended
    sessions with no unfinished job. An active session's row goes only through its release or
    revocation, which gives its slots back to the pool's usage and its reservation; deleting it
    would keep them counted and take its running jobs with it (their provider runs orphaned)."""
    ended = sessions.filter(status=SessionStatus.REVOKED)
    busy = busy_q()
    return ended if busy is None else ended.exclude(busy)


def start_reservations(*, pool_id: int, now: datetime | None = None) -> bool:
    """R-RES-1 at a reservation's start (the tick, or a refused admission in its first second):
    make the slots it holds free for its holders. Run once per window (``started_at``), again if
    staff change what it holds. Returns whether it changed anything.

    In one transaction, with the locks in the order release takes them (the pool's active
    sessions → the open reservations → the usage row), so that nothing is admitted or released
    meanwhile: (1) the sessions its holders opened before, oldest first, take their part of the
    reservation's slots, as if admitted during it; (2) while the other sessions hold more than the
    shared slots (``slots_total`` − the slots the open reservations hold), the newest of those
    sessions is revoked (reason ``reservation``), sessions of people who hold none of the open
    reservations first. Their owners were told beforehand: their session carried the notice
    (``apps.reservations.selectors.revocation_notices``). The revocation is announced after the
    commit, as any (its jobs cancelled, the Slurm licence synced)."""
    from apps.reservations import passes as window_passes
    from apps.reservations import selectors as calendar

    now = now or timezone.now()
    # R-SESS-3 first: a session past one of its deadlines holds no slot at the start (the notices
    # said so: ``revocation_notices`` counts only the sessions alive then). Counted, it made a
    # live session be revoked in its place when the start ran before the expiry sweep.
    expired = statements.any_due(pool_id, now) and any(expire_due_sessions(now=now, pool_id=pool_id).values())
    ended = []
    with transaction.atomic():
        sessions = statements.lock_active(pool_id)
        earlier = {session.reservation_id for session in sessions if session.reservation_id is not None}
        windows = calendar.lock_open_reservations(pool_id, now, also=earlier)
        if not windows:
            return expired
        usage = statements.lock_usage(pool_id)
        pool = ResourcePool.objects.only("name", "slots_total").get(pk=pool_id)
        holders = calendar.holders_of(windows)
        open_ids = {window.pk: window for window in windows}
        changed = False
        for session in sessions:
            if session.reservation_id in open_ids:
                continue
            for window in windows:
                if session.user_id in holders[window.pk] and window.slots_used < window.slots:
                    part = min(session.slots, window.slots - window.slots_used)
                    statements.attribute(session, window.pk, part)
                    window.slots_used += part
                    changed = True
                    break
        taken = sum(min(window.slots_used, window.slots) for window in windows)
        excess = (usage - taken) - (pool.slots_total - sum(window.slots for window in windows))
        if excess > 0:
            anyone = set().union(*holders.values())
            shared = [session for session in sessions if session.reservation_id not in open_ids]
            shared.sort(key=lambda session: (session.user_id not in anyone, session.created_at, str(session.pk)))
            chosen = []
            while excess > 0 and shared:
                session = shared.pop()  # the last: of someone holding none, the newest
                chosen.append(session.pk)
                excess -= session.slots
            ended = statements.end_sessions(chosen, RevocationReason.RESERVATION, now)
            changed = changed or bool(ended)
        calendar.mark_started([window.pk for window in windows], now)
        # R-NOTE-1: its holders hear that it started, once per start (a window staff changed
        # starts again; the outbox's key, which holds the start, drops the repeat).
        window_passes.notify_started([window for window in windows if window.started_at is None], holders, pool.name)
    _announce(ended, RevocationReason.RESERVATION)
    if ended:
        log.info("pool %s: %d session(s) revoked at the start of a reservation", pool.name, len(ended))
    return changed or expired


REVOKED_AT_ONCE = 10_000  # a statement names them in an IN list: PostgreSQL takes 65 535 parameters


def expire_due_sessions(*, now: datetime | None = None, pool_id: int | None = None) -> dict:
    """R-SESS-3: revoke sessions past ``expires_at`` (always) or idle past ``idle_expires_at``
    with no pending or running job. Returns counts by reason."""
    now = now or timezone.now()
    active = Session.objects.active()
    if pool_id is not None:
        active = active.filter(pool_id=pool_id)
    idle = Q(idle_expires_at__lte=now)
    busy = busy_q()
    if busy is not None:
        idle &= ~busy
    return {
        RevocationReason.MAX_LIFETIME.value: _sweep(
            active.filter(expires_at__lte=now), RevocationReason.MAX_LIFETIME, now
        ),
        RevocationReason.IDLE_TIMEOUT.value: _sweep(active.filter(idle), RevocationReason.IDLE_TIMEOUT, now),
    }


def _sweep(due, reason: str, now: datetime) -> int:
    """End the sessions of ``due``, at most ``REVOKED_AT_ONCE`` per transaction. Each batch is
    claimed first (row locks, skipping rows another transaction holds: the next sweep gets them),
    so that a session claimed idle cannot take a job before it is ended; the claim's transaction
    holds nothing else (the pool's usage row is locked from the revocation statement to this
    commit), and the announcement runs after it."""
    count = 0
    while True:
        with transaction.atomic():
            ids = list(due.select_for_update(skip_locked=True).values_list("id", flat=True)[:REVOKED_AT_ONCE])
            ended = statements.end_sessions(ids, reason, now) if ids else []
        _announce(ended, reason)
        count += len(ended)
        if len(ids) < REVOKED_AT_ONCE:
            return count


def settle_due(sessions: list) -> list:
    """R-SESS-7: a session past one of its deadlines reads as what it is, whether or not the sweep
    has run. Expire the pools of ``sessions`` that hold such a session (R-SESS-3's rule: one idle
    past its deadline is kept while it has unfinished work) and return ``sessions`` as they are
    then. Costs nothing while none is past a deadline (every read in the common case)."""
    now = timezone.now()
    due = {
        session.pool_id
        for session in sessions
        if session.is_active and min(session.expires_at, session.idle_expires_at) <= now
    }
    if not due:
        return sessions
    for pool_id in sorted(due):
        expire_due_sessions(now=now, pool_id=pool_id)
    for session in sessions:
        if session.pool_id in due and session.is_active:
            session.refresh_from_db(fields=["status", "revoked_at", "revocation_reason"])
    return sessions


def recount_usage() -> list[str]:
    """Compare each pool's usage counters with the sums over its active sessions, and repair those
    that differ (a log line, and ``usage_repairs`` for ``gridgate_pool_usage_repairs_total``).
    The counters only drift if something changed sessions without these statements (a raw write,
    a restored backup); the expiry sweep runs this every minute. Returns the repaired pools' names."""
    repaired = []
    for pool_id in statements.drifted_pools():
        fixed = statements.repair_usage(pool_id)
        if fixed is not None:
            name, counters, sums = fixed
            log.warning(
                "pool %s: usage counters (slots, cpu, memory, gpu) were %s, its active sessions hold %s: repaired",
                name,
                counters,
                sums,
            )
            repaired.append(name)
    now = timezone.now()
    for window_id in statements.drifted_windows(now):  # R-RES-1's counters, the same way
        fixed = statements.repair_window(window_id, now)
        if fixed is not None:
            log.warning("reservation %s: slots_used was %s, its sessions hold %s: repaired", window_id, *fixed)
            repaired.append(f"reservation {window_id}")
    return repaired
