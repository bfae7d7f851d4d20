"""Job submission and cancellation, and device administration: the request path (SPEC §5).

The scheduling worker's passes (poll, dispatch) are ``apps.scheduling.passes``.
"""

import logging
import uuid
from contextlib import nullcontext
from datetime import timedelta
from functools import partial

from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from apps.core.exceptions import Conflict, Forbidden, NotFound, ServiceError, Unavailable
from apps.core.retry import retry_aborted
from apps.core.tasks import enqueue
from apps.scheduling import known, statements
from apps.scheduling.drivers import DriverError, InvalidPayload, get_driver
from apps.scheduling.models import UNFINISHED, Device, Job, JobStatus, PoolQueue
from apps.sessions.models import SessionStatus
from apps.sessions.services import expire_due_sessions

log = logging.getLogger(__name__)


def busy_condition():
    """Sessions with pending or running jobs are never idle-expired (R-SESS-3)."""
    return Q(Exists(Job.objects.filter(session_id=OuterRef("pk"), status__in=UNFINISHED)))


# -- submission ------------------------------------------------------------------------------
class NotYourSession(Forbidden):
    """R-JOB-1: only a session's owner submits jobs in it."""


SUBMISSION_ATTEMPTS = 3  # the last one holds the pool's configuration: it cannot lose to a change


def submit_job(
    *, user, session_id, payload, shots: int, device_id: int | None = None, pool_name: str | None = None
) -> Job:
    """Queue a job in ``user``'s active session (R-JOB-1) and renew its idle deadline (R-SESS-3).

    (1) The session, with its pool and the pool's devices: remembered by this process if it
    stored a job of ``user``'s in it before (``known``), else read (``statements.target``).
    NotFound: no such session (on the pool named ``pool_name``, for QRMI); Forbidden: someone
    else's, or ended or due (a due session is expired here: R-SESS-7, whether or not a sweep
    ran). (2) R-DEV-1: the payload is checked by every device that may take the job (the one
    ``device_id`` names, else every device of the pool, since the dispatcher gives it to any free
    one). (3) One statement renews the session and inserts the job, only while the session is
    still the caller's, active and not due and, on PostgreSQL, its pool and devices are still the
    configuration checked in (2). If anything changed, the submission starts over from the
    database, so a remembered session answers as a read one would (R-SESS-7: only a change that
    matters to it refuses a submission; admissions and releases beside it never do). The last
    attempt holds the pool's configuration until its statement commits, so a configuration
    change racing a submission costs a retry, never a refusal. No pool-wide lock on the common
    path: the statement holds the session's row only (lock order pool → devices → session → job).
    """
    try:
        session_id = uuid.UUID(str(session_id))
    except ValueError:
        raise NotFound("No such session.") from None
    for attempt in range(SUBMISSION_ATTEMPTS):
        last = attempt == SUBMISSION_ATTEMPTS - 1
        with transaction.atomic() if last else nullcontext():
            if last and connection.vendor == "postgresql":
                statements.lock_configuration(session_id)
            job = _submit_once(user, session_id, payload, shots, device_id, pool_name, remembered=attempt == 0)
        if job is not None:
            return job
        known.forget(session_id)  # ended, due, or its pool or devices changed: read them again
    raise Unavailable("The session changed during the submission; try again.")


def _submit_once(user, session_id, payload, shots, device_id, pool_name, *, remembered: bool) -> Job | None:
    """One attempt of :func:`submit_job`: the stored job, or None when its statement stored
    nothing (to be tried again from the database)."""
    target = known.recall(session_id, user.pk, pool_name) if remembered else None
    remembered = target is not None
    if target is None:
        target = _active_target(user, session_id, pool_name)
    try:
        _check_payload(target, payload, shots, device_id)
    except (DriverError, ServiceError, ValidationError):
        if remembered:
            return None  # perhaps checked against devices changed since: ask the database
        raise
    now = timezone.now()
    job = Job(
        session_id=session_id,
        pool_id=target.pool.pk,
        user_id=user.pk,
        payload=payload,
        shots=shots,
        target_device_id=device_id,
        created_at=now,
    )
    idle_until = now + timedelta(seconds=target.pool.idle_timeout)
    stored, awaiting = retry_aborted(
        partial(
            statements.renew_and_insert, job, user_id=user.pk, now=now, idle_until=idle_until, version=target.version
        )
    )
    if not stored:
        return None
    if not remembered and not connection.in_atomic_block:
        known.remember(target)
    _wake_if_waiting(target.pool.pk, awaiting)
    job.allocation_id = target.allocation_id  # R-ALLOC-1: the submission's answer says what is left
    return job


def _active_target(user, session_id, pool_name: str | None) -> statements.Target:
    """The session read from the database, refused unless it is the caller's and active. One
    past a deadline is expired first (R-SESS-3, R-SESS-7: a due session accepts no job whether or
    not the sweep has run, and its slots go back at once), then read again."""
    target = statements.target(session_id, pool_name)
    mine = target is not None and target.status == SessionStatus.ACTIVE and target.user_id == user.pk
    if mine and min(target.expires_at, target.idle_expires_at) <= timezone.now():
        expire_due_sessions(pool_id=target.pool.pk)
        target = statements.target(session_id, pool_name)
    _check_session(target, user, session_id, pool_name)
    return target


def _check_session(target: statements.Target | None, user, session_id, pool_name: str | None) -> None:
    if target is None:
        raise NotFound("No such session." if pool_name is None else f"No session '{session_id}' on pool '{pool_name}'.")
    if target.user_id != user.pk:
        raise NotYourSession(f"Session {session_id} belongs to another user: only its owner submits jobs in it.")
    if target.status != SessionStatus.ACTIVE:
        raise Forbidden(
            f"Session {session_id} has ended ({target.status}, {target.revocation_reason}).", status=target.status
        )


def _check_payload(target: statements.Target, payload, shots: int, device_id: int | None) -> None:
    """R-JOB-1, R-DEV-1: InvalidPayload (a DriverError) → 400; a pool without any device would
    keep the job pending forever: 400 too."""
    devices = target.devices
    if device_id is not None:
        devices = [device for device in devices if device.pk == device_id]
        if not devices:
            raise ValidationError({"device": ["Not a device of this session's pool."]})
    if not devices:
        raise InvalidPayload(f"Pool '{target.pool.name}' has no device to run jobs: ask an administrator to add one.")
    for device in devices:
        get_driver(device.driver).validate_payload(device, payload, shots)


def wake_pool(pool_id: int) -> None:
    """Run a dispatcher pass over ``pool_id`` in a worker once the current transaction commits
    (R-SCHED-5: a job waits, a device came back, a cancel was asked). The one way to wake the
    dispatcher; a lost wake-up costs only time, since the sweep runs every pool anyway."""
    enqueue("apps.scheduling.tasks.run_pool", pool_id)


def _wake_if_waiting(pool_id: int, awaiting: bool | None) -> None:
    """R-SCHED-5 on submission, coalesced: wake the dispatcher only when its last pass left a
    device free with nothing to run (``awaiting``, read by the submission's statement; None: the
    pool's first job, whose new queue row awaits work), and only once (a compare-and-set on the
    flag: of many submissions arriving together, one enqueues). While every device is busy no
    task is sent: the job-finished event dispatches. After the submission commits, so it never
    takes the queue row while holding the session (lock order: pool queue → session → job). A
    broker failure never fails a committed submission: the sweep catches up."""
    if awaiting is None:
        PoolQueue.objects.get_or_create(pool_id=pool_id)
    elif not awaiting:
        return

    def wake():
        try:
            if PoolQueue.objects.filter(pool_id=pool_id, awaiting_work=True).update(awaiting_work=False):
                wake_pool(pool_id)
        except Exception:
            log.exception("pool %s: could not wake the dispatcher; the sweep will catch up", pool_id)

    transaction.on_commit(wake)


# -- cancellation ------------------------------------------------------------------------------
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
        wake_pool(job.pool_id)
        job.refresh_from_db()
        return job
    job.refresh_from_db()
    detail = "Cancellation was already requested." if job.status == JobStatus.RUNNING else f"Job is {job.status}."
    raise Conflict(detail, status=job.status)


def on_sessions_revoked(sender, session_ids, reason, **kwargs):
    """R-SESS-3/4: a revoked session's pending jobs are cancelled, running ones asked to stop."""
    if not statements.any_unfinished(session_ids):
        return  # the common release: nothing left to stop
    now = timezone.now()
    Job.objects.filter(session_id__in=session_ids, status=JobStatus.PENDING).update(
        status=JobStatus.CANCELLED, finished_at=now, error=f"Session ended ({reason})."
    )
    running = Job.objects.filter(session_id__in=session_ids, status=JobStatus.RUNNING, cancel_requested_at__isnull=True)
    pool_ids = set(running.values_list("pool_id", flat=True))
    running.update(cancel_requested_at=now, next_poll_at=now)
    for pool_id in pool_ids:
        wake_pool(pool_id)


def cancel_jobs_of_ended_sessions() -> int:
    """The repair behind the revocation's announcement (:func:`on_sessions_revoked`): jobs still
    unfinished in sessions that ended, should the announcement have been lost (the process died
    between the revocation's commit and it). Every minute; driven by the unfinished jobs (a
    partial index), never by the history of sessions."""
    left = Q(status=JobStatus.PENDING) | Q(status=JobStatus.RUNNING, cancel_requested_at__isnull=True)
    ended = list(
        Job.objects.filter(left, session__status=SessionStatus.REVOKED)
        .order_by()
        .values_list("session_id", flat=True)
        .distinct()
    )
    if ended:
        log.warning("%d ended session(s) still had unfinished jobs: cancelling them", len(ended))
        on_sessions_revoked(sender=None, session_ids=ended, reason="ended")
    return len(ended)


def deletable_jobs(jobs):
    """The rows of ``jobs`` that may be deleted (the admin; ``cleanup`` prunes the same): finished
    ones. An unfinished job's row is how the worker hands it over, polls, stops and charges its
    run; deleting it would leave that run going on the device, never charged. Cancel it first."""
    return jobs.exclude(status__in=UNFINISHED)


# -- devices -----------------------------------------------------------------------------------
def busy_devices(devices):
    """Those of ``devices`` that may not be deleted: running jobs (their ``device`` would go null
    while running, which the database refuses), or pending jobs that asked for them (their
    ``target_device`` would go null, and any device of the pool would take them)."""
    return devices.filter(
        Q(Exists(Job.objects.filter(device=OuterRef("pk"), status=JobStatus.RUNNING)))
        | Q(Exists(Job.objects.filter(target_device=OuterRef("pk"), status=JobStatus.PENDING)))
    )


def delete_device(device: Device) -> None:
    """A device goes only when nothing runs on it and no pending job asked for it
    (:func:`busy_devices`); take it offline and let its jobs finish (or cancel them) first.

    Checked and deleted holding the pool's queue row, which the dispatcher holds while it hands
    out a job, and the device's row, on which submissions take a share lock: a job dispatched to
    it or submitted for it meanwhile is seen by the check, never an IntegrityError at the DELETE
    (lock order pool queue → device, as the dispatcher's)."""
    with transaction.atomic():
        PoolQueue.objects.get_or_create(pool_id=device.pool_id)
        PoolQueue.objects.select_for_update().filter(pool_id=device.pool_id).values_list("pk").first()
        Device.objects.select_for_update().filter(pk=device.pk).values_list("pk").first()
        if busy_devices(Device.objects.filter(pk=device.pk)).exists():
            raise Conflict(
                f"Device '{device.name}' is running jobs or pending jobs asked for it: take it offline and "
                "wait for them to end (or cancel them)."
            )
        device.delete()


def set_device_online(device: Device, online: bool) -> None:
    Device.objects.filter(pk=device.pk).update(online=online)
    device.online = online
    if online:
        wake_pool(device.pool_id)  # R-SCHED-5: device back online
