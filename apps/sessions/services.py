"""Admission, renewal, release, revocation and expiry of sessions (SPEC §4)."""

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import IntegrityError, OperationalError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from apps.core.exceptions import Conflict, NotFound, Unavailable
from apps.core.rows import Columns, fetch_one, in_one_round_trip, insert_statement, inserted, pipelining
from apps.resources.launch import launch_spec
from apps.resources.models import ResourceClass, ResourcePool, fmt, visible_to_sql
from apps.sessions.hooks import busy_q, sessions_revoked
from apps.sessions.models import RevocationReason, Session, SessionStatus
from apps.sessions.selectors import Usage, active_usage, slots_usage, usage_statement

__all__ = ["slots_usage"]  # re-exported: callers reach R-SESS-6 through the service module too

log = logging.getLogger(__name__)


class CapacityExceeded(Conflict):
    """R-SESS-1: the request does not fit (``slots_available``, ``quota_exceeded``)."""


class SessionConflict(Conflict):
    """R-SESS-2: the same scheduler job already holds a session with other parameters."""


@dataclass(frozen=True)
class Admission:
    session: Session
    created: bool


class NoSuchClass(NotFound):
    """The class to admit on does not exist or is not one the user may use."""


@dataclass(frozen=True)
class UsableClass:
    """A class among those ``user`` may use (R-POOL-8), chosen by id (REST) or as the default
    class of the pool named ``pool_name`` (QRMI). The lookup and the access check cost admission
    no statement of their own: they are part of the statement that locks the pool."""

    pk: int | None = None
    pool_name: str | None = None


def admit(*, user, resource_class: ResourceClass | UsableClass, slots: int = 1, external_id: str = "") -> Admission:
    """Open a session if it fits, or return the existing one for the same scheduler job.

    ``resource_class`` is a class (taken as given: the caller checked access) or a
    :class:`UsableClass`, which selects one within what ``user`` may use; NoSuchClass says it
    selected nothing.

    R-SESS-1: admission is serialized per pool by a row lock on the pool (PostgreSQL); on SQLite
    the IMMEDIATE transaction takes the database write lock up front. The sum of the others'
    usage is read after the lock, in a statement of its own: in READ COMMITTED one statement
    reads one snapshot, taken before it waited for the lock, so a sum in the locking statement
    would miss the session the previous lock holder just committed.

    On PostgreSQL the common case (no session of the same scheduler job, the request fits) is
    ``_admit_in_one_round_trip``: the class read, then lock, insert-if-it-fits and COMMIT sent
    at once; a refusal is answered there too, unless a session could be due for expiry. The
    rest takes the locked path below (always on SQLite):
    (1) find the class and lock its pool row, probing for the active session of the same
    scheduler job (R-SESS-2); (2) insert the new session and sum the others' usage (one
    statement on PostgreSQL, see ``active_usage``), then check the sum (a refusal rolls the
    insert back). The same-job probe may be stale: a session missed is caught by the partial
    unique constraint (IntegrityError below); one found is re-read.
    R-SESS-3: sessions due for expiry are revoked here, under the lock, only when the request
    would not fit otherwise: they never block capacity, and the common path spends nothing on them.
    """
    external_id = (external_id or "").strip()
    now = timezone.now()  # the request time: lifetimes count from here
    try:
        if pipelining():
            admitted = _admit_in_one_round_trip(user, resource_class, slots, external_id, now)
            if admitted is not None:
                return admitted
        with transaction.atomic():
            locked, same_job = _lock_class(user, resource_class, external_id)
            pool = locked.pool
            if same_job is not None:
                same = _existing(user, external_id)
                if same is not None and min(same.expires_at, same.idle_expires_at) <= now:
                    expire_due_sessions(now=now, pool_id=same.pool_id)  # it may be due: never hand it out
                    same = _existing(user, external_id)
                if same is not None:
                    return Admission(_same_or_conflict(same, locked.pk, slots), False)
            session = _new_session(user, locked, slots, external_id, now)
            try:  # stored now, in the statement that sums the others; a refusal rolls it back
                _check_capacity(pool, locked, slots, active_usage([pool.pk], inserting=session)[pool.pk])
            except CapacityExceeded:
                if not _any_past_a_deadline(pool.pk, now):  # cheap: nothing could be due
                    raise
                if not any(expire_due_sessions(now=now, pool_id=pool.pk).values()):
                    raise
                Session.objects.filter(pk=session.pk).delete()  # then sum the others again
                _check_capacity(pool, locked, slots, active_usage([pool.pk], inserting=session)[pool.pk])
            return Admission(session, True)
    except IntegrityError:
        # A concurrent request for the same (user, external_id) won through another pool's lock,
        # or committed while this one waited for the lock (the probe above read an older snapshot).
        same = _existing(user, external_id) if external_id else None
        if same is None:
            raise
        return Admission(_same_or_conflict(same, _class_id(resource_class), slots), False)


def _new_session(user, resource_class: ResourceClass, slots: int, external_id: str, now: datetime) -> Session:
    pool = resource_class.pool
    return Session(
        user=user,
        resource_class=resource_class,
        pool=pool,
        slots=slots,
        external_id=external_id,
        launch_spec=launch_spec(resource_class),
        created_at=now,
        last_activity_at=now,
        expires_at=now + timedelta(seconds=pool.max_lifetime),
        idle_expires_at=now + timedelta(seconds=pool.idle_timeout),
    )


# _check_capacity's rule as a condition on the pool ``p`` and its usage ``u`` (active_usage's
# sums, NULL for a pool without active sessions), for the insert-if-it-fits of the common path.
# Parameters: slots, class cpu, memory, gpu. tests/sessions/test_admission_round_trip.py checks
# that both decide alike at every boundary: change them together.
_FITS = (
    "(p.slots_total IS NULL OR COALESCE(u.slots, 0) + %s <= p.slots_total)"
    " AND ((p.quota_cpu IS NULL AND p.quota_memory IS NULL)"
    " OR (COALESCE(u.cpu, 0) + %s <= COALESCE(p.quota_cpu, 0)"
    " AND COALESCE(u.memory, 0) + %s <= COALESCE(p.quota_memory, 0)"
    " AND COALESCE(u.gpu, 0) + %s <= COALESCE(p.quota_gpu, 0)))"
)


def _admit_in_one_round_trip(user, choice, slots: int, external_id: str, now: datetime) -> Admission | None:
    """R-SESS-1's common case on PostgreSQL in four statements and two round trips, the pool's
    lock held for the database's work only (``in_one_round_trip`` says why, with figures)::

        SELECT class, pool, same-job probe (admission's statement (1), without the lock)
        -- then, sent at once:
        BEGIN; SELECT 1 FROM pool WHERE id = pool FOR UPDATE;
        WITH u AS (the pool's usage) INSERT INTO session SELECT <the session> FROM pool p
          LEFT JOIN u WHERE p.id = pool AND <it fits> RETURNING 1; COMMIT

    The insert is a statement after the lock's, so its sum sees every session admitted before
    (R-SESS-1) and the pool's current limits. None when it is not the common case: a session of
    the same scheduler job was seen, or the request does not fit as things stand (nothing was
    stored) and either a session could be due for expiry or room was freed since; admit()'s
    locked path then decides, with R-SESS-3's expiry. A refusal otherwise raises from here,
    with the pool's usage read after it (``slots_available``).
    """
    locked, same_job = _lock_class(user, choice, external_id, lock=False)
    if same_job is not None:
        return None
    pool = locked.pool
    session = _new_session(user, locked, slots, external_id, now)
    usage, usage_params = usage_statement([pool.pk])
    where = f" FROM {ResourcePool._meta.db_table} p LEFT JOIN u ON u.pool_id = p.id WHERE p.id = %s AND {_FITS}"  # noqa: S608
    statement = insert_statement(session, select=(where, [pool.pk, slots, locked.cpu, locked.memory, locked.gpu]))
    if statement is None:  # save receivers: the locked path saves it
        return None
    insert_sql, insert_params = statement
    _, stored = in_one_round_trip(
        [
            (f"SELECT 1 FROM {ResourcePool._meta.db_table} WHERE id = %s FOR UPDATE", [pool.pk]),  # noqa: S608
            (
                f"WITH u (pool_id, slots, cpu, memory, gpu) AS ({usage}) {insert_sql} RETURNING 1",
                [*usage_params, *insert_params],
            ),
        ]
    )
    if not stored:
        # A refusal answers from here, without the lock, unless sessions could be due for expiry
        # (the locked path expires them) or a release made room meanwhile (it then admits).
        if not _any_past_a_deadline(pool.pk, now):
            _check_capacity(pool, locked, slots, active_usage([pool.pk])[pool.pk])
        return None
    inserted(session)
    return Admission(session, True)


def _any_past_a_deadline(pool_id: int, now: datetime) -> bool:
    """Whether an active session of the pool is past one of its deadlines: it may be due for
    expiry (R-SESS-3; ``expire_due_sessions`` decides)."""
    past = Session.objects.active().filter(Q(expires_at__lte=now) | Q(idle_expires_at__lte=now))
    return past.filter(pool_id=pool_id).exists()


# Statement (1) of admission, written by hand (STYLE.md rule 4): built with the ORM it cost
# ~1.9 ms of CPU per request to construct and compile, and ran in 0.3 ms (bench/http_load.py,
# bench/admission.py); tests/sessions/test_admission_statement.py tests it directly.
_CLASS = Columns(ResourceClass, "c")
_POOL = Columns(ResourcePool, "p")


def _lock_class(
    user, choice: ResourceClass | UsableClass, external_id: str, *, lock: bool = True
) -> tuple[ResourceClass, object]:
    """The chosen class with its pool, the pool row locked (unless ``lock`` is False), and the
    id of the user's active session for ``external_id`` (or None)::

        SELECT class.*, pool.*, (id of the active session of (user, external_id))
          FROM class JOIN pool
         WHERE class is the chosen one AND (user may use the pool, for a UsableClass)
         LIMIT 1 FOR UPDATE OF pool
    """
    params = []
    if external_id:
        same = (
            f"(SELECT s.id FROM {Session._meta.db_table} s"  # noqa: S608 (table names from _meta; values are parameters)
            " WHERE s.status = %s AND s.user_id = %s AND s.external_id = %s LIMIT 1)"
        )
        params += [SessionStatus.ACTIVE, user.pk, external_id]
    else:
        same = "NULL"
    if isinstance(choice, ResourceClass):
        where, access, access_params = "c.id = %s", "TRUE", []
        params.append(choice.pk)
    else:
        if choice.pk is not None:
            if not 0 < choice.pk < 2**63:  # SQLite cannot even bind a larger int (OverflowError)
                raise NoSuchClass("No such class that you can use.")
            where = "c.id = %s"
            params.append(choice.pk)
        else:
            where = 'p.name = %s AND c."default"'
            params.append(choice.pool_name)
        access, access_params = visible_to_sql(user, "p")
    params += access_params
    locking = " FOR UPDATE OF p" if lock and connection.features.has_select_for_update_of else ""
    sql = (
        f"SELECT {_CLASS.sql}, {_POOL.sql}, {same}"  # noqa: S608 (table names from _meta; values are parameters)
        f" FROM {ResourceClass._meta.db_table} c JOIN {ResourcePool._meta.db_table} p ON p.id = c.pool_id"
        f" WHERE {where} AND {access} ORDER BY c.id LIMIT 1{locking}"
    )
    found = fetch_one(sql, params, _CLASS, _POOL)
    if found is None:
        raise NoSuchClass("No such class that you can use.")
    locked, pool, same_job = found
    locked.pool = pool
    return locked, same_job


def _class_id(choice: ResourceClass | UsableClass) -> int | None:
    if choice.pk is not None:
        return choice.pk
    return ResourceClass.objects.filter(pool__name=choice.pool_name, default=True).values_list("pk", flat=True).first()


def _existing(user, external_id: str) -> Session | None:
    return Session.objects.active().filter(user=user, external_id=external_id).first()


def _same_or_conflict(same: Session, class_id: int | None, slots: int) -> Session:
    if same.slots != slots or same.resource_class_id != class_id:
        raise SessionConflict(
            f"An active session ({same.id}) already exists for external id '{same.external_id}' with "
            f"different parameters (slots {same.slots}, class {same.resource_class_id}).",
            session=str(same.id),
        )
    return same


def _due_q(now: datetime) -> Q:
    """R-SESS-3: past the absolute lifetime, or idle with no pending/running work."""
    idle = Q(idle_expires_at__lte=now)
    busy = busy_q()
    if busy is not None:
        idle &= ~busy
    return Q(expires_at__lte=now) | idle


def _check_capacity(pool: ResourcePool, resource_class: ResourceClass, slots: int, used: Usage) -> None:
    name, total = pool.name, pool.slots_total
    if total is not None:
        available = max(total - used.slots, 0)
        if slots > available:
            raise CapacityExceeded(
                f"Pool '{name}' has {available} of {total} slots available; {slots} requested.",
                slots_available=available,
            )
    if pool.has_quota:
        over = []
        for dim in ("cpu", "memory", "gpu"):
            limit = getattr(pool, f"quota_{dim}") or 0
            wanted = getattr(resource_class, dim)
            if getattr(used, dim) + wanted > limit:
                over.append(f"{dim} {fmt(getattr(used, dim))} used + {fmt(wanted)} > quota {fmt(limit)}")
        if over:
            # slots_available is always present on a refusal (null when the pool counts no slots).
            extra = {
                "quota_exceeded": over,
                "slots_available": None if total is None else max(total - used.slots, 0),
            }
            raise CapacityExceeded(f"Pool '{name}' quota would be exceeded: {'; '.join(over)}.", **extra)


def touch(session: Session, now: datetime | None = None) -> None:
    """Renew the idle deadline (R-SESS-3: submitting a job counts as activity)."""
    now = now or timezone.now()
    idle = timedelta(seconds=session.pool.idle_timeout)
    Session.objects.filter(pk=session.pk, status=SessionStatus.ACTIVE).update(
        last_activity_at=now, idle_expires_at=now + idle
    )
    session.last_activity_at, session.idle_expires_at = now, now + idle


# PostgreSQL's "deadlock detected" and "could not serialize access": the transaction was
# aborted as a whole and may simply be run again.
RETRYABLE_SQLSTATES = frozenset({"40P01", "40001"})


def is_retryable(exc: BaseException) -> bool:
    return isinstance(exc, OperationalError) and getattr(exc.__cause__, "sqlstate", None) in RETRYABLE_SQLSTATES


def retry_aborted(func, *, attempts: int = 3):
    """Run ``func`` (one whole transaction); if the database aborts it as a deadlock victim or a
    serialization failure, run it again, and past ``attempts`` answer 503 (never a 500).

    Every path takes its locks in one order (pool queue → session → job, PATTERNS §2), so this
    is a backstop. Inside a caller's transaction the aborted work cannot be re-run alone: 503.
    """
    for attempt in range(1, attempts + 1):
        try:
            return func()
        except OperationalError as exc:
            if not is_retryable(exc):
                raise
            if attempt == attempts or connection.in_atomic_block:
                log.warning("transaction aborted (%s) after %d attempt(s)", exc.__cause__.sqlstate, attempt)
                raise Unavailable("The database aborted a conflicting transaction; try again.") from exc


REVOKED_AT_ONCE = 10_000  # a statement names them in IN lists: PostgreSQL takes 65 535 parameters


def _revoke(queryset, reason: str, now: datetime) -> list:
    """Revoke the active sessions of ``queryset`` (expiry sweeps); return the ids this call revoked.

    Compare-and-set on ``status`` so that two revokers never both "win", then announce the
    revocation (pending jobs are cancelled by the scheduling app's receiver). Sweeps skip rows
    another transaction holds (the next sweep gets them); an explicit release or revoke waits for
    the row instead (``_revoke_one``). At most ``REVOKED_AT_ONCE`` per round, each round in its
    own transaction (unless the caller holds one): the ids are statement parameters, and a sweep
    after a long outage may find more than one statement takes.
    """
    revoked = []
    while True:
        with transaction.atomic(savepoint=False):
            ids = list(
                queryset.filter(status=SessionStatus.ACTIVE)
                .select_for_update(skip_locked=True)
                .values_list("id", flat=True)[:REVOKED_AT_ONCE]
            )
            if not ids:
                break
            Session.objects.filter(pk__in=ids, status=SessionStatus.ACTIVE).update(
                status=SessionStatus.REVOKED, revoked_at=now, revocation_reason=reason
            )
            sessions_revoked.send(sender=Session, session_ids=ids, reason=reason)
        revoked += ids
        if len(ids) < REVOKED_AT_ONCE:
            break
    if revoked:
        log.info("revoked %d session(s): %s", len(revoked), reason)
    return revoked


def _revoke_one(session: Session, reason: str) -> bool:
    """Revoke one session; True if this call ended it.

    One compare-and-set UPDATE: it waits for a row lock a job submission holds (so a session
    briefly locked is never left active), and of two concurrent revokers only one matches
    ``status=active``. The receivers then cancel its jobs in the same transaction.
    """
    now = timezone.now()
    ended = _end_if_active(session.pk, reason, now)
    if ended:
        session.status, session.revoked_at, session.revocation_reason = SessionStatus.REVOKED, now, reason
        log.info("revoked session %s: %s", session.pk, reason)
    return bool(ended)


def _end_if_active(session_id, reason: str, now: datetime, *, user_id: int | None = None) -> bool:
    """The compare-and-set that ends a session, then the announcement, in one transaction::

        UPDATE session SET status = 'revoked', revoked_at = now, revocation_reason = reason
         WHERE id = session_id AND status = 'active' [AND user_id = user_id]

    Written by hand (STYLE.md rule 4): the ORM's ~0.4 ms of building it was a sixth of a release
    (issue 15, bench/http_load.py); tests/sessions/test_admission_statement.py tests it directly.
    """
    sql = (
        f"UPDATE {Session._meta.db_table} SET status = %s, revoked_at = %s, revocation_reason = %s"  # noqa: S608
        " WHERE id = %s AND status = %s"
    )
    params = [
        SessionStatus.REVOKED,
        connection.ops.adapt_datetimefield_value(now),
        reason,
        Session._meta.pk.get_db_prep_value(session_id, connection),
        SessionStatus.ACTIVE,
    ]
    if user_id is not None:
        sql += " AND user_id = %s"
        params.append(user_id)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            ended = cursor.rowcount == 1
        if ended:
            sessions_revoked.send(sender=Session, session_ids=[session_id], reason=reason)
    return ended


def release(session: Session) -> bool:
    """R-SESS-4: release by owner or service principal. Idempotent: False if already ended."""
    return bool(retry_aborted(lambda: _revoke_one(session, RevocationReason.RELEASED)))


def release_own(user, session_id) -> bool:
    """R-SESS-4, the common release: ``user`` ends their own active session in one statement.
    False when no active session of theirs has that id (already ended, someone else's, none):
    the caller then looks it up to answer the other cases."""
    try:
        session_id = uuid.UUID(str(session_id))
    except ValueError:
        return False
    now = timezone.now()
    ended = bool(retry_aborted(lambda: _end_if_active(session_id, RevocationReason.RELEASED, now, user_id=user.pk)))
    if ended:
        log.info("revoked session %s: %s", session_id, RevocationReason.RELEASED)
    return ended


def revoke(session: Session, reason: str = RevocationReason.MANUAL) -> bool:
    """R-SESS-4: staff revocation; frees the slots at once."""
    return bool(retry_aborted(lambda: _revoke_one(session, reason)))


def expire_due_sessions(*, now: datetime | None = None, pool_id: int | None = None) -> dict:
    """R-SESS-3: revoke sessions past ``expires_at`` (always) or idle past ``idle_expires_at``
    with no pending or running job. Returns counts by reason."""
    now = now or timezone.now()
    base = Session.objects.active()
    if pool_id is not None:
        base = base.filter(pool_id=pool_id)
    lifetime = _revoke(base.filter(expires_at__lte=now), RevocationReason.MAX_LIFETIME, now)
    idle = _revoke(base.filter(_due_q(now)), RevocationReason.IDLE_TIMEOUT, now)
    return {RevocationReason.MAX_LIFETIME.value: len(lifetime), RevocationReason.IDLE_TIMEOUT.value: len(idle)}
