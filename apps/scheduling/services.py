"""Job submission, cancellation and the dispatcher (SPEC §5).

Claim, commit, call, record: every state change happens in a short transaction guarded by a
compare-and-set on the job's status; driver calls (submit, poll, cancel) happen with no
transaction open (R-SCHED-4).
"""

import logging
import threading
import uuid
from collections import OrderedDict
from contextlib import contextmanager, nullcontext
from datetime import datetime, timedelta

from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.db.models import Case, Count, Exists, F, OuterRef, Q, Subquery, When
from django.db.models.functions import Coalesce
from django.utils import timezone

from apps.core.exceptions import Conflict, Forbidden, NotFound, ServiceError
from apps.core.rows import Columns, prepared, split
from apps.core.tasks import enqueue
from apps.resources.models import ResourcePool
from apps.scheduling import latency
from apps.scheduling.drivers import (
    DriverError,
    DriverState,
    InvalidPayload,
    PermanentDriverError,
    TransientDriverError,
    get_driver,
)
from apps.scheduling.models import UNFINISHED, Device, Job, JobStatus, LatencyKind, PoolQueue
from apps.scheduling.strategies import caught_up_vruntime_sql, strategy_for
from apps.sessions.models import Session, SessionStatus
from apps.sessions.services import is_retryable, retry_aborted

log = logging.getLogger(__name__)


def lease() -> timedelta:
    """A claim not renewed for this long belongs to a dead worker (GRIDGATE_JOB_LEASE_SECONDS)."""
    return timedelta(seconds=settings.GRIDGATE_JOB_LEASE_SECONDS)


def claim_token() -> str:
    """A claim's owner (``Job.lease_owner``): one per dispatch or poll pass."""
    return uuid.uuid4().hex


@contextmanager
def kept_claimed(job_ids, owner: str):
    """Renew, every quarter of the lease, the claims ``owner`` still holds among ``job_ids``,
    while driver calls run (one hand-over, or a whole poll pass).

    A provider call may take minutes (a QPU's timeouts and retries); without renewal the lease
    would have to outlast the slowest call, and a job whose worker died would wait that long
    (it was 5 minutes). A poll pass calls the provider for up to POLL_BATCH jobs one after the
    other, so the whole batch is renewed, not only the job whose call runs: else the later jobs
    of a slow batch lapse and another worker claims them too. One UPDATE per renewal whatever the
    batch size, and none at all unless the calls outlast a quarter of the lease (the common, fast
    pass costs a thread start and no statement). Only rows still carrying ``owner`` are renewed:
    a job already recorded (its claim cleared) or taken over by another worker stays as it is."""
    job_ids = list(job_ids)
    stop = threading.Event()

    def beat():
        try:
            period = settings.GRIDGATE_JOB_LEASE_SECONDS / 4
            while not stop.wait(period):
                try:
                    Job.objects.filter(id__in=job_ids, lease_owner=owner, status=JobStatus.RUNNING).update(
                        lease_until=timezone.now() + lease()
                    )
                except Exception:  # the database is away: the claims may lapse; the writes check them
                    log.warning("renewing the claims of %s on %s jobs failed", owner, len(job_ids), exc_info=True)
                    connection.close()  # a connection the outage broke: the next renewal opens a new one
        finally:
            connection.close()  # this thread's own connection, if it opened one

    thread = threading.Thread(target=beat, name=f"job-claims-{owner[:8]}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


MAX_TRANSIENT_ATTEMPTS = 5
DISPATCH_BATCH = 100
POLL_BATCH = 200


def busy_condition():
    """Sessions with pending or running jobs are never idle-expired (R-SESS-3)."""
    return Q(Exists(Job.objects.filter(session_id=OuterRef("pk"), status__in=UNFINISHED)))


def _lock_queue(pool_id: int) -> PoolQueue:
    PoolQueue.objects.get_or_create(pool_id=pool_id)
    return PoolQueue.objects.select_for_update().get(pool_id=pool_id)


# -- dispatcher wake-up ----------------------------------------------------------------------
def _enqueue_run_pool(pool_id: int) -> None:
    """Enqueue a pass for the pool, once the transaction commits. A broker failure never turns
    a committed request into a 500: it is logged and the sweep (every GRIDGATE_DISPATCH_TICK s)
    catches up."""

    def send():
        try:
            enqueue("apps.scheduling.tasks.run_pool", pool_id)  # no transaction open: sends now
        except Exception:
            log.exception("pool %s: could not enqueue a dispatch pass; the sweep will catch up", pool_id)

    transaction.on_commit(send)


def _wake_if_waiting(pool_id: int) -> None:
    """R-SCHED-5 on submission, coalesced: wake the dispatcher only when its last pass left a
    device free with nothing to run, and only once (compare-and-set on the flag: of many
    submissions arriving together, one enqueues). While every device is busy no task is sent:
    the job-finished event dispatches. Called after the submission committed, so it never takes
    the queue row while holding the session (lock order: pool queue → session → job)."""

    def wake():
        try:
            if PoolQueue.objects.filter(pool_id=pool_id, awaiting_work=True).update(awaiting_work=False):
                enqueue("apps.scheduling.tasks.run_pool", pool_id)
        except Exception:
            log.exception("pool %s: could not wake the dispatcher; the sweep will catch up", pool_id)

    transaction.on_commit(wake)


def _queue_flag(pool) -> bool | None:
    """SQLite: the wake-up flag as read with the session (the lookup joins the pool queue); None:
    the pool has no queue row yet."""
    try:
        return pool.queue.awaiting_work
    except PoolQueue.DoesNotExist:
        return None


# -- submission and cancellation -------------------------------------------------------------
def validate_job(
    pool: ResourcePool, payload, shots: int, target_device: Device | None, devices: list[Device] | None = None
) -> None:
    """R-JOB-1, R-DEV-1: the payload is checked by every device that may take the job (the one it
    names, else every device of the pool, since the dispatcher gives it to any free one: ``devices``
    when the caller has read them, else read here); InvalidPayload → 400. A pool without any
    device would keep the job pending forever: 400 too."""
    if target_device:
        devices = [target_device]
    elif devices is None:
        devices = _pool_devices(pool.pk)
    if not devices:
        raise InvalidPayload(f"Pool '{pool.name}' has no device to run jobs: ask an administrator to add one.")
    for device in devices:
        get_driver(device.driver).validate_payload(device, payload, shots)


_SESSION = Columns(Session, "s")
_POOL = Columns(ResourcePool, "p")
_QUEUE = Columns(PoolQueue, "q")
_DEVICE = Columns(Device, "d")


def _pool_devices(pool_id: int) -> list[Device]:
    """The pool's devices, for the payload check of every submission (``SELECT device.* WHERE
    pool = pool_id`` in the model's order, name then id): written by hand like the other
    statements of the submission's common path, which the ORM's ~0.4 ms of building it would
    otherwise outweigh."""
    with connection.cursor() as cursor:
        sql = f"SELECT {_DEVICE.sql} FROM {Device._meta.db_table} d WHERE d.pool_id = %s ORDER BY d.name, d.id"  # noqa: S608
        cursor.execute(sql, [pool_id])
        return [_DEVICE.instance(row) for row in cursor.fetchall()]


def _rows_version_sql() -> str:
    """PostgreSQL: the version of a pool's row and of its devices' rows, as text: ``<pool
    xmin>:<device id>.<xmin>,…`` (devices by id). ``xmin`` is the transaction that wrote a row's
    current version, so any committed change to the pool or to one of its devices (an admin's
    edit, a status pass, a ``QuerySet.update``, raw SQL), and any device added or removed, gives
    another text, with no trigger or signal to forget. Takes the pool id as its one parameter."""
    devices = (
        "SELECT string_agg(d.id::text || '.' || d.xmin::text, ',' ORDER BY d.id)"  # noqa: S608 (names from _meta)
        f" FROM {Device._meta.db_table} d WHERE d.pool_id = p.id"
    )
    pools = ResourcePool._meta.db_table
    return f"SELECT p.xmin::text || ':' || coalesce(({devices}), '') FROM {pools} p WHERE p.id = %s"  # noqa: S608


def _rows_version(pool_xmin, device_xmins) -> str:
    """What :func:`_rows_version_sql` gives, from the values a lookup read: (device id, xmin) pairs."""
    return f"{pool_xmin}:" + ",".join(f"{pk}.{xmin}" for pk, xmin in sorted(device_xmins))


def session_for_submission(session_id, *, pool_name: str | None = None) -> Session | None:
    """The session a job is submitted into, with its pool, the pool queue's wake-up flag (SQLite's
    submission reads it here; PostgreSQL's insert returns it) and the pool's devices
    (``session.pool_devices``, in the model's order: name, then id) in one statement, one of the
    three of the common path when the session is not known_session's; None if there is no such
    session (or none on the pool named ``pool_name``, for QRMI). Owner and status are
    submit_job's::

        SELECT session.*, pool.*, queue.*, device.*, pool.xmin, device.xmin FROM session JOIN pool
          LEFT JOIN pool queue LEFT JOIN device ON device.pool = pool
         WHERE session.id = session_id [AND pool.name = pool_name] ORDER BY device.name, device.id

    (a row per device, or one row with no device). On PostgreSQL ``session.rows_version`` is the
    version of the pool and device rows read (see :func:`known_session`); None elsewhere.
    Written by hand (STYLE.md rule 4): the ORM spent ~0.9 ms of CPU building this join on every
    submission, and the devices were a statement of their own (issue 15, bench/http_load.py).
    """
    try:
        session_id = uuid.UUID(str(session_id))
    except ValueError:
        return None
    params = [Session._meta.pk.get_db_prep_value(session_id, connection)]
    where = "s.id = %s"
    if pool_name is not None:
        where += " AND p.name = %s"
        params.append(pool_name)
    versioned = connection.vendor == "postgresql"
    xmins = "p.xmin::text, d.xmin::text" if versioned else "NULL, NULL"
    sql = (
        f"SELECT {_SESSION.sql}, {_POOL.sql}, {_QUEUE.sql}, {_DEVICE.sql}, {xmins} FROM {Session._meta.db_table} s"  # noqa: S608 (names from _meta)
        f" JOIN {ResourcePool._meta.db_table} p ON p.id = s.pool_id"
        f" LEFT JOIN {PoolQueue._meta.db_table} q ON q.pool_id = p.id"
        f" LEFT JOIN {Device._meta.db_table} d ON d.pool_id = p.id WHERE {where} ORDER BY d.name, d.id"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    if not rows:
        return None
    session, pool, queue, first, pool_xmin, _ = split(rows[0], (_SESSION, _POOL, _QUEUE, _DEVICE))
    session.pool = pool
    ResourcePool.queue.related.set_cached_value(pool, queue)  # None: the pool never had a job
    at = len(rows[0]) - len(_DEVICE) - 2
    session.pool_devices = [first, *(_DEVICE.instance(row[at:-2]) for row in rows[1:])] if first else []
    device_xmins = [(device.pk, row[-1]) for device, row in zip(session.pool_devices, rows, strict=False)]
    session.rows_version = _rows_version(pool_xmin, device_xmins) if versioned else None
    return session


# -- sessions this process has submitted into ------------------------------------------------
KNOWN_SESSIONS = 10_000  # per process, the least recently used forgotten first: ~150 bytes each
_known_lock = threading.Lock()
_known_sessions = OrderedDict()  # session id -> (user id, pool id)
_known_pools = {}  # pool id -> (rows version, pool, devices): the latest read, shared by its sessions


def known_session(session_id, user, *, pool_name: str | None = None) -> Session | None:
    """The session ``user`` submitted a job into before through this process, from memory, with
    its pool and the pool's devices as last read; None if this process knows no such session of
    ``user``'s (on ``pool_name``), or off PostgreSQL: the caller reads it (session_for_submission).

    Issue 15: reading the session, its pool and the pool's devices (for R-DEV-1's payload check)
    was ~0.22 ms of a REST submission's ~1.7 ms of web CPU and one of its three statements, and
    clients submit many jobs into one session (Pulser's QRMI connection: one per entry of a job's
    ``job_params``). Nothing remembered is trusted: submit_job checks the payload against the
    devices remembered, then its statement inserts the job only if the session is still
    ``user``'s, active, on that pool, and the pool's and devices' rows are still the versions
    that were read (PostgreSQL's ``xmin``: :func:`_rows_version_sql`). Anything else (ended,
    changed, or a payload refused) starts the submission over from the database, so the answer
    is the one the path without memory gives. Only a lookup made outside any transaction block
    is remembered: the rows it read were committed, and their ``xmin`` transactions write no
    more, so an equal version means the same rows (a transaction that changed a device twice
    could otherwise give both states one version). bench/http_load.py, interleaved with the
    path without memory (8 clients): REST submissions 0.46-0.52 of the floor against 0.39-0.47.
    """
    if connection.vendor != "postgresql":
        return None
    try:
        session_id = uuid.UUID(str(session_id))
    except ValueError:
        return None
    with _known_lock:
        known = _known_sessions.get(session_id)
        if known is None or known[0] != user.pk:
            return None
        version, pool, devices = _known_pools[known[1]]
        if pool_name is not None and pool.name != pool_name:
            return None
        _known_sessions.move_to_end(session_id)
    session = Session(id=session_id, user_id=user.pk, pool_id=pool.pk, status=SessionStatus.ACTIVE)
    session.pool, session.pool_devices, session.rows_version, session.remembered = pool, devices, version, True
    session.asked_pool_name = pool_name
    return session


def _remember(session: Session) -> None:
    """After a submission that read ``session`` from the database (PostgreSQL)."""
    with _known_lock:
        _known_pools[session.pool_id] = (session.rows_version, session.pool, session.pool_devices)
        _known_sessions[session.pk] = (session.user_id, session.pool_id)
        _known_sessions.move_to_end(session.pk)
        if len(_known_sessions) > KNOWN_SESSIONS:
            _known_sessions.popitem(last=False)


def _forget(session_id) -> None:
    with _known_lock:
        _known_sessions.pop(session_id, None)


def _update_and_insert(
    session_id, user_id, now: datetime, idle_until: datetime, job: Job, *, pool_version: tuple | None = None
) -> tuple[bool, bool | None]:
    """Renew the session if it is still ``user_id``'s and active, and only then insert ``job``;
    with ``pool_version`` (pool id, rows version: PostgreSQL), only if the session is on that pool
    and its rows are still that version. Returns whether the job was inserted and, on
    PostgreSQL, the pool queue's wake-up flag read by the same statement (None: no queue row, or
    SQLite).

    PostgreSQL, one statement: one round trip, atomic without BEGIN/COMMIT, holding the
    session's row lock until it ends, so a revocation racing it waits and then cancels the new
    job::

        WITH s AS (UPDATE session SET last_activity_at = now, idle_expires_at = idle_until,
                          vruntime = caught up (R-SCHED-2)
                    WHERE id = session_id AND user_id = user_id AND status = 'active'
                          [AND pool_id = pool AND (rows version of pool) = version]
                    RETURNING id)
        INSERT INTO scheduling_job (every column but id) SELECT <the job's values> FROM s
        RETURNING id, (SELECT awaiting_work FROM pool queue WHERE pool_id = job's pool)

    SQLite (no data-modifying CTE): the UPDATE, then ``save()``, in one transaction. Written by
    hand (STYLE.md rule 4): compiling it with the ORM cost ~3 ms of CPU per submission, more
    than half of its server time (issue 15, bench/http_load.py). The job's values are prepared
    by its own fields, as ``save()`` prepares them; tests/scheduling/test_submission.py reads
    every column back.
    """
    ops, table = connection.ops, Session._meta.db_table
    update = (
        f"UPDATE {table} SET last_activity_at = %s, idle_expires_at = %s,"  # noqa: S608 (names from _meta)
        f" vruntime = {caught_up_vruntime_sql(table)} WHERE id = %s AND user_id = %s AND status = %s"
    )
    params = [
        ops.adapt_datetimefield_value(now),
        ops.adapt_datetimefield_value(idle_until),
        Session._meta.pk.get_db_prep_value(session_id, connection),
        user_id,
        SessionStatus.ACTIVE,
    ]
    if connection.vendor != "postgresql":
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(update, params)
            if not cursor.rowcount:
                return False, None
            job.save(force_insert=True)
            return True, None
    if pool_version is not None:
        update += f" AND pool_id = %s AND ({_rows_version_sql()}) = %s"
        params += [pool_version[0], pool_version[0], pool_version[1]]
    fields = [field for field in Job._meta.concrete_fields if field is not Job._meta.pk]
    columns = ", ".join(ops.quote_name(field.column) for field in fields)
    values = prepared(job, fields)
    sql = (
        f"WITH s AS ({update} RETURNING id) INSERT INTO {Job._meta.db_table} ({columns})"  # noqa: S608 (names from _meta)
        f" SELECT {', '.join(['%s'] * len(fields))} FROM s"
        f" RETURNING id, (SELECT awaiting_work FROM {PoolQueue._meta.db_table} WHERE pool_id = %s)"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, *values, job.pool_id])
        inserted = cursor.fetchone()
    if inserted is None:
        return False, None
    job.pk = inserted[0]
    job._state.adding, job._state.db = False, connection.alias
    return True, inserted[1]


def _awaits_work(pool_id: int, flag: bool | None) -> bool:
    """The pool queue's wake-up flag as read with the submission; None: the pool never had a
    job, so it has no queue row yet: create it (a new queue awaits work)."""
    if flag is None:
        PoolQueue.objects.get_or_create(pool_id=pool_id)
        return True
    return flag


def _queued_job(session: Session, payload, shots: int, target_device: Device | None, now: datetime) -> Job:
    return Job(
        session_id=session.pk,
        pool_id=session.pool_id,
        user_id=session.user_id,
        payload=payload,
        shots=shots,
        target_device=target_device,
        created_at=now,
    )


def _submit_remembered(user, session: Session, payload, shots: int) -> Job | None:
    """submit_job for a session of :func:`known_session`: the job, or None when anything differs
    from what was remembered or the payload is refused (the caller starts over from the
    database and gives the uncached path's answer)."""
    pool = session.pool
    try:
        validate_job(pool, payload, shots, None, session.pool_devices)
    except (DriverError, ServiceError):
        return None
    now = timezone.now()
    job = _queued_job(session, payload, shots, None, now)
    idle_until = now + timedelta(seconds=pool.idle_timeout)
    version = (pool.pk, session.rows_version)
    inserted, flag = retry_aborted(
        lambda: _update_and_insert(session.pk, user.pk, now, idle_until, job, pool_version=version)
    )
    if not inserted:
        _forget(session.pk)
        return None
    session.last_activity_at, session.idle_expires_at = now, idle_until
    job.session = session
    if _awaits_work(pool.pk, flag):
        _wake_if_waiting(pool.pk)
    return job


def submit_job(*, user, session: Session, payload, shots: int, target_device: Device | None = None) -> Job:
    """Queue a job in ``user``'s active session (R-JOB-1) and renew its idle deadline.

    No pool-wide lock: the common path is the caller's session lookup (session_for_submission:
    with the pool's devices; or known_session's memory of it), the drivers' payload check, and
    one statement that updates the session and inserts the job.
    The UPDATE checks owner and status (R-JOB-1: else 403), renews the idle deadline
    (R-SESS-3), and applies catch-up (R-SCHED-2: max(vruntime, pool V) when the session had
    nothing pending). It row-locks the session until commit, so a revocation racing the
    submission waits and then cancels the new job (lock order: session → job).
    """
    if getattr(session, "remembered", False):
        if target_device is None:
            job = _submit_remembered(user, session, payload, shots)
            if job is not None:
                return job
        session_id, pool_name = session.pk, session.asked_pool_name
        session = session_for_submission(session_id, pool_name=pool_name)
        if session is None:  # deleted, or its pool renamed: the callers' own 404 (seen_or_404, QRMI's)
            raise NotFound(
                "No such session." if pool_name is None else f"No session '{session_id}' on pool '{pool_name}'."
            )
    if session.user_id != user.pk:
        raise Forbidden(f"Session {session.pk} belongs to another user: only its owner submits jobs in it.")
    if session.status != SessionStatus.ACTIVE:
        raise Forbidden(f"Session {session.pk} has ended ({session.status}, {session.revocation_reason}).")
    pool = session.pool
    validate_job(pool, payload, shots, target_device, getattr(session, "pool_devices", None))
    now = timezone.now()
    idle_until = now + timedelta(seconds=pool.idle_timeout)
    job = _queued_job(session, payload, shots, target_device, now)
    inserted, flag = retry_aborted(lambda: _update_and_insert(session.pk, user.pk, now, idle_until, job))
    if not inserted:  # ended since the caller read it (expired, released, revoked)
        status = Session.objects.filter(pk=session.pk).values_list("status", flat=True).first()
        raise Forbidden(f"Session {session.pk} has ended ({status or 'gone'}).", status=status)
    session.last_activity_at, session.idle_expires_at = now, idle_until
    job.session = session
    if getattr(session, "rows_version", None) is not None and not connection.in_atomic_block:
        _remember(session)  # read in its own transaction: the versions of committed rows
    if connection.vendor != "postgresql":
        flag = _queue_flag(pool)
    if _awaits_work(session.pool_id, flag):
        _wake_if_waiting(session.pool_id)
    return job


def cancel_job(job: Job) -> Job:
    """R-JOB-2: pending → cancelled now; running → cancel requested (the worker stops it);
    finished or already requested → 409 with the status."""
    now = timezone.now()
    if Job.objects.filter(pk=job.pk, status=JobStatus.PENDING).update(
        status=JobStatus.CANCELLED, finished_at=now, error="Cancelled before it started."
    ):
        job.refresh_from_db()
        return job
    if Job.objects.filter(pk=job.pk, status=JobStatus.RUNNING, cancel_requested_at__isnull=True).update(
        cancel_requested_at=now, next_poll_at=now
    ):
        enqueue("apps.scheduling.tasks.run_pool", job.pool_id)
        job.refresh_from_db()
        return job
    job.refresh_from_db()
    detail = "Cancellation was already requested." if job.status == JobStatus.RUNNING else f"Job is {job.status}."
    raise Conflict(detail, status=job.status)


def _any_unfinished(session_ids) -> bool:
    """Whether a job of ``session_ids`` is pending or running (``SELECT EXISTS (job of these
    sessions, unfinished)``): written by hand, as the release it follows (issue 15)."""
    marks = ", ".join(["%s"] * len(session_ids))
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT 1 FROM {Job._meta.db_table} WHERE session_id IN ({marks})"  # noqa: S608 (names from _meta)
            f" AND status IN ({', '.join(['%s'] * len(UNFINISHED))}) LIMIT 1",
            [*(Session._meta.pk.get_db_prep_value(pk, connection) for pk in session_ids), *UNFINISHED],
        )
        return cursor.fetchone() is not None


def on_sessions_revoked(sender, session_ids, reason, **kwargs):
    """R-SESS-3/4: a revoked session's pending jobs are cancelled, running ones asked to stop."""
    if not _any_unfinished(session_ids):
        return  # the common release: nothing left to stop, one statement (issue 15's budget)
    now = timezone.now()
    Job.objects.filter(session_id__in=session_ids, status=JobStatus.PENDING).update(
        status=JobStatus.CANCELLED, finished_at=now, error=f"Session ended ({reason})."
    )
    running = Job.objects.filter(session_id__in=session_ids, status=JobStatus.RUNNING, cancel_requested_at__isnull=True)
    pool_ids = set(running.values_list("pool_id", flat=True))
    running.update(cancel_requested_at=now, next_poll_at=now)
    for pool_id in pool_ids:
        enqueue("apps.scheduling.tasks.run_pool", pool_id)


# -- dispatch --------------------------------------------------------------------------------
def running_count():
    """Running jobs of the outer device, counted on ``jobs_running_device`` (only running rows):
    the cost does not grow with the jobs the device ever ran."""
    running = Job.objects.filter(device_id=OuterRef("pk"), status=JobStatus.RUNNING)
    return Coalesce(Subquery(running.order_by().values("device_id").annotate(n=Count("pk")).values("n")[:1]), 0)


def free_devices(pool_id: int) -> list[Device]:
    """Online devices of the pool below ``max_concurrent_jobs``."""
    devices = Device.objects.filter(pool_id=pool_id, online=True).annotate(running=running_count())
    return [d for d in devices if d.running < d.max_concurrent_jobs]


def dispatch_once(pool_id: int) -> Job | None:
    """Claim the next job of the pool for a free device (R-SCHED-1/3/4), or None.

    The pool's queue row is locked for the duration (dispatch is serialized per pool, which
    keeps the weighted order exact); several workers dispatch different pools in parallel.
    Lock order pool queue → session → job, as everywhere: the candidate is read without a
    lock, then its session row is locked (its slots and vruntime are read there for the charge
    and for V), then the job is claimed by a compare-and-set, so a job cancelled meanwhile is
    never dispatched.
    """
    with transaction.atomic():
        queue = _lock_queue(pool_id)
        pool = ResourcePool.objects.only("is_accessible", "strategy").get(pk=pool_id)
        if not pool.is_accessible:
            return None
        free = free_devices(pool_id)
        if not free:
            _set_awaiting(queue, False)  # the job-finished event will dispatch
            return None
        strategy = strategy_for(pool.strategy)
        now = timezone.now()
        owner = claim_token()
        for _ in range(3):  # a candidate cancelled under our feet: take the next one
            job = strategy.next_job(pool_id, [d.pk for d in free], now)
            if job is None:
                _set_awaiting(queue, True)  # a device is free: the next submission wakes us
                return None
            slots, vruntime = (
                Session.objects.select_for_update().values_list("slots", "vruntime").get(pk=job.session_id)
            )
            if job.target_device_id:
                device = next(d for d in free if d.pk == job.target_device_id)
            else:  # least loaded first, then by id: spreads jobs across devices
                device = min(free, key=lambda d: (d.running / d.max_concurrent_jobs, d.pk))
            claimed = Job.objects.filter(pk=job.pk, status=JobStatus.PENDING).update(
                status=JobStatus.RUNNING,
                device=device,
                scheduled_at=now,
                lease_owner=owner,
                lease_until=now + lease(),
                next_poll_at=now,
                not_before=None,
            )
            if claimed:
                break
        else:
            return None
        latency.observe(pool_id, LatencyKind.QUEUE_WAIT, (now - job.created_at).total_seconds())
        charge = strategy.dispatch_charge(job, slots)
        if charge:
            strategy.charge(job, charge)
        # R-SCHED-2: V = max(V, vruntime of the session served, before its charge).
        queue.vtime = max(queue.vtime, vruntime)
        queue.last_dispatch_at = now
        queue.awaiting_work = False
        queue.save(update_fields=["vtime", "last_dispatch_at", "awaiting_work"])
    job.refresh_from_db()
    job.device = device
    job._dispatch_charge = charge
    return job


def _set_awaiting(queue: PoolQueue, value: bool) -> None:
    if queue.awaiting_work != value:
        PoolQueue.objects.filter(pk=queue.pk).update(awaiting_work=value)
        queue.awaiting_work = value


def submit_claimed(job: Job, *, taken_over: bool = False) -> None:
    """Hand a job claimed by ``job.lease_owner`` to its device's driver (no transaction open),
    then record it.

    ``taken_over``: a poll pass took over a hand-over whose outcome was never recorded (its worker
    died); the caller renews the claim. The device may already run the job, so a cancel recorded
    meanwhile does not short-cut it: the drivers' idempotent submit adopts the run (or starts it),
    the remote id is recorded, and the next poll passes the cancel on to the device. Finishing it
    here would leave a device run nobody sees and hand its slot to another job."""
    device = job.device
    owner = job.lease_owner
    # Compare-and-set on the claim, owner included: a worker whose claim lapsed (it stalled past
    # the lease) and was taken over by another worker, who may be submitting it right now, loses
    # here and never calls the driver a second time (two paid QPU jobs). A cancel recorded between
    # the claim and this hand-over wins too (issue 18 item 7): the user saw the job pending and
    # asked to cancel it; it must never reach the device. A cancel landing after this line is a
    # running job's cancel (R-JOB-2).
    ours = Job.objects.filter(pk=job.pk, status=JobStatus.RUNNING, remote_id="", lease_owner=owner)
    if not taken_over:
        ours = ours.filter(cancel_requested_at=None)
    handed_over = ours.update(lease_until=timezone.now() + lease())
    if not handed_over:
        # Still ours and cancelled: finish it. Another worker's claim now: theirs to hand over or
        # cancel, nothing to do here (finishing it would cancel a job they may be submitting).
        _finish(job, DriverState("cancelled", error="Cancelled before it started."), expect_remote_id="", owner=owner)
        return
    try:
        with nullcontext() if taken_over else kept_claimed([job.pk], owner):
            remote_id = get_driver(device.driver).submit(device, job)
    except PermanentDriverError as exc:
        _finish(job, DriverState("failed", error=str(exc)), expect_remote_id="", owner=owner)
        return
    except Exception as exc:  # TransientDriverError, and anything unexpected: retry, bounded
        _requeue(job, exc)
        return
    with transaction.atomic():
        # Whoever holds the claim now: the remote id is a fact (a taker-over's idempotent submit
        # adopts the same run), so it is recorded; its claim ends with it.
        accepted = Job.objects.filter(pk=job.pk, status=JobStatus.RUNNING, remote_id="").update(
            remote_id=remote_id,
            lease_owner="",
            lease_until=None,
            # A cancel recorded before the remote id: the next poll passes it on at once.
            next_poll_at=Case(When(cancel_requested_at__isnull=False, then=None), default=F("next_poll_at")),
        )
        if accepted and job.scheduled_at:
            latency.observe(job.pool_id, LatencyKind.DISPATCH, (timezone.now() - job.scheduled_at).total_seconds())
    job.remote_id = remote_id


def _requeue(job: Job, exc: Exception) -> None:
    """R-JOB-3: a transient failure returns the job to the queue and refunds the session.

    The job keeps its place: it stays the session's oldest pending job, and its back-off
    (``not_before``) holds the whole session's queue (``strategies.in_backoff``), so the
    session's next job does not overtake it (R-SCHED-3 FIFO within a session).
    """
    attempts = job.attempts + 1
    if attempts >= MAX_TRANSIENT_ATTEMPTS:
        _finish(
            job,
            DriverState("failed", error=f"Gave up after {attempts} transient failures: {exc}"),
            expect_remote_id="",
            owner=job.lease_owner,
        )
        return
    now = timezone.now()
    charge = getattr(job, "_dispatch_charge", None)
    if charge is None:  # a recovered claim: recompute what its dispatch charged
        pool = ResourcePool.objects.only("strategy").get(pk=job.pool_id)
        slots = Session.objects.values_list("slots", flat=True).get(pk=job.session_id)
        charge = strategy_for(pool.strategy).dispatch_charge(job, slots)
    with transaction.atomic():
        # Lock order session → job (as revocation): lock the session before touching the job.
        Session.objects.select_for_update().filter(pk=job.session_id).values_list("pk").first()
        # Only while the claim is ours: a worker that took the lapsed claim over may be submitting
        # the job now; putting it back in the queue would dispatch it a second time.
        requeued = Job.objects.filter(
            pk=job.pk, status=JobStatus.RUNNING, remote_id="", lease_owner=job.lease_owner
        ).update(
            status=JobStatus.PENDING,
            device=None,
            scheduled_at=None,
            lease_owner="",
            lease_until=None,
            attempts=attempts,
            not_before=now + timedelta(seconds=min(2**attempts, 60)),
            error=f"transient: {exc}"[:2000],
        )
        if requeued and charge:
            Session.objects.filter(pk=job.session_id).update(vruntime=F("vruntime") - charge)
    log.warning("job %s: transient driver error, back in the queue (attempt %s): %s", job.pk, attempts, exc)


def _finish(job: Job, state: DriverState, *, expect_remote_id: str, owner: str | None = None) -> bool:
    """Record a terminal state once (compare-and-set on status and remote id, and on the claim's
    ``owner`` when given: a job not yet handed over is finished only by its claim's holder)."""
    now = timezone.now()
    status = {"completed": JobStatus.COMPLETED, "failed": JobStatus.FAILED, "cancelled": JobStatus.CANCELLED}[
        state.status
    ]
    same = Job.objects.filter(pk=job.pk, status=JobStatus.RUNNING, remote_id=expect_remote_id)
    if owner is not None:
        same = same.filter(lease_owner=owner)
    with transaction.atomic():
        updated = same.update(
            status=status,
            finished_at=now,
            started_at=job.started_at or (now if state.started else None),
            result=state.result if status == JobStatus.COMPLETED else None,
            error=state.error[:4000],
            logs=(job.logs + state.logs)[-100_000:],
            runtime_seconds=state.runtime_seconds,
            lease_owner="",
            lease_until=None,
        )
    if updated and state.runtime_seconds:
        # usage_fair charges the device time a job used, whatever its end (a failed or cancelled
        # job ran too). In its own transaction, after the job row's, taking the session first:
        # lock order session → job, as revocation and dispatch.
        pool = ResourcePool.objects.only("strategy").get(pk=job.pool_id)
        strategy = strategy_for(pool.strategy)
        if strategy.charge_at_completion:
            with transaction.atomic():
                slots = Session.objects.select_for_update().values_list("slots", flat=True).get(pk=job.session_id)
                if Job.objects.filter(pk=job.pk, charged=False).update(charged=True):
                    job.runtime_seconds = state.runtime_seconds
                    strategy.charge(job, strategy.completion_charge(job, slots))
    return bool(updated)


def poll_running(pool_id: int) -> int:
    """Poll the pool's running jobs that are due (R-SCHED-3: before dispatching new ones).

    Jobs are claimed with a lease (skip_locked) under one owner token per pass, so several workers
    share them; the whole batch's claim is renewed while the pass works (``kept_claimed``). A job
    claimed for dispatch whose submission outcome was never recorded (its worker died) is
    submitted again, which the drivers' idempotent submit turns into adopting the existing run.
    """
    now = timezone.now()
    interval = timedelta(seconds=settings.GRIDGATE_JOB_POLL_INTERVAL)
    owner = claim_token()
    with transaction.atomic():
        due = (
            Job.objects.filter(pool_id=pool_id, status=JobStatus.RUNNING)
            .filter(Q(next_poll_at__isnull=True) | Q(next_poll_at__lte=now))
            .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
            .select_for_update(skip_locked=True)
            .order_by(F("next_poll_at").asc(nulls_first=True), "id")  # NULL means "poll now"
        )
        ids = list(due.values_list("id", flat=True)[:POLL_BATCH])
        Job.objects.filter(id__in=ids).update(lease_owner=owner, lease_until=now + lease())
    if not ids:
        return 0
    with kept_claimed(ids, owner):
        for job in Job.objects.filter(id__in=ids).select_related("device"):
            _poll_claimed(job, interval)
    return len(ids)


def _poll_claimed(job: Job, interval: timedelta) -> None:
    """One job of a poll pass: hand it over if its submission was never recorded, else ask its
    device how it is (and pass on a cancel), and record the answer."""
    if not job.remote_id:
        submit_claimed(job, taken_over=True)
        return
    driver = get_driver(job.device.driver)
    try:
        if job.cancel_requested_at:
            driver.cancel(job.device, job.remote_id)
        state = driver.poll(job.device, job.remote_id)
    except PermanentDriverError as exc:
        _finish(job, DriverState("failed", error=str(exc)), expect_remote_id=job.remote_id)
        return
    except Exception as exc:
        # Transient, like on submit: a driver bug or a dropped connection while polling says
        # nothing about the job itself, which may well still be running on the device. Poll
        # again later (R-JOB-3); only the driver's PermanentDriverError fails the job.
        if not isinstance(exc, TransientDriverError):
            log.exception("job %s: unexpected error while polling; polling again later", job.pk)
        Job.objects.filter(pk=job.pk, remote_id=job.remote_id, lease_owner=job.lease_owner).update(
            lease_owner="",
            lease_until=None,
            next_poll_at=timezone.now() + interval * 2,
            error=f"poll: {type(exc).__name__}: {exc}"[:2000],
        )
        return
    if state.status == "running":
        # Only while the claim is ours: never end the claim of a worker that took it over.
        update = {"lease_owner": "", "lease_until": None, "next_poll_at": timezone.now() + interval}
        if state.started and job.started_at is None:
            update["started_at"] = timezone.now()
        if state.logs:
            update["logs"] = (job.logs + state.logs)[-100_000:]
        Job.objects.filter(
            pk=job.pk, status=JobStatus.RUNNING, remote_id=job.remote_id, lease_owner=job.lease_owner
        ).update(**update)
    else:
        _finish(job, state, expect_remote_id=job.remote_id)


def run_pool(pool_id: int) -> dict:
    """One pass for a pool: poll what runs, then fill free devices. Idempotent and bounded."""
    polled = poll_running(pool_id)
    dispatched = 0
    while dispatched < DISPATCH_BATCH:
        try:
            job = dispatch_once(pool_id)
        except OperationalError as exc:
            if not is_retryable(exc):
                raise
            # Aborted (deadlock victim): nothing was claimed; the next event or sweep goes on.
            log.warning("pool %s: dispatch aborted by the database (%s)", pool_id, exc.__cause__.sqlstate)
            break
        if job is None:
            break
        submit_claimed(job)
        dispatched += 1
    return {"polled": polled, "dispatched": dispatched}


def active_pool_ids() -> list[int]:
    """Pools with unfinished jobs (the sweep's work list)."""
    return list(Job.objects.filter(status__in=UNFINISHED).order_by().values_list("pool_id", flat=True).distinct())


def sweep() -> dict:
    """Safety net behind the events (R-SCHED-5): a pass over every pool with unfinished jobs."""
    totals = {"pools": 0, "polled": 0, "dispatched": 0}
    for pool_id in active_pool_ids():
        outcome = run_pool(pool_id)
        totals["pools"] += 1
        totals["polled"] += outcome["polled"]
        totals["dispatched"] += outcome["dispatched"]
    return totals


def delete_device(device: Device) -> None:
    """A device goes only when nothing runs on it (its jobs' ``device`` would go null while
    running, which the database refuses); take it offline and let them finish first."""
    if Job.objects.filter(device=device, status=JobStatus.RUNNING).exists():
        raise Conflict(f"Device '{device.name}' is running jobs: take it offline and wait for them to end.")
    device.delete()


def set_device_online(device: Device, online: bool) -> None:
    Device.objects.filter(pk=device.pk).update(online=online)
    device.online = online
    if online:
        enqueue("apps.scheduling.tasks.run_pool", device.pool_id)  # R-SCHED-5: device back online


__all__ = ["InvalidPayload", "submit_job", "cancel_job", "run_pool", "sweep", "dispatch_once"]
