"""The statements of session admission and revocation, written by hand (STYLE.md rule 4), each
beside its pseudocode and tested directly (tests/sessions/test_statements.py).

Why by hand: a batch system's prolog and epilog acquire and release a session for every job, and
building these statements with the ORM took longer than PostgreSQL took to run them
(docs/deployment.md, "Sizing"). The capacity rule (R-SESS-1) is written once, in ``_ROOM``: the
admission statement admits by it and a refusal reports which part of it failed.

A pool's usage lives in its own narrow row (``PoolUsage``: ``slots_used``, ``cpu_used``,
``memory_used``, ``gpu_used``), changed only here, in the same statement that inserts or ends the
sessions it counts: admission is one conditional UPDATE of the usage row (which serializes
admission per pool) inserting the session, revocation one UPDATE of the sessions giving their
holdings back. The pool's own row is only read: it is the version of the pool's configuration
that job submissions check (R-SESS-7), so nothing here may write it. The sum over the active
sessions is kept only as the recount the expiry sweep compares with the counters.

Reservations (R-RES-1) enter the same rule: the statement reads the pool's reservations open at
the request's time (``_calendar_sql``), locking their rows, and the slots rule keeps the slots they
hold that their holders do not use from everyone else. Each window counts the slots its holders'
sessions hold of it (``Reservation.slots_used``, changed only here and at its start), so every
number the rule reads is on a row the statement holds locked: a concurrent admission or release
that changed one is waited for and its outcome read (READ COMMITTED re-reads a row it locks).

PostgreSQL runs each as one statement (data-modifying CTEs): atomic without BEGIN/COMMIT, the
usage row's lock held from its UPDATE to the statement's commit. SQLite has no data-modifying CTE:
there each is two statements in the (IMMEDIATE) transaction that serializes every writer.

Statuses are written into the SQL as literals, never as parameters: the partial indexes on active
sessions serve a statement only when its text proves their condition, and PostgreSQL plans a
prepared statement once for every parameter value (a generic plan) after a few executions.
"""

from collections import defaultdict
from contextlib import nullcontext
from decimal import Decimal
from typing import NamedTuple

from django.db import connection, transaction
from django.utils import timezone

from apps.core.rows import Columns, fetch_one, insert_values, split
from apps.reservations.models import Reservation, WindowKind, holder_sql
from apps.resources.models import PoolUsage, ResourceClass, ResourcePool, visible_pools_sql
from apps.sessions.models import RevocationReason, Session, SessionStatus

_CLASS = Columns(ResourceClass, "c")
_POOL = Columns(ResourcePool, "p")
_SESSION = Columns(Session, "e")
_DIMENSIONS = ("slots", "cpu", "memory", "gpu")
_ACTIVE = f"'{SessionStatus.ACTIVE}'"  # a literal: see the module's docstring

# R-SESS-1, per dimension, on the pool's limits (``p``), its usage row (``u``) and the open
# reservations (``k``, :func:`_calendar_sql`), each with one parameter, the amount asked, but the
# slots rule, which reads it from ``k.asked`` (:func:`_fit_params`). A pool with neither a CPU
# nor a memory quota has no quota at all (ResourcePool.has_quota).
#
# Slots (R-SESS-1 with R-RES-1): the pool's total, and the shared part. Of the ``k.held`` slots the
# open reservations hold, ``k.taken`` are held by their holders' sessions; every other session holds
# the shared slots, ``slots_total - k.held`` of them. A request takes ``k.part`` of its slots from
# a reservation its user holds that has room (holders use their reserved slots first) and the rest
# from the shared slots: so sessions of others never hold more than ``slots_total - held``.
_NO_QUOTA = "(p.quota_cpu IS NULL AND p.quota_memory IS NULL)"
_ROOM = {
    "slots": (
        "(p.slots_total IS NULL OR (u.slots_used + k.asked <= p.slots_total AND (k.asked <= k.part"
        " OR u.slots_used - k.taken + k.asked - k.part <= p.slots_total - k.held)))"
    ),
    # ROUND: SQLite adds decimals as floats (0.1 + 0.2 > 0.3); the column has 3 places.
    "cpu": f"({_NO_QUOTA} OR ROUND(u.cpu_used + %s, 3) <= COALESCE(p.quota_cpu, 0))",
    "memory": f"({_NO_QUOTA} OR u.memory_used + %s <= COALESCE(p.quota_memory, 0))",
    "gpu": f"({_NO_QUOTA} OR u.gpu_used + %s <= COALESCE(p.quota_gpu, 0))",
}
_FITS = " AND ".join(_ROOM[dimension] for dimension in _DIMENSIONS)
_RESERVATION = f"'{WindowKind.RESERVATION}'"  # a literal, as the statuses


def _calendar_sql(*, lock: bool) -> str:
    """R-RES-1: the pool's reservations open at the request's time, as two CTEs: ``w``, each
    window with its slots, the slots its holders hold of it and whether the user holds it (its rows
    locked with ``lock``, on PostgreSQL); ``k``, one row: ``held`` (their slots), ``taken`` (held by
    holders), ``window_id`` (the user's open reservation with room, the first by id), ``part`` (the
    slots of the request it takes there) and ``asked``. Parameters: user, user, pool, now, now, the
    slots asked::

        w AS (SELECT id, slots, slots_used, <user holds it> FROM reservation
               WHERE pool = pool AND live AND kind = 'reservation' AND end > now AND start <= now
               [FOR UPDATE])
        k AS (SELECT SUM(slots), SUM(LEAST(slots_used, slots)), <the user's window with room>,
                     LEAST(asked, its room) ... FROM w)

    Served by ``reservations_live_end`` (a pool's live windows that have not ended), whatever the
    pool's past calendar. A reservation that starts or ends while a request runs is read as it is
    at the request's time, the same for every statement of the request. Rows are locked in id
    order, as everywhere a reservation's row is locked (no two admissions wait for each other's).
    """
    w, c, k = _calendar_parts(lock=lock)
    return f"w AS ({w}), c AS ({c.format(w='w')}), k AS ({k.format(c='c', f='w')})"


def _calendar_table() -> str:
    """The same row ``k`` as :func:`_calendar_sql`, as a derived table (``(...) AS k``) with the
    same parameters, for SQLite's statements (its driver counts no row of a statement that starts
    with WITH; the IMMEDIATE transaction serializes them, nothing to lock)."""
    w, c, k = _calendar_parts(lock=False)
    sums = c.format(w=f"({w})")
    return "(" + k.format(c=f"({sums})", f=Reservation._meta.db_table) + ") AS k"


def _calendar_parts(*, lock: bool) -> tuple[str, str, str]:
    """The open reservations (``w``), their sums (``c``, reading ``{w}``) and the row ``k``
    (reading ``{c}`` and the windows ``{f}``), written once for both forms."""
    holder, _ = holder_sql("r")
    locked = " FOR UPDATE" if lock and connection.features.has_select_for_update else ""
    room = "f.slots - f.slots_used"
    w = (
        f"SELECT r.id, r.slots, r.slots_used, {holder} AS mine FROM {Reservation._meta.db_table} r"  # noqa: S608
        f" WHERE r.pool_id = %s AND r.cancelled_at IS NULL AND r.kind = {_RESERVATION}"
        f' AND r."end" > %s AND r.start <= %s ORDER BY r.id{locked}'
    )
    c = (
        "SELECT COALESCE(SUM(w.slots), 0) AS held,"
        " COALESCE(SUM(CASE WHEN w.slots_used < w.slots THEN w.slots_used ELSE w.slots END), 0) AS taken,"
        " MIN(CASE WHEN w.mine AND w.slots_used < w.slots THEN w.id END) AS window_id FROM {w} w"
    )
    k = (
        "SELECT c.held, c.taken, c.window_id, a.asked,"  # noqa: S608 (names from _meta)
        f" COALESCE((SELECT CASE WHEN a.asked < {room} THEN a.asked ELSE {room} END"
        " FROM {f} f WHERE f.id = c.window_id), 0) AS part FROM {c} c, (SELECT CAST(%s AS INTEGER) AS asked) a"
    )
    return w, c, k


def _calendar_params(session: Session, now) -> list:
    at = connection.ops.adapt_datetimefield_value(now)
    return [session.user_id, session.user_id, session.pool_id, at, at, session.slots]


def _amounts(session: Session) -> list:
    return [session.slots, session.cpu, session.memory, session.gpu]


def _fit_params(session: Session) -> list:
    """The parameters of ``_ROOM``'s conditions, in ``_DIMENSIONS`` order."""
    return [session.cpu, session.memory, session.gpu]


def _default_allocation_sql() -> str:
    """R-ALLOC-1: the id of the allocation a user's new session on pool ``p`` spends by default
    (``apps.allocations.selectors.preferred``: one in its period first, the user's own before a
    group's, then the oldest), or NULL; its parameters are the user, the user, now, now."""
    from django.contrib.auth import get_user_model

    from apps.allocations.models import Allocation

    members = get_user_model().groups.through._meta.db_table
    return (
        f"SELECT a.id FROM {Allocation._meta.db_table} a WHERE a.pool_id = p.id"  # noqa: S608 (names from _meta)
        f" AND (a.user_id = %s OR a.group_id IN (SELECT m.group_id FROM {members} m WHERE m.user_id = %s))"
        " ORDER BY CASE WHEN a.starts_at <= %s AND (a.period = 'rolling' OR a.ends_at > %s) THEN 0 ELSE 1 END,"
        " CASE WHEN a.user_id IS NULL THEN 1 ELSE 0 END, a.id LIMIT 1"
    )


def usable_class(user, *, class_id: int | None, pool_name: str | None, check_access: bool, external_id: str, now=None):
    """The chosen class with its pool, the id of ``user``'s active session on that pool for
    ``external_id`` (R-SESS-2) and the id of the allocation a new session there spends by default
    (R-ALLOC-1), or None when there is no such class ``user`` may use::

        SELECT class.*, pool.*, (SELECT id FROM session WHERE active AND user = user
                                    AND pool = pool.id AND external_id = external_id),
               (the user's default allocation on pool.id)
          FROM class JOIN pool
         WHERE class.id = class_id | pool.name = pool_name AND class is the default
           [AND pool.id IN (pools visible to user)]          -- R-POOL-8, when check_access

    The same-job lookup is one probe of the unique index behind R-SESS-2 (its condition written
    out, so that any plan uses it), whatever the user's history of ended sessions.
    """
    params = []
    if external_id:
        same = f"({_same_job_sql('p.id')})"
        params += [user.pk, external_id]
    else:
        same = "NULL"
    at = connection.ops.adapt_datetimefield_value(now or timezone.now())
    params += [user.pk, user.pk, at, at]
    if class_id is not None:
        where = "c.id = %s"
        params.append(class_id)
    else:
        where = 'p.name = %s AND c."default"'
        params.append(pool_name)
    if check_access and not user.is_staff:
        visible, visible_params = visible_pools_sql(user)
        where += f" AND p.id IN ({visible})"
        params += visible_params
    found = fetch_one(
        f"SELECT {_CLASS.sql}, {_POOL.sql}, {same}, ({_default_allocation_sql()})"  # noqa: S608 (names from _meta; values are parameters)
        f" FROM {ResourceClass._meta.db_table} c JOIN {ResourcePool._meta.db_table} p ON p.id = c.pool_id"
        f" WHERE {where} ORDER BY c.id LIMIT 1",
        params,
        _CLASS,
        _POOL,
    )
    if found is None:
        return None
    resource_class, pool, same_job, allocation_id = found
    resource_class.pool = pool
    return resource_class, same_job, allocation_id


def _same_job_sql(pool: str) -> str:
    """R-SESS-2's lookup: the id of the active session of a user's scheduler job on ``pool`` (SQL);
    its parameters are the user and the job id. One probe of the unique index behind R-SESS-2,
    whose condition is written out so that any plan uses it."""
    return (
        f"SELECT s.id FROM {Session._meta.db_table} s WHERE s.status = {_ACTIVE} AND s.external_id <> ''"  # noqa: S608
        f" AND s.user_id = %s AND s.pool_id = {pool} AND s.external_id = %s"
    )


def same_job(user_id: int, pool_id: int, external_id: str):
    """The id of ``user_id``'s active session for ``external_id`` on the pool, or None."""
    with connection.cursor() as cursor:
        cursor.execute(_same_job_sql("%s"), [user_id, pool_id, external_id])
        row = cursor.fetchone()
    return None if row is None else Session._meta.pk.to_python(row[0])


def insert_if_it_fits(session: Session, now=None) -> bool:
    """R-SESS-1 (with R-RES-1): store ``session`` if its pool has room for it at ``now`` (the
    request's time), adding what it holds to the pool's usage and to the reservation it takes
    reserved slots of; False (nothing stored) when it does not fit, or the pool has no usage row
    yet::

        WITH <the open reservations: w (rows locked), k>          -- _calendar_sql
             u AS (UPDATE usage u SET slots_used += slots, cpu_used += cpu, ...
                     FROM pool p, k                             -- its limits, only read
                    WHERE u.pool = session.pool AND p.id = u.pool AND <it fits>
                    RETURNING u.pool, k.window_id, k.part),     -- the usage row's lock
             r AS (UPDATE reservation SET slots_used += u.part FROM u WHERE id = u.window_id)
        INSERT INTO session SELECT <the session's values>, u.window_id, u.part FROM u

    Concurrent admissions on one pool queue on its usage row (and, while a reservation is open,
    on the reservation's row first); each evaluates ``<it fits>`` again on the rows as the one
    before it left them, so the sum never passes the pool's limits. A concurrent identical
    request (same user, pool and scheduler job) fails on the partial unique constraint and the
    whole statement with it (IntegrityError): nothing is counted twice.
    """
    now = now or session.created_at
    usage, pool = PoolUsage._meta.db_table, ResourcePool._meta.db_table
    held = ("reservation_id", "reserved_slots")

    def update(calendar: str) -> str:
        return (
            f"UPDATE {usage} AS u SET slots_used = u.slots_used + %s, cpu_used = ROUND(u.cpu_used + %s, 3),"  # noqa: S608 (names from _meta)
            f" memory_used = u.memory_used + %s, gpu_used = u.gpu_used + %s FROM {pool} AS p, {calendar}"
            f" WHERE u.pool_id = %s AND p.id = u.pool_id AND {_FITS}"
        )

    where_params = [session.pool_id, *_fit_params(session)]
    columns, values = insert_values(session, exclude=held)
    columns += ", " + ", ".join(connection.ops.quote_name(column) for column in held)
    marks = ", ".join(["%s"] * len(values))
    table, windows = Session._meta.db_table, Reservation._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # Atomic on its own; inside a caller's transaction, in a savepoint, so that a conflict
            # (IntegrityError) leaves that transaction usable for the answer.
            with transaction.atomic() if connection.in_atomic_block else nullcontext():
                cursor.execute(
                    f"WITH {_calendar_sql(lock=True)},"  # noqa: S608
                    f" u AS ({update('k')} RETURNING u.pool_id, k.window_id, k.part),"
                    f" r AS (UPDATE {windows} AS r SET slots_used = r.slots_used + u.part FROM u"
                    " WHERE r.id = u.window_id)"
                    f" INSERT INTO {table} ({columns}) SELECT {marks}, u.window_id, u.part FROM u"
                    " RETURNING reservation_id, reserved_slots",
                    [*_calendar_params(session, now), *_amounts(session), *where_params, *values],
                )
                stored = cursor.fetchone()
        else:
            # SQLite: the BEGIN IMMEDIATE transaction serializes every writer. The calendar's row
            # is a derived table of the UPDATE and of the INSERT (SQLite's UPDATE ... FROM returns
            # nothing of its other tables): both read the same windows, which change only here.
            with transaction.atomic():
                cursor.execute(
                    update(_calendar_table()), [*_amounts(session), *_calendar_params(session, now), *where_params]
                )
                stored = None
                if cursor.rowcount == 1:
                    cursor.execute(
                        f"INSERT INTO {table} ({columns}) SELECT {marks}, k.window_id, k.part"  # noqa: S608
                        f" FROM {_calendar_table()} RETURNING reservation_id, reserved_slots",
                        [*values, *_calendar_params(session, now)],
                    )
                    stored = cursor.fetchone()
                    if stored[0] is not None:
                        cursor.execute(
                            f"UPDATE {windows} SET slots_used = slots_used + %s WHERE id = %s",  # noqa: S608
                            [stored[1], stored[0]],
                        )
    if stored:
        session.reservation_id, session.reserved_slots = stored
        session._state.adding, session._state.db = False, connection.alias
    return bool(stored)


def room(session: Session, now) -> dict:
    """Why ``session`` does not fit its pool at ``now``: the pool's limits and usage, the open
    reservations' slots (``held``, ``taken`` by their holders, ``part``: what the session's user
    may take of them) and, for each dimension, whether it has room (``_ROOM``, the rule admission
    admits by)::

        WITH <the open reservations: k> SELECT name, slots_total, quota_*, slots_used, *_used,
               k.held, k.taken, k.part, <room for each dimension>
          FROM pool p JOIN usage u ON u.pool = p.id, k WHERE p.id = session.pool
    """
    checks = ", ".join(_ROOM[dimension] for dimension in _DIMENSIONS)
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH {_calendar_sql(lock=False)} SELECT p.name, p.slots_total, p.quota_cpu, p.quota_memory,"  # noqa: S608
            " p.quota_gpu, k.held, k.taken, k.part, u.slots_used, u.cpu_used,"
            f" u.memory_used, u.gpu_used, {checks} FROM {ResourcePool._meta.db_table} p"
            f" JOIN {PoolUsage._meta.db_table} u ON u.pool_id = p.id CROSS JOIN k WHERE p.id = %s",
            [*_calendar_params(session, now), *_fit_params(session), session.pool_id],
        )
        row = cursor.fetchone()
    name, total, quota_cpu, quota_memory, quota_gpu, held, taken, part, *rest = row
    used, fits = dict(zip(_DIMENSIONS, rest[:4], strict=True)), dict(zip(_DIMENSIONS, rest[4:], strict=True))
    return {
        "pool": name,
        "slots_total": total,
        "quota": {
            "cpu": None if quota_cpu is None else Decimal(str(quota_cpu)),
            "memory": quota_memory,
            "gpu": quota_gpu,
        },
        "used": {**used, "cpu": Decimal(str(used["cpu"]))},
        "reserved": {"held": held, "taken": taken, "part": part},
        "full": [dimension for dimension in _DIMENSIONS if not fits[dimension]],
    }


def lock_active(pool_id: int) -> list[Session]:
    """The pool's active sessions, oldest first, locked until the transaction ends (a window's
    start, R-RES-1), through the partial index of active sessions whatever the pool's history::

        SELECT session.* FROM session WHERE status = 'active' AND pool = pool_id
         ORDER BY created_at, id FOR UPDATE
    """
    lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {_SESSION.sql} FROM {Session._meta.db_table} e WHERE e.status = {_ACTIVE}"  # noqa: S608
            f" AND e.pool_id = %s ORDER BY e.created_at, e.id{lock}",
            [pool_id],
        )
        return [_SESSION.instance(row) for row in cursor.fetchall()]


def lock_usage(pool_id: int) -> int:
    """Lock the pool's usage row until the transaction ends; its ``slots_used``::

    SELECT slots_used FROM usage WHERE pool = pool_id FOR UPDATE
    """
    lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT slots_used FROM {PoolUsage._meta.db_table} WHERE pool_id = %s{lock}", [pool_id])  # noqa: S608
        row = cursor.fetchone()
    return row[0] if row else 0


def attribute(session: Session, window_id: int, part: int) -> None:
    """R-RES-1 at a window's start: ``part`` of ``session``'s slots are held of the reservation
    ``window_id`` from now on (as if admitted during it), and no more of the one it held part of
    before, if any. The caller holds the locks: the session, both reservations, the usage row::

        UPDATE reservation SET slots_used -= session.reserved_slots WHERE id = session.reservation
        UPDATE reservation SET slots_used += part WHERE id = window_id
        UPDATE session SET reservation = window_id, reserved_slots = part WHERE id = session.id
    """
    windows = Reservation._meta.db_table
    with connection.cursor() as cursor:
        if session.reservation_id is not None:
            cursor.execute(
                f"UPDATE {windows} SET slots_used = slots_used - %s WHERE id = %s",  # noqa: S608
                [session.reserved_slots, session.reservation_id],
            )
        cursor.execute(f"UPDATE {windows} SET slots_used = slots_used + %s WHERE id = %s", [part, window_id])  # noqa: S608
    Session.objects.filter(pk=session.pk).update(reservation_id=window_id, reserved_slots=part)
    session.reservation_id, session.reserved_slots = window_id, part


def any_due(pool_id: int, now) -> bool:
    """Whether an active session of the pool is past one of its deadlines (the idle one may still
    be busy with jobs): admission's probe after a refusal, through the partial index of the
    pool's active sessions whatever the pool's history::

        SELECT 1 FROM session WHERE active AND pool = pool_id
           AND (expires_at <= now OR idle_expires_at <= now) LIMIT 1
    """
    at = connection.ops.adapt_datetimefield_value(now)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT 1 FROM {Session._meta.db_table} WHERE status = {_ACTIVE} AND pool_id = %s"  # noqa: S608
            " AND (expires_at <= %s OR idle_expires_at <= %s) LIMIT 1",
            [pool_id, at, at],
        )
        return cursor.fetchone() is not None


def ensure_usage(pool_id: int) -> bool:
    """Give the pool a usage row if it has none (one made by ``bulk_create`` or raw SQL; every
    other pool gets one when it is created); whether this call made it::

        INSERT INTO usage (pool) VALUES (pool_id) ON CONFLICT DO NOTHING
    """
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {PoolUsage._meta.db_table} (pool_id, slots_used, cpu_used, memory_used, gpu_used, repairs)"  # noqa: S608
            f" SELECT id, 0, 0, 0, 0, 0 FROM {ResourcePool._meta.db_table} WHERE id = %s ON CONFLICT DO NOTHING",
            [pool_id],
        )
        return cursor.rowcount == 1


class Ended(NamedTuple):
    """A session :func:`end_sessions` ended (as it is now), with its pool's Slurm licence."""

    session: Session
    slurm_licence: str


def end_sessions(
    session_ids, reason: str, now, *, user_id: int | None = None, pool_name: str | None = None
) -> list[Ended]:
    """End the active sessions among ``session_ids`` (only ``user_id``'s, only on the pool named
    ``pool_name``, when given) and give what they held back to their pools' usage; return those
    this call ended (R-SESS-3/4). A session ended for its lifetime ended at ``expires_at``, not
    when the sweep found it: ``revoked_at`` is the earlier of the two (accounting's slot-hours)::

        WITH ended AS (UPDATE session SET status = 'revoked', revoked_at = now, revocation_reason
                        WHERE id IN session_ids AND status = 'active' [AND user_id = user_id]
                              [AND pool_id = (SELECT id FROM pool WHERE name = pool_name)]
                        RETURNING session.*),
             windows AS (UPDATE reservation r SET slots_used -= their reserved slots  -- R-RES-1
                           FROM (SELECT reservation, SUM(reserved_slots) FROM ended GROUP BY 1) f
                          WHERE r.id = f.reservation RETURNING r.id),
             freed AS (UPDATE usage u SET slots_used -= their sum, ...
                         FROM (SELECT pool_id, SUM(slots), ... FROM ended GROUP BY pool_id) f
                        WHERE u.pool = f.pool_id AND <after windows>)
        SELECT ended.*, pool.slurm_licence FROM ended JOIN pool

    A compare-and-set on ``status``: of two concurrent revokers one ends the session. It waits for
    a row lock a job submission holds on the session, so a submission racing it is either before
    (and its job is cancelled with the session) or refused. Lock order sessions → reservations →
    usage, as admission (reservations → usage) and a window's start: ``freed`` reads ``windows``
    first.
    """
    session_ids = list(session_ids)
    if not session_ids:
        return []
    sessions, pools, usage = Session._meta.db_table, ResourcePool._meta.db_table, PoolUsage._meta.db_table
    windows = Reservation._meta.db_table
    pk = Session._meta.pk
    marks = ", ".join(["%s"] * len(session_ids))
    at = connection.ops.adapt_datetimefield_value(now)
    ended_at, at_params = "%s", [at]
    if reason == RevocationReason.MAX_LIFETIME:
        ended_at, at_params = "CASE WHEN expires_at < %s THEN expires_at ELSE %s END", [at, at]
    update = (
        f"UPDATE {sessions} SET status = %s, revoked_at = {ended_at}, revocation_reason = %s"  # noqa: S608 (names from _meta)
        f" WHERE id IN ({marks}) AND status = {_ACTIVE}"
    )
    params = [
        SessionStatus.REVOKED,
        *at_params,
        reason,
        *(pk.get_db_prep_value(session_id, connection) for session_id in session_ids),
    ]
    if user_id is not None:
        update += " AND user_id = %s"
        params.append(user_id)
    if pool_name is not None:
        update += f" AND pool_id = (SELECT id FROM {pools} WHERE name = %s)"  # noqa: S608 (names from _meta)
        params.append(pool_name)
    update += " RETURNING " + ", ".join(connection.ops.quote_name(field.column) for field in _SESSION.fields)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"WITH e AS ({update}),"  # noqa: S608 (names from _meta)
                f" windows AS (UPDATE {windows} r SET slots_used = r.slots_used - f.reserved"
                " FROM (SELECT reservation_id, SUM(reserved_slots) AS reserved FROM e"
                " WHERE reservation_id IS NOT NULL GROUP BY reservation_id) f"
                " WHERE r.id = f.reservation_id RETURNING r.id),"
                f" freed AS (UPDATE {usage} u SET slots_used = u.slots_used - f.slots, cpu_used = u.cpu_used - f.cpu,"
                " memory_used = u.memory_used - f.memory, gpu_used = u.gpu_used - f.gpu"
                " FROM (SELECT pool_id, SUM(slots) AS slots, SUM(cpu) AS cpu, SUM(memory) AS memory, SUM(gpu) AS gpu"
                " FROM e GROUP BY pool_id) f WHERE u.pool_id = f.pool_id AND (SELECT COUNT(*) FROM windows) >= 0)"
                f" SELECT {_SESSION.sql}, p.slurm_licence FROM e JOIN {pools} p ON p.id = e.pool_id",
                params,
            )
            return [Ended(*split(row, (_SESSION,))) for row in cursor.fetchall()]
        with transaction.atomic(savepoint=False):
            cursor.execute(update, params)
            ended = [_SESSION.instance(row) for row in cursor.fetchall()]
            freed = defaultdict(lambda: [0, Decimal(0), 0, 0])
            for session in ended:
                held = (session.slots, session.cpu, session.memory, session.gpu)
                freed[session.pool_id] = [
                    total + Decimal(str(value)) for total, value in zip(freed[session.pool_id], held, strict=True)
                ]
            reserved = defaultdict(int)
            for session in ended:
                if session.reservation_id is not None:
                    reserved[session.reservation_id] += session.reserved_slots
            for window_id, slots in reserved.items():
                cursor.execute(
                    f"UPDATE {windows} SET slots_used = slots_used - %s WHERE id = %s",  # noqa: S608
                    [slots, window_id],
                )
            licences = {}
            for pool_id, held in freed.items():
                cursor.execute(
                    f"UPDATE {usage} SET slots_used = slots_used - %s, cpu_used = ROUND(cpu_used - %s, 3),"  # noqa: S608
                    " memory_used = memory_used - %s, gpu_used = gpu_used - %s WHERE pool_id = %s"
                    f" RETURNING (SELECT slurm_licence FROM {pools} WHERE id = pool_id)",
                    [int(held[0]), held[1], int(held[2]), int(held[3]), pool_id],
                )
                row = cursor.fetchone()  # none: a pool without a usage row (made by bulk_create)
                if row is None:
                    cursor.execute(f"SELECT slurm_licence FROM {pools} WHERE id = %s", [pool_id])  # noqa: S608
                    row = cursor.fetchone()
                licences[pool_id] = row[0]
        return [Ended(session, licences[session.pool_id]) for session in ended]


def _recount_sql(where: str) -> str:
    """Each pool's usage counters (NULL: no usage row) beside the sums over its active sessions."""
    sessions, pools, usage = Session._meta.db_table, ResourcePool._meta.db_table, PoolUsage._meta.db_table
    return (
        "SELECT p.id, p.name, u.slots_used, u.cpu_used, u.memory_used, u.gpu_used,"  # noqa: S608 (names from _meta)
        " COALESCE(s.slots, 0), COALESCE(s.cpu, 0), COALESCE(s.memory, 0), COALESCE(s.gpu, 0)"
        f" FROM {pools} p LEFT JOIN {usage} u ON u.pool_id = p.id"
        " LEFT JOIN (SELECT pool_id, SUM(slots) AS slots, ROUND(SUM(cpu), 3) AS cpu,"
        f" SUM(memory) AS memory, SUM(gpu) AS gpu FROM {sessions} WHERE status = {_ACTIVE} GROUP BY pool_id) s"
        " ON s.pool_id = p.id"
        f" WHERE {where}"
    )


_DRIFTED = (
    "(u.pool_id IS NULL OR u.slots_used <> COALESCE(s.slots, 0) OR u.cpu_used <> COALESCE(s.cpu, 0)"
    " OR u.memory_used <> COALESCE(s.memory, 0) OR u.gpu_used <> COALESCE(s.gpu, 0))"
)


def drifted_pools() -> list[int]:
    """The pools whose usage counters differ from the sums over their active sessions (or that
    have no usage row), read in one snapshot (in which every counter change and its sessions'
    change are both or neither)::

        SELECT pool.id FROM pool LEFT JOIN usage LEFT JOIN (SUM of active sessions per pool)
         WHERE they differ
    """
    with connection.cursor() as cursor:
        cursor.execute(_recount_sql(_DRIFTED))
        return [row[0] for row in cursor.fetchall()]


def repair_usage(pool_id: int) -> tuple | None:
    """Set the pool's usage counters to the sums over its active sessions if they still differ;
    return (name, counters before, sums) when it repaired them. The usage row is locked first,
    so that the sums are read after every admission and release on it committed::

        SELECT 1 FROM usage WHERE pool = pool_id FOR UPDATE
        SELECT counters, sums (as drifted_pools) WHERE pool.id = pool_id AND they differ
        UPDATE usage SET counters = sums, repairs += 1
    """
    usage = PoolUsage._meta.db_table
    ensure_usage(pool_id)
    with transaction.atomic(), connection.cursor() as cursor:
        lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
        cursor.execute(f"SELECT 1 FROM {usage} WHERE pool_id = %s{lock}", [pool_id])  # noqa: S608 (names from _meta)
        cursor.execute(_recount_sql(f"p.id = %s AND {_DRIFTED}"), [pool_id])
        row = cursor.fetchone()
        if row is None:
            return None
        _, name, *counters = row
        sums = counters[4:]
        cursor.execute(
            f"UPDATE {usage} SET slots_used = %s, cpu_used = %s, memory_used = %s, gpu_used = %s,"  # noqa: S608
            " repairs = repairs + 1 WHERE pool_id = %s",
            [*sums, pool_id],
        )
    return name, counters[:4], sums


def _window_recount_sql(where: str) -> str:
    """Each live reservation's counter beside the reserved slots its active sessions hold."""
    sessions, windows = Session._meta.db_table, Reservation._meta.db_table
    return (
        f"SELECT r.id, r.slots_used, COALESCE(s.held, 0) FROM {windows} r LEFT JOIN"  # noqa: S608 (names from _meta)
        f" (SELECT reservation_id, SUM(reserved_slots) AS held FROM {sessions} WHERE status = {_ACTIVE}"
        " AND reservation_id IS NOT NULL GROUP BY reservation_id) s ON s.reservation_id = r.id"
        f' WHERE r.cancelled_at IS NULL AND r."end" > %s AND r.slots_used <> COALESCE(s.held, 0){where}'
    )


def drifted_windows(now) -> list[int]:
    """The live reservations (not ended) whose ``slots_used`` differs from the reserved slots of
    their active sessions (R-RES-1's counters, recounted like the pools' usage)."""
    with connection.cursor() as cursor:
        cursor.execute(_window_recount_sql(""), [connection.ops.adapt_datetimefield_value(now)])
        return [row[0] for row in cursor.fetchall()]


def repair_window(window_id: int, now) -> tuple | None:
    """Set a reservation's counter to its sessions' reserved slots if it still differs, its row
    locked first (admission and revocation change both under that lock); (before, after) when
    it repaired it."""
    windows = Reservation._meta.db_table
    with transaction.atomic(), connection.cursor() as cursor:
        lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
        cursor.execute(f"SELECT 1 FROM {windows} WHERE id = %s{lock}", [window_id])  # noqa: S608
        cursor.execute(
            _window_recount_sql(" AND r.id = %s"), [connection.ops.adapt_datetimefield_value(now), window_id]
        )
        row = cursor.fetchone()
        if row is None:
            return None
        cursor.execute(f"UPDATE {windows} SET slots_used = %s WHERE id = %s", [row[2], window_id])  # noqa: S608
    return row[1], row[2]
