"""Admission, renewal, release, revocation and expiry of sessions (SPEC §4)."""

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import IntegrityError, OperationalError, connection, router, transaction
from django.db.models import Q, Sum
from django.db.models.functions import Coalesce
from django.db.models.sql import InsertQuery
from django.utils import timezone

from apps.core.api.exceptions import Conflict
from apps.core.exceptions import Unavailable
from apps.core.sql import CompiledQuery
from apps.resources.launch import launch_spec
from apps.resources.models import ResourceClass, ResourcePool, fmt
from apps.sessions.hooks import busy_q, busy_version, sessions_revoked
from apps.sessions.models import RevocationReason, Session, SessionStatus

log = logging.getLogger(__name__)


class CapacityExceeded(Conflict):
    default_code = "capacity_exceeded"


class SessionConflict(Conflict):
    default_code = "session_conflict"


@dataclass(frozen=True)
class Admission:
    session: Session
    created: bool


def slots_usage(pool: ResourcePool) -> dict:
    """R-SESS-6: ``{"slots_total", "slots_used", "slots_available"}`` (total may be None)."""
    used = Session.objects.active().filter(pool=pool).aggregate(n=Coalesce(Sum("slots"), 0))["n"]
    total = pool.slots_total
    return {
        "slots_total": total,
        "slots_used": used,
        "slots_available": None if total is None else max(total - used, 0),
    }


_POOL_LIMIT_FIELDS = ("name", "slots_total", "quota_cpu", "quota_memory", "quota_gpu", "max_lifetime", "idle_timeout")


def admit(*, user, resource_class: ResourceClass, slots: int = 1, external_id: str = "") -> Admission:
    """Open a session if it fits, or return the existing one for the same scheduler job.

    R-SESS-1: admission is serialized per pool by a row lock on the pool (PostgreSQL); on SQLite
    the IMMEDIATE transaction takes the database write lock up front. Under the lock, expired
    sessions are revoked first so they never hold capacity (R-SESS-3), then slots and quota are
    summed over the active sessions and the new one is inserted before the lock is released.

    The time spent holding the lock bounds admission throughput, so everything that can be
    prepared is prepared before taking it (launch spec, the new row, the compiled SQL of the lock
    and of the usage aggregate); the common case holds the lock for four short statements: lock,
    an index probe for due sessions, the usage aggregate, insert.
    R-SESS-2: (user, external_id) identifies a session among active ones; the partial unique
    constraint catches a concurrent duplicate admitted through another pool's lock.
    """
    external_id = (external_id or "").strip()
    pool = resource_class.pool
    pool_id, with_quota = pool.pk, pool.has_quota
    now = timezone.now()  # the request time: lifetimes count from here
    session = Session(
        user=user,
        resource_class=resource_class,
        pool_id=pool_id,
        slots=slots,
        external_id=external_id,
        launch_spec=launch_spec(resource_class),
        created_at=now,
        last_activity_at=now,
        expires_at=now + timedelta(seconds=pool.max_lifetime),
        idle_expires_at=now + timedelta(seconds=pool.idle_timeout),
    )
    try:
        with transaction.atomic():
            # Compiled once per process, inside a transaction (FOR UPDATE requires one) but
            # before the lock is taken: nothing reaches the database until the first execute.
            _LOCK_SQL.compile()
            _usage_sql(with_quota).compile()
            due = _due_sql()
            due.compile()
            insert_sql = _compiled_insert(session)
            with connection.cursor() as cursor:
                cursor.execute(*_LOCK_SQL.sql_with_params(pool_id=pool_id))
                row = cursor.fetchone()
                if row is None:
                    raise ResourcePool.DoesNotExist(f"Pool {pool_id} no longer exists.")
                limits = dict(zip(_POOL_LIMIT_FIELDS, row, strict=True))
                # Expire first: an expired session is never handed back as "the existing one".
                cursor.execute(*due.sql_with_params(pool_id=pool_id, now=now))
                if cursor.fetchone() is not None:
                    expire_due_sessions(now=now, pool_id=pool_id)
                if external_id:
                    same = _existing(user, external_id)
                    if same is not None:
                        return Admission(_same_or_conflict(same, resource_class, slots), False)
                has_quota = limits["quota_cpu"] is not None or limits["quota_memory"] is not None
                cursor.execute(*_usage_sql(has_quota).sql_with_params(pool_id=pool_id))
                row = cursor.fetchone() or ()
                used = dict.fromkeys(_USAGE_COLUMNS, 0)
                used.update({name: value or 0 for name, value in zip(_USAGE_COLUMNS, row, strict=False)})
                _check_capacity(limits, resource_class, slots, used)
                for statement, params in insert_sql:
                    cursor.execute(statement, params)
            session._state.adding, session._state.db = False, connection.alias
            return Admission(session, True)
    except IntegrityError:
        # A concurrent request for the same (user, external_id) won through another pool's lock.
        same = _existing(user, external_id) if external_id else None
        if same is None:
            raise
        return Admission(_same_or_conflict(same, resource_class, slots), False)


def _existing(user, external_id: str) -> Session | None:
    return Session.objects.active().filter(user=user, external_id=external_id).first()


def _same_or_conflict(same: Session, resource_class: ResourceClass, slots: int) -> Session:
    if same.slots != slots or same.resource_class_id != resource_class.pk:
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


def _compiled_insert(instance: Session) -> list[tuple[str, tuple]]:
    """The INSERT of ``instance``, compiled before the pool lock is taken (see ``admit``).

    Equivalent to ``instance.save(force_insert=True)``; Session has no save() override and no
    signal receivers, which this relies on.
    """
    query = InsertQuery(Session)
    query.insert_values(Session._meta.concrete_fields, [instance])
    return query.get_compiler(using=router.db_for_write(Session)).as_sql()


_POOL_ID = -987_654_321  # sentinels for CompiledQuery: values no real query carries
_NOW = datetime(1901, 2, 3, 4, 5, 6, 789_012, tzinfo=UTC)
_USAGE_COLUMNS = ("slots", "cpu", "memory", "gpu")

_LOCK_SQL = CompiledQuery(
    lambda pool_id: ResourcePool.objects.select_for_update().filter(pk=pool_id).values_list(*_POOL_LIMIT_FIELDS),
    pool_id=_POOL_ID,
)


def _usage_queryset(pool_id: int, with_quota: bool):
    """Slots used and, for quota pools, the class resources held by the pool's active sessions."""
    aggregates = {"slots": Coalesce(Sum("slots"), 0)}
    if with_quota:
        aggregates.update(
            cpu=Sum("resource_class__cpu"), memory=Sum("resource_class__memory"), gpu=Sum("resource_class__gpu")
        )
    return (
        Session.objects.active()
        .filter(pool_id=pool_id)
        .order_by()
        .values("pool_id")
        .annotate(**aggregates)
        .values_list(*aggregates)
    )


_USAGE_SQL = {
    with_quota: CompiledQuery(lambda pool_id, q=with_quota: _usage_queryset(pool_id, q), pool_id=_POOL_ID)
    for with_quota in (False, True)
}


def _usage_sql(with_quota: bool) -> CompiledQuery:
    return _USAGE_SQL[with_quota]


_DUE_SQL: dict[int, CompiledQuery] = {}


def _due_sql() -> CompiledQuery:
    """Is any active session of the pool due for expiry? (served by the per-pool deadline indexes)"""
    version = busy_version()
    if version not in _DUE_SQL:
        _DUE_SQL.clear()
        _DUE_SQL[version] = CompiledQuery(
            lambda pool_id, now: Session.objects.active().filter(_due_q(now), pool_id=pool_id).values_list("pk")[:1],
            pool_id=_POOL_ID,
            now=_NOW,
        )
    return _DUE_SQL[version]


def _check_capacity(limits: dict, resource_class: ResourceClass, slots: int, used: dict) -> None:
    name, total = limits["name"], limits["slots_total"]
    if total is not None:
        available = max(total - used["slots"], 0)
        if slots > available:
            raise CapacityExceeded(
                f"Pool '{name}' has {available} of {total} slots available; {slots} requested.",
                slots_available=available,
            )
    if limits["quota_cpu"] is not None or limits["quota_memory"] is not None:
        over = []
        for dim in ("cpu", "memory", "gpu"):
            limit = limits[f"quota_{dim}"] or 0
            wanted = getattr(resource_class, dim)
            if used[dim] + wanted > limit:
                over.append(f"{dim} {fmt(used[dim])} used + {fmt(wanted)} > quota {fmt(limit)}")
        if over:
            # slots_available is always present on a refusal (null when the pool counts no slots).
            extra = {
                "quota_exceeded": over,
                "slots_available": None if total is None else max(total - used["slots"], 0),
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


def _revoke(queryset, reason: str, now: datetime, *, skip_locked: bool = True) -> list:
    """Revoke the active sessions of ``queryset``; return the ids this call revoked.

    Compare-and-set on ``status`` so that two revokers never both "win", then announce the
    revocation (pending jobs are cancelled by the scheduling app's receiver). Sweeps skip rows
    another transaction holds (the next sweep gets them); an explicit release or revoke waits for
    the row instead, or a session briefly locked by a job submission would silently stay active.
    """
    with transaction.atomic(savepoint=False):
        ids = list(
            queryset.filter(status=SessionStatus.ACTIVE)
            .select_for_update(skip_locked=skip_locked)
            .values_list("id", flat=True)
        )
        if not ids:
            return []
        Session.objects.filter(pk__in=ids, status=SessionStatus.ACTIVE).update(
            status=SessionStatus.REVOKED, revoked_at=now, revocation_reason=reason
        )
        sessions_revoked.send(sender=Session, session_ids=ids, reason=reason)
    log.info("revoked %d session(s): %s", len(ids), reason)
    return ids


def release(session: Session) -> bool:
    """R-SESS-4: release by owner or service principal. Idempotent: False if already ended."""
    return bool(
        retry_aborted(
            lambda: _revoke(
                Session.objects.filter(pk=session.pk), RevocationReason.RELEASED, timezone.now(), skip_locked=False
            )
        )
    )


def revoke(session: Session, reason: str = RevocationReason.MANUAL) -> bool:
    """R-SESS-4: staff revocation; frees the slots at once."""
    return bool(
        retry_aborted(lambda: _revoke(Session.objects.filter(pk=session.pk), reason, timezone.now(), skip_locked=False))
    )


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
