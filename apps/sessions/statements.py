"""The statements of session admission and revocation, written by hand (STYLE.md rule 4), each
beside its pseudocode and tested directly (tests/sessions/test_statements.py).

Why by hand: a batch system's prolog and epilog acquire and release a session for every job, and
building these statements with the ORM took longer than PostgreSQL took to run them
(docs/deployment.md, "Sizing"). The capacity rule (R-SESS-1) is written once, in ``_ROOM``: the
admission statement admits by it and a refusal reports which part of it failed.

A pool's usage lives on its row (``slots_used``, ``cpu_used``, ``memory_used``, ``gpu_used``),
changed only here, in the same statement that inserts or ends the sessions it counts: admission is
one conditional UPDATE of the pool row (which serializes admission per pool) inserting the
session, revocation one UPDATE of the sessions giving their holdings back. The sum over the
active sessions is kept only as the recount the expiry sweep compares with them.

PostgreSQL runs each as one statement (data-modifying CTEs): atomic without BEGIN/COMMIT, the
pool's row lock held for the statement only. SQLite has no data-modifying CTE: there each is two
statements in the (IMMEDIATE) transaction that serializes every writer.
"""

import uuid
from collections import defaultdict
from contextlib import nullcontext
from decimal import Decimal
from typing import NamedTuple

from django.db import connection, transaction

from apps.core.rows import Columns, fetch_one, insert_values
from apps.resources.models import ResourceClass, ResourcePool, visible_pools_sql
from apps.sessions.models import Session, SessionStatus

_CLASS = Columns(ResourceClass, "c")
_POOL = Columns(ResourcePool, "p")
_DIMENSIONS = ("slots", "cpu", "memory", "gpu")

# R-SESS-1, per dimension, on the pool row's columns, each with one parameter: the amount asked.
# A pool with neither a CPU nor a memory quota has no quota at all (ResourcePool.has_quota).
_NO_QUOTA = "(quota_cpu IS NULL AND quota_memory IS NULL)"
_ROOM = {
    "slots": "(slots_total IS NULL OR slots_used + %s <= slots_total)",
    # ROUND: SQLite adds decimals as floats (0.1 + 0.2 > 0.3); the column has 3 places.
    "cpu": f"({_NO_QUOTA} OR ROUND(cpu_used + %s, 3) <= COALESCE(quota_cpu, 0))",
    "memory": f"({_NO_QUOTA} OR memory_used + %s <= COALESCE(quota_memory, 0))",
    "gpu": f"({_NO_QUOTA} OR gpu_used + %s <= COALESCE(quota_gpu, 0))",
}
_FITS = " AND ".join(_ROOM[dimension] for dimension in _DIMENSIONS)


def _amounts(session: Session) -> list:
    return [session.slots, session.cpu, session.memory, session.gpu]


def usable_class(user, *, class_id: int | None, pool_name: str | None, check_access: bool, external_id: str):
    """The chosen class with its pool, and the id of ``user``'s active session for
    ``external_id`` (R-SESS-2), or None when there is no such class ``user`` may use::

        SELECT class.*, pool.*, (SELECT id FROM session
                                  WHERE active AND user = user AND external_id = external_id)
          FROM class JOIN pool
         WHERE class.id = class_id | pool.name = pool_name AND class is the default
           [AND pool.id IN (pools visible to user)]          -- R-POOL-8, when check_access
    """
    params = []
    if external_id:
        same = (
            f"(SELECT s.id FROM {Session._meta.db_table} s"  # noqa: S608 (names from _meta; values are parameters)
            " WHERE s.status = %s AND s.user_id = %s AND s.external_id = %s LIMIT 1)"
        )
        params += [SessionStatus.ACTIVE, user.pk, external_id]
    else:
        same = "NULL"
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
        f"SELECT {_CLASS.sql}, {_POOL.sql}, {same}"  # noqa: S608 (names from _meta; values are parameters)
        f" FROM {ResourceClass._meta.db_table} c JOIN {ResourcePool._meta.db_table} p ON p.id = c.pool_id"
        f" WHERE {where} ORDER BY c.id LIMIT 1",
        params,
        _CLASS,
        _POOL,
    )
    if found is None:
        return None
    resource_class, pool, same_job = found
    resource_class.pool = pool
    return resource_class, same_job


def insert_if_it_fits(session: Session) -> bool:
    """R-SESS-1: store ``session`` if its pool has room for it, adding what it holds to the
    pool's usage; False (nothing stored) when it does not fit::

        WITH p AS (UPDATE pool SET slots_used += slots, cpu_used += cpu, ...
                    WHERE id = session.pool AND <it fits>       -- the pool's row lock
                    RETURNING id)
        INSERT INTO session SELECT <the session's values> FROM p

    Concurrent admissions on one pool queue on its row; each evaluates ``<it fits>`` again on
    the row as the one before it left it, so the sum never passes the pool's limits. A concurrent
    identical request (same user and scheduler job) fails on the partial unique constraint and
    the whole statement with it (IntegrityError): nothing is counted twice.
    """
    pool = ResourcePool._meta.db_table
    update = (
        f"UPDATE {pool} SET slots_used = slots_used + %s, cpu_used = ROUND(cpu_used + %s, 3),"  # noqa: S608 (names from _meta)
        f" memory_used = memory_used + %s, gpu_used = gpu_used + %s WHERE id = %s AND {_FITS}"
    )
    update_params = [*_amounts(session), session.pool_id, *_amounts(session)]
    columns, values = insert_values(session)
    marks = ", ".join(["%s"] * len(values))
    table = Session._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # Atomic on its own; inside a caller's transaction, in a savepoint, so that a conflict
            # (IntegrityError) leaves that transaction usable for the answer.
            with transaction.atomic() if connection.in_atomic_block else nullcontext():
                cursor.execute(
                    f"WITH p AS ({update} RETURNING id) INSERT INTO {table} ({columns}) SELECT {marks} FROM p",  # noqa: S608
                    [*update_params, *values],
                )
            stored = cursor.rowcount == 1
        else:
            with transaction.atomic():
                cursor.execute(update, update_params)
                stored = cursor.rowcount == 1
                if stored:
                    cursor.execute(f"INSERT INTO {table} ({columns}) VALUES ({marks})", values)  # noqa: S608
    if stored:
        session._state.adding, session._state.db = False, connection.alias
    return stored


def room(session: Session) -> dict:
    """Why ``session`` does not fit its pool now: the pool's limits and usage and, for each
    dimension, whether it has room (``_ROOM``, the rule admission admits by)::

        SELECT name, slots_total, quota_*, slots_used, *_used, <room for each dimension> FROM pool
    """
    checks = ", ".join(_ROOM[dimension] for dimension in _DIMENSIONS)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name, slots_total, quota_cpu, quota_memory, quota_gpu, slots_used, cpu_used, memory_used,"  # noqa: S608
            f" gpu_used, {checks} FROM {ResourcePool._meta.db_table} WHERE id = %s",
            [*_amounts(session), session.pool_id],
        )
        row = cursor.fetchone()
    name, total, quota_cpu, quota_memory, quota_gpu, *rest = row
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
        "full": [dimension for dimension in _DIMENSIONS if not fits[dimension]],
    }


class Ended(NamedTuple):
    """A session :func:`end_sessions` ended, with what its pool's Slurm licence depends on."""

    id: uuid.UUID
    pool_id: int
    external_id: str
    slurm_licence: str


def end_sessions(session_ids, reason: str, now, *, user_id: int | None = None) -> list[Ended]:
    """End the active sessions among ``session_ids`` (only ``user_id``'s, when given) and give
    what they held back to their pools; return those this call ended (R-SESS-3/4)::

        WITH ended AS (UPDATE session SET status = 'revoked', revoked_at = now, revocation_reason
                        WHERE id IN session_ids AND status = 'active' [AND user_id = user_id]
                        RETURNING id, pool_id, external_id, slots, cpu, memory, gpu),
             freed AS (UPDATE pool SET slots_used -= their sum, ... FROM ended GROUP BY pool
                        RETURNING id, slurm_licence)
        SELECT ended.id, pool_id, external_id, slurm_licence FROM ended JOIN freed

    A compare-and-set on ``status``: of two concurrent revokers one ends the session. It waits for
    a row lock a job submission holds on the session, so a submission racing it is either before
    (and its job is cancelled with the session) or refused.
    """
    session_ids = list(session_ids)
    if not session_ids:
        return []
    sessions, pools = Session._meta.db_table, ResourcePool._meta.db_table
    pk = Session._meta.pk
    marks = ", ".join(["%s"] * len(session_ids))
    update = (
        f"UPDATE {sessions} SET status = %s, revoked_at = %s, revocation_reason = %s"  # noqa: S608 (names from _meta)
        f" WHERE id IN ({marks}) AND status = %s"
    )
    params = [
        SessionStatus.REVOKED,
        connection.ops.adapt_datetimefield_value(now),
        reason,
        *(pk.get_db_prep_value(session_id, connection) for session_id in session_ids),
        SessionStatus.ACTIVE,
    ]
    if user_id is not None:
        update += " AND user_id = %s"
        params.append(user_id)
    update += " RETURNING id, pool_id, external_id, slots, cpu, memory, gpu"
    give_back = (
        f"UPDATE {pools} SET slots_used = slots_used - %s, cpu_used = ROUND(cpu_used - %s, 3),"  # noqa: S608 (names from _meta)
        " memory_used = memory_used - %s, gpu_used = gpu_used - %s WHERE id = %s RETURNING slurm_licence"
    )
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"WITH ended AS ({update}),"  # noqa: S608 (names from _meta)
                f" freed AS (UPDATE {pools} p SET slots_used = p.slots_used - f.slots, cpu_used = p.cpu_used - f.cpu,"
                " memory_used = p.memory_used - f.memory, gpu_used = p.gpu_used - f.gpu"
                " FROM (SELECT pool_id, SUM(slots) AS slots, SUM(cpu) AS cpu, SUM(memory) AS memory, SUM(gpu) AS gpu"
                " FROM ended GROUP BY pool_id) f WHERE p.id = f.pool_id RETURNING p.id, p.slurm_licence)"
                " SELECT e.id, e.pool_id, e.external_id, f.slurm_licence FROM ended e JOIN freed f ON f.id = e.pool_id",
                params,
            )
            return [Ended(pk.to_python(row[0]), *row[1:]) for row in cursor.fetchall()]
        with transaction.atomic(savepoint=False):
            cursor.execute(update, params)
            rows = cursor.fetchall()
            freed = defaultdict(lambda: [0, Decimal(0), 0, 0])
            for _, pool_id, _, *held in rows:
                freed[pool_id] = [
                    total + Decimal(str(value)) for total, value in zip(freed[pool_id], held, strict=True)
                ]
            licences = {}
            for pool_id, held in freed.items():
                cursor.execute(give_back, [int(held[0]), held[1], int(held[2]), int(held[3]), pool_id])
                licences[pool_id] = cursor.fetchone()[0]
        return [Ended(pk.to_python(row[0]), row[1], row[2], licences[row[1]]) for row in rows]


def _recount_sql(where: str) -> str:
    """Each pool's usage counters beside the sums over its active sessions."""
    sessions, pools = Session._meta.db_table, ResourcePool._meta.db_table
    return (
        "SELECT p.id, p.name, p.slots_used, p.cpu_used, p.memory_used, p.gpu_used,"  # noqa: S608 (names from _meta)
        " COALESCE(u.slots, 0), COALESCE(u.cpu, 0), COALESCE(u.memory, 0), COALESCE(u.gpu, 0)"
        f" FROM {pools} p LEFT JOIN (SELECT pool_id, SUM(slots) AS slots, ROUND(SUM(cpu), 3) AS cpu,"
        f" SUM(memory) AS memory, SUM(gpu) AS gpu FROM {sessions} WHERE status = %s GROUP BY pool_id) u"
        " ON u.pool_id = p.id"
        f" WHERE {where}"
    )


_DRIFTED = (
    "(p.slots_used <> COALESCE(u.slots, 0) OR p.cpu_used <> COALESCE(u.cpu, 0)"
    " OR p.memory_used <> COALESCE(u.memory, 0) OR p.gpu_used <> COALESCE(u.gpu, 0))"
)


def drifted_pools() -> list[int]:
    """The pools whose usage counters differ from the sums over their active sessions, read in
    one snapshot (in which every counter change and its sessions' change are both or neither)::

        SELECT pool.id FROM pool LEFT JOIN (SUM of active sessions per pool) WHERE they differ
    """
    with connection.cursor() as cursor:
        cursor.execute(_recount_sql(_DRIFTED), [SessionStatus.ACTIVE])
        return [row[0] for row in cursor.fetchall()]


def repair_usage(pool_id: int) -> tuple | None:
    """Set the pool's usage counters to the sums over its active sessions if they still differ;
    return (name, counters before, sums) when it repaired them. The pool's row is locked first,
    so that the sums are read after every admission and release on it committed::

        SELECT 1 FROM pool WHERE id = pool_id FOR UPDATE
        SELECT counters, sums (as drifted_pools) WHERE pool.id = pool_id AND they differ
        UPDATE pool SET counters = sums, usage_repairs += 1
    """
    pools = ResourcePool._meta.db_table
    with transaction.atomic(), connection.cursor() as cursor:
        lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
        cursor.execute(f"SELECT 1 FROM {pools} WHERE id = %s{lock}", [pool_id])  # noqa: S608 (names from _meta)
        cursor.execute(_recount_sql(f"p.id = %s AND {_DRIFTED}"), [SessionStatus.ACTIVE, pool_id])
        row = cursor.fetchone()
        if row is None:
            return None
        _, name, *counters = row
        sums = counters[4:]
        cursor.execute(
            f"UPDATE {pools} SET slots_used = %s, cpu_used = %s, memory_used = %s, gpu_used = %s,"  # noqa: S608
            " usage_repairs = usage_repairs + 1 WHERE id = %s",
            [*sums, pool_id],
        )
    return name, counters[:4], sums
