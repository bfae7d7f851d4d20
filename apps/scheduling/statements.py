"""The statements of a job submission, written by hand (STYLE.md rule 4), each beside its
pseudocode and tested directly (tests/scheduling/test_submission.py).

Why by hand: clients submit many jobs into one session (Pulser's QRMI connection sends one per
entry of a job's parameters), and building these statements with the ORM took longer than
PostgreSQL took to run them (docs/deployment.md, "Sizing").
"""

import uuid
from dataclasses import dataclass

from django.db import connection, transaction

from apps.core.rows import Columns, insert_values, split
from apps.resources.models import ResourcePool
from apps.scheduling.models import UNFINISHED, Device, Job, JobStatus, PoolQueue
from apps.sessions.models import Session, SessionStatus

_POOL = Columns(ResourcePool, "p")
_DEVICE = Columns(Device, "d")


_UNFINISHED = ", ".join(f"'{status}'" for status in sorted(UNFINISHED))  # literals: partial indexes serve them


@dataclass(frozen=True)
class Target:
    """What a submission into a session needs to know of it: its owner, state and deadlines, its
    pool and the pool's devices (the payload is checked against each, R-DEV-1), and on PostgreSQL
    the version of those pool and device rows (``version``: see :func:`_rows_version_sql`)."""

    session_id: uuid.UUID
    user_id: int
    status: str
    revocation_reason: str
    expires_at: object
    idle_expires_at: object
    pool: ResourcePool
    devices: list
    version: str | None
    allocation_id: int | None = None  # R-ALLOC-1: the allocation the session spends, if any


def _rows_version_sql() -> str:
    """PostgreSQL: the version of a pool's configuration and of its devices', as text: ``<pool
    xmin>:<device id>.<xmin>,…`` (devices by id). ``xmin`` is the transaction that wrote a row's
    current version, so any committed change to the pool or to one of its devices (an admin's
    edit, a status pass, a ``QuerySet.update``, raw SQL), and any device added or removed, gives
    another text, with no trigger or signal to forget. Nothing that admission or release writes
    is on these rows (the pool's usage has a row of its own, ``PoolUsage``), so sessions coming
    and going never change it (R-SESS-7). Takes the pool id as its one parameter."""
    devices = (
        "SELECT string_agg(d.id::text || '.' || d.xmin::text, ',' ORDER BY d.id)"  # noqa: S608 (names from _meta)
        f" FROM {Device._meta.db_table} d WHERE d.pool_id = p.id"
    )
    pools = ResourcePool._meta.db_table
    return f"SELECT p.xmin::text || ':' || coalesce(({devices}), '') FROM {pools} p WHERE p.id = %s"  # noqa: S608


def target(session_id: uuid.UUID, pool_name: str | None) -> Target | None:
    """The session ``session_id`` (on the pool named ``pool_name``, for QRMI) with its pool and
    the pool's devices in the model's order (name, then id); None when there is none::

        SELECT session.user, session.status, session.revocation_reason, session's deadlines,
               session.allocation, pool.*, device.*, pool.xmin, device.xmin
          FROM session JOIN pool LEFT JOIN device ON device.pool = pool
         WHERE session.id = session_id [AND pool.name = pool_name] ORDER BY device.name, device.id

    (a row per device, or one row with no device).
    """
    params = [Session._meta.pk.get_db_prep_value(session_id, connection)]
    where = "s.id = %s"
    if pool_name is not None:
        where += " AND p.name = %s"
        params.append(pool_name)
    versioned = connection.vendor == "postgresql"
    xmins = "p.xmin::text, d.xmin::text" if versioned else "NULL, NULL"
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {_POOL.sql}, {_DEVICE.sql}, s.user_id, s.status, s.revocation_reason, s.expires_at,"  # noqa: S608 (names from _meta)
            f" s.idle_expires_at, s.allocation_id, {xmins}"
            f" FROM {Session._meta.db_table} s JOIN {ResourcePool._meta.db_table} p ON p.id = s.pool_id"
            f" LEFT JOIN {Device._meta.db_table} d ON d.pool_id = p.id WHERE {where} ORDER BY d.name, d.id",
            params,
        )
        rows = cursor.fetchall()
    if not rows:
        return None
    pool, first, user_id, status, reason, expires_at, idle_expires_at, allocation_id, pool_xmin, _ = split(
        rows[0], (_POOL, _DEVICE)
    )
    expires_at, idle_expires_at = (_datetime(value) for value in (expires_at, idle_expires_at))
    devices = [first, *(_DEVICE.instance(row[len(_POOL) : len(_POOL) + len(_DEVICE)]) for row in rows[1:])]
    devices = devices if first is not None else []
    version = None
    if versioned:
        xmins = sorted((device.pk, row[-1]) for device, row in zip(devices, rows, strict=False))
        version = f"{pool_xmin}:" + ",".join(f"{pk}.{xmin}" for pk, xmin in xmins)
    return Target(
        session_id, user_id, status, reason, expires_at, idle_expires_at, pool, devices, version, allocation_id
    )


def _datetime(value):
    """A datetime column as the ORM reads it (SQLite returns text)."""
    column = Session._meta.get_field("expires_at").get_col(Session._meta.db_table)
    for converter in connection.ops.get_db_converters(column):
        value = converter(value, column, connection)
    return value


def lock_configuration(session_id: uuid.UUID) -> None:
    """PostgreSQL: hold the session's pool and devices as they are until the transaction ends, so
    that a submission checked against them cannot find them changed::

        SELECT 1 FROM pool WHERE id = session.pool FOR UPDATE    -- no device added meanwhile
        SELECT 1 FROM device WHERE pool = session.pool FOR SHARE  -- none changed or removed

    Lock order: pool, devices, then the session (the submission's statement), as everywhere.
    FOR UPDATE, not a weaker lock: adding a device takes a key-share lock on its pool's row, which
    only FOR UPDATE refuses."""
    pool = f"(SELECT pool_id FROM {Session._meta.db_table} WHERE id = %s)"  # noqa: S608 (names from _meta)
    session_id = Session._meta.pk.get_db_prep_value(session_id, connection)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT 1 FROM {ResourcePool._meta.db_table} WHERE id = {pool} FOR UPDATE", [session_id])  # noqa: S608
        cursor.execute(f"SELECT 1 FROM {Device._meta.db_table} WHERE pool_id = {pool} FOR SHARE", [session_id])  # noqa: S608


def _caught_up_vruntime() -> str:
    """R-SCHED-2, as the value of ``vruntime`` in the submission's session UPDATE (the session's
    table is named ``s`` there): a session that becomes runnable (no pending job before this one)
    starts at max(its vruntime, the pool's virtual time V); one that already had work pending
    keeps its vruntime::

        CASE WHEN the session has a pending job THEN vruntime
             ELSE max(vruntime, the pool queue's vtime, or 0) END

    V is read without locking the pool's queue row: a dispatch committing meanwhile only moves V
    by the vruntime of a session it served, which the next arrival then sees.
    """
    greatest = "GREATEST" if connection.vendor == "postgresql" else "MAX"  # SQLite's scalar max()
    return (
        f"CASE WHEN EXISTS (SELECT 1 FROM {Job._meta.db_table} j"  # noqa: S608 (names from _meta)
        f" WHERE j.session_id = s.id AND j.status = '{JobStatus.PENDING}')"
        " THEN s.vruntime"
        f" ELSE {greatest}(s.vruntime, COALESCE((SELECT q.vtime FROM {PoolQueue._meta.db_table} q"
        " WHERE q.pool_id = s.pool_id), 0)) END"
    )


def renew_and_insert(job: Job, *, user_id: int, now, idle_until, version: str | None) -> tuple[bool, bool | None]:
    """Renew ``job``'s session if it is still ``user_id``'s, active and not due (neither past its
    lifetime nor idle past its deadline with nothing unfinished: R-SESS-7, whether or not a sweep
    has run), and, with ``version``, its pool and devices are still those rows; only then insert
    ``job``. Returns whether the job was stored, and the pool queue's wake-up flag (None: the
    pool has no queue row yet)::

        WITH s AS (UPDATE session s SET last_activity_at = now, idle_expires_at = idle_until,
                          vruntime = caught up (R-SCHED-2)
                    WHERE id = job.session AND user_id = user_id AND status = 'active'
                          AND pool_id = job.pool AND expires_at > now
                          AND (idle_expires_at > now OR EXISTS (an unfinished job of s))
                          [AND (version of the pool and device rows) = version]
                    RETURNING id)
        INSERT INTO job (every column but id) SELECT <the job's values> FROM s
        RETURNING id, (SELECT awaiting_work FROM pool queue WHERE pool_id = job.pool)

    PostgreSQL: one statement, atomic without BEGIN/COMMIT, holding the session's row lock until
    it ends, so that a revocation racing it waits and then cancels the new job. SQLite (no
    data-modifying CTE, no xmin): the UPDATE, the INSERT and the flag's SELECT in one transaction.
    """
    table = Session._meta.db_table
    update = (
        f"UPDATE {table} AS s SET last_activity_at = %s, idle_expires_at = %s,"  # noqa: S608 (names from _meta)
        f" vruntime = {_caught_up_vruntime()} WHERE s.id = %s AND s.user_id = %s"
        f" AND s.status = '{SessionStatus.ACTIVE}' AND s.pool_id = %s AND s.expires_at > %s"
        " AND (s.idle_expires_at > %s OR EXISTS (SELECT 1"
        f" FROM {Job._meta.db_table} j WHERE j.session_id = s.id AND j.status IN ({_UNFINISHED})))"
    )
    at = connection.ops.adapt_datetimefield_value(now)
    params = [
        at,
        connection.ops.adapt_datetimefield_value(idle_until),
        Session._meta.pk.get_db_prep_value(job.session_id, connection),
        user_id,
        job.pool_id,
        at,
        at,
    ]
    columns, values = insert_values(job)
    marks = ", ".join(["%s"] * len(values))
    flag = f"SELECT awaiting_work FROM {PoolQueue._meta.db_table} WHERE pool_id = %s"  # noqa: S608 (names from _meta)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            if version is not None:
                update += f" AND ({_rows_version_sql()}) = %s"
                params += [job.pool_id, version]
            cursor.execute(
                f"WITH s AS ({update} RETURNING s.id) INSERT INTO {Job._meta.db_table} ({columns})"  # noqa: S608
                f" SELECT {marks} FROM s RETURNING id, ({flag})",
                [*params, *values, job.pool_id],
            )
            inserted = cursor.fetchone()
        else:
            with transaction.atomic(savepoint=False):
                cursor.execute(update, params)
                inserted = None
                if cursor.rowcount:
                    cursor.execute(f"INSERT INTO {Job._meta.db_table} ({columns}) VALUES ({marks})", values)  # noqa: S608
                    job_id = cursor.lastrowid
                    cursor.execute(flag, [job.pool_id])
                    row = cursor.fetchone()
                    inserted = (job_id, row[0] if row else None)
    if inserted is None:
        return False, None
    job.pk = inserted[0]
    job._state.adding, job._state.db = False, connection.alias
    return True, inserted[1]


def any_unfinished(session_ids) -> bool:
    """Whether a job of ``session_ids`` is pending or running (the common release has none, and
    then costs this probe only)::

        SELECT 1 FROM job WHERE session IN session_ids AND status IN (pending, running) LIMIT 1
    """
    marks = ", ".join(["%s"] * len(session_ids))
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT 1 FROM {Job._meta.db_table} WHERE session_id IN ({marks})"  # noqa: S608 (names from _meta)
            f" AND status IN ({_UNFINISHED}) LIMIT 1",
            [Session._meta.pk.get_db_prep_value(pk, connection) for pk in session_ids],
        )
        return cursor.fetchone() is not None
