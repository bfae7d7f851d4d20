"""Job submission, cancellation and the dispatcher (SPEC §5).

Claim, commit, call, record: every state change happens in a short transaction guarded by a
compare-and-set on the job's status; driver calls (submit, poll, cancel) happen with no
transaction open (R-SCHED-4).
"""

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Exists, F, OuterRef, Q
from django.utils import timezone

from apps.core.api.exceptions import Conflict
from apps.core.tasks import enqueue
from apps.resources.models import ResourcePool
from apps.scheduling.drivers import (
    DriverState,
    InvalidPayload,
    PermanentDriverError,
    TransientDriverError,
    get_driver,
)
from apps.scheduling.models import UNFINISHED, Device, Job, JobStatus, PoolQueue
from apps.scheduling.strategies import catch_up, strategy_for
from apps.sessions.models import Session, SessionStatus
from apps.sessions.services import touch

log = logging.getLogger(__name__)

LEASE = timedelta(minutes=5)  # a claim older than this belongs to a dead worker
MAX_TRANSIENT_ATTEMPTS = 5
DISPATCH_BATCH = 100
POLL_BATCH = 200


def busy_condition():
    """Sessions with pending or running jobs are never idle-expired (R-SESS-3)."""
    return Q(Exists(Job.objects.filter(session_id=OuterRef("pk"), status__in=UNFINISHED)))


def _lock_queue(pool_id: int) -> PoolQueue:
    PoolQueue.objects.get_or_create(pool_id=pool_id)
    return PoolQueue.objects.select_for_update().get(pool_id=pool_id)


# -- submission and cancellation -------------------------------------------------------------
def validate_job(pool: ResourcePool, payload, shots: int, target_device: Device | None) -> None:
    """R-JOB-1: the target driver validates the payload at submission (InvalidPayload → 400)."""
    devices = [target_device] if target_device else list(pool.devices.all())
    seen = set()
    for device in devices:
        if device.driver in seen:
            continue
        seen.add(device.driver)
        get_driver(device.driver).validate_payload(device, payload, shots)


def submit_job(*, session: Session, payload, shots: int, target_device: Device | None = None) -> Job:
    """Queue a job in an active session (R-JOB-1) and renew the session's idle deadline."""
    validate_job(session.pool, payload, shots, target_device)
    with transaction.atomic():
        _lock_queue(session.pool_id)
        locked = Session.objects.select_for_update().get(pk=session.pk)
        if locked.status != SessionStatus.ACTIVE:
            raise Conflict(f"Session {session.pk} is {locked.status}.", status=locked.status)
        if not Job.objects.filter(session_id=locked.pk, status=JobStatus.PENDING).exists():
            catch_up(locked)  # R-SCHED-2
        now = timezone.now()
        job = Job.objects.create(
            session=locked,
            pool_id=locked.pool_id,
            user_id=locked.user_id,
            payload=payload,
            shots=shots,
            target_device=target_device,
            created_at=now,
        )
        touch(locked, now)
        enqueue("apps.scheduling.tasks.run_pool", locked.pool_id)  # R-SCHED-5: event-driven
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


def on_sessions_revoked(sender, session_ids, reason, **kwargs):
    """R-SESS-3/4: a revoked session's pending jobs are cancelled, running ones asked to stop."""
    if not Job.objects.filter(session_id__in=session_ids, status__in=UNFINISHED).exists():
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
def free_devices(pool_id: int) -> list[Device]:
    """Online devices of the pool below ``max_concurrent_jobs`` (running counted by index)."""
    devices = Device.objects.filter(pool_id=pool_id, online=True).annotate(
        running=Count("jobs", filter=Q(jobs__status=JobStatus.RUNNING))
    )
    return [d for d in devices if d.running < d.max_concurrent_jobs]


def dispatch_once(pool_id: int) -> Job | None:
    """Claim the next job of the pool for a free device (R-SCHED-1/3/4), or None.

    The pool's queue row is locked for the duration (dispatch is serialized per pool, which
    keeps the weighted order exact); several workers dispatch different pools in parallel. The
    claim is a compare-and-set, so a job cancelled meanwhile is never dispatched.
    """
    with transaction.atomic():
        queue = _lock_queue(pool_id)
        pool = ResourcePool.objects.only("is_accessible", "strategy").get(pk=pool_id)
        if not pool.is_accessible:
            return None
        free = free_devices(pool_id)
        if not free:
            return None
        strategy = strategy_for(pool.strategy)
        now = timezone.now()
        for _ in range(3):  # a candidate cancelled under our feet: take the next one
            job = strategy.next_job(pool_id, [d.pk for d in free], now)
            if job is None:
                return None
            if job.target_device_id:
                device = next(d for d in free if d.pk == job.target_device_id)
            else:  # least loaded first, then by id: spreads jobs across devices
                device = min(free, key=lambda d: (d.running / d.max_concurrent_jobs, d.pk))
            claimed = Job.objects.filter(pk=job.pk, status=JobStatus.PENDING).update(
                status=JobStatus.RUNNING,
                device=device,
                scheduled_at=now,
                lease_until=now + LEASE,
                next_poll_at=now,
                not_before=None,
            )
            if claimed:
                break
        else:
            return None
        slots = Session.objects.values_list("slots", flat=True).get(pk=job.session_id)
        charge = strategy.dispatch_charge(job, slots)
        if charge:
            strategy.charge(job, charge)
        queue.last_dispatch_at = now
        queue.save(update_fields=["last_dispatch_at"])
    job.refresh_from_db()
    job.device = device
    job._dispatch_charge = charge
    return job


def submit_claimed(job: Job) -> None:
    """Hand a claimed job to its device's driver (no transaction open), then record it."""
    device = job.device
    try:
        remote_id = get_driver(device.driver).submit(device, job)
    except PermanentDriverError as exc:
        _finish(job, DriverState("failed", error=str(exc)), expect_remote_id="")
        return
    except Exception as exc:  # TransientDriverError, and anything unexpected: retry, bounded
        _requeue(job, exc)
        return
    Job.objects.filter(pk=job.pk, status=JobStatus.RUNNING, remote_id="").update(remote_id=remote_id, lease_until=None)
    job.remote_id = remote_id


def _requeue(job: Job, exc: Exception) -> None:
    """R-JOB-3: a transient failure returns the job to the queue and refunds the session."""
    attempts = job.attempts + 1
    if attempts >= MAX_TRANSIENT_ATTEMPTS:
        _finish(
            job, DriverState("failed", error=f"Gave up after {attempts} transient failures: {exc}"), expect_remote_id=""
        )
        return
    now = timezone.now()
    with transaction.atomic():
        requeued = Job.objects.filter(pk=job.pk, status=JobStatus.RUNNING, remote_id="").update(
            status=JobStatus.PENDING,
            device=None,
            scheduled_at=None,
            lease_until=None,
            attempts=attempts,
            not_before=now + timedelta(seconds=min(2**attempts, 60)),
            error=f"transient: {exc}"[:2000],
        )
        charge = getattr(job, "_dispatch_charge", None)
        if charge is None:  # a recovered claim: recompute what its dispatch charged
            pool = ResourcePool.objects.only("strategy").get(pk=job.pool_id)
            slots = Session.objects.values_list("slots", flat=True).get(pk=job.session_id)
            charge = strategy_for(pool.strategy).dispatch_charge(job, slots)
        if requeued and charge:
            Session.objects.filter(pk=job.session_id).update(vruntime=F("vruntime") - charge)
    log.warning("job %s: transient driver error, back in the queue (attempt %s): %s", job.pk, attempts, exc)


def _finish(job: Job, state: DriverState, *, expect_remote_id: str) -> bool:
    """Record a terminal state once (compare-and-set on status and remote id)."""
    now = timezone.now()
    status = {"completed": JobStatus.COMPLETED, "failed": JobStatus.FAILED, "cancelled": JobStatus.CANCELLED}[
        state.status
    ]
    with transaction.atomic():
        updated = Job.objects.filter(pk=job.pk, status=JobStatus.RUNNING, remote_id=expect_remote_id).update(
            status=status,
            finished_at=now,
            started_at=job.started_at or (now if state.started else None),
            result=state.result if status == JobStatus.COMPLETED else None,
            error=state.error[:4000],
            logs=(job.logs + state.logs)[-100_000:],
            runtime_seconds=state.runtime_seconds,
            lease_until=None,
        )
    if updated and state.runtime_seconds:
        # usage_fair charges the device time a job used, whatever its end (a failed or cancelled
        # job ran too). In its own transaction, after the job row's: revocation locks the session
        # then the jobs, so taking the job then the session here could deadlock.
        pool = ResourcePool.objects.only("strategy").get(pk=job.pool_id)
        strategy = strategy_for(pool.strategy)
        if strategy.charge_at_completion:
            with transaction.atomic():
                if Job.objects.filter(pk=job.pk, charged=False).update(charged=True):
                    job.runtime_seconds = state.runtime_seconds
                    slots = Session.objects.values_list("slots", flat=True).get(pk=job.session_id)
                    strategy.charge(job, strategy.completion_charge(job, slots))
    return bool(updated)


def poll_running(pool_id: int) -> int:
    """Poll the pool's running jobs that are due (R-SCHED-3: before dispatching new ones).

    Jobs are claimed with a lease (skip_locked) so several workers share them; a job claimed for
    dispatch whose submission outcome was never recorded (its worker died) is submitted again,
    which the drivers' idempotent submit turns into adopting the existing run.
    """
    now = timezone.now()
    interval = timedelta(seconds=settings.GRIDGATE_JOB_POLL_INTERVAL)
    with transaction.atomic():
        due = (
            Job.objects.filter(pool_id=pool_id, status=JobStatus.RUNNING)
            .filter(Q(next_poll_at__isnull=True) | Q(next_poll_at__lte=now))
            .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
            .select_for_update(skip_locked=True)
            .order_by(F("next_poll_at").asc(nulls_first=True), "id")  # NULL means "poll now"
        )
        ids = list(due.values_list("id", flat=True)[:POLL_BATCH])
        Job.objects.filter(id__in=ids).update(lease_until=now + LEASE)
    jobs = Job.objects.filter(id__in=ids).select_related("device")
    for job in jobs:
        if not job.remote_id:
            submit_claimed(job)
            continue
        driver = get_driver(job.device.driver)
        try:
            if job.cancel_requested_at:
                driver.cancel(job.device, job.remote_id)
            state = driver.poll(job.device, job.remote_id)
        except TransientDriverError as exc:
            Job.objects.filter(pk=job.pk, remote_id=job.remote_id).update(
                lease_until=None, next_poll_at=timezone.now() + interval * 2, error=f"poll: {exc}"[:2000]
            )
            continue
        except Exception as exc:
            _finish(job, DriverState("failed", error=f"{type(exc).__name__}: {exc}"), expect_remote_id=job.remote_id)
            continue
        if state.status == "running":
            update = {"lease_until": None, "next_poll_at": timezone.now() + interval}
            if state.started and job.started_at is None:
                update["started_at"] = timezone.now()
            if state.logs:
                update["logs"] = (job.logs + state.logs)[-100_000:]
            Job.objects.filter(pk=job.pk, status=JobStatus.RUNNING, remote_id=job.remote_id).update(**update)
        else:
            _finish(job, state, expect_remote_id=job.remote_id)
    return len(ids)


def run_pool(pool_id: int) -> dict:
    """One pass for a pool: poll what runs, then fill free devices. Idempotent and bounded."""
    polled = poll_running(pool_id)
    dispatched = 0
    while dispatched < DISPATCH_BATCH:
        job = dispatch_once(pool_id)
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
