"""The scheduling worker's passes (SPEC §5): poll what runs, dispatch to free devices.

Claim, commit, call, record: every state change happens in a short transaction guarded by a
compare-and-set on the job's status; driver calls (submit, poll, cancel) happen with no
transaction open (R-SCHED-4). The request path (submission, cancellation) is
``apps.scheduling.services``; the tasks and the ticker call these.
"""

import logging
import uuid
from contextlib import nullcontext
from datetime import timedelta

from django.conf import settings
from django.db import OperationalError, transaction
from django.db.models import Case, Count, F, OuterRef, Q, Subquery, When
from django.db.models.functions import Coalesce
from django.utils import timezone

from apps.allocations import selectors as allocations
from apps.allocations import services as charges
from apps.core import leases
from apps.core.retry import is_retryable
from apps.notifications import services as notifications
from apps.notifications.models import Event
from apps.reservations.selectors import now_for as calendar_now
from apps.resources.models import ResourcePool
from apps.scheduling import latency, runtimes, selectors, shares
from apps.scheduling.drivers import (
    DriverState,
    PermanentDriverError,
    SubmissionPending,
    TransientDriverError,
    UndecidedSubmission,
    get_driver,
)
from apps.scheduling.models import UNFINISHED, Device, Job, JobStatus, LatencyKind, PoolQueue
from apps.scheduling.strategies import strategy_for
from apps.sessions.models import Session, SessionStatus

log = logging.getLogger(__name__)


def lease() -> timedelta:
    """A claim not renewed for this long belongs to a dead worker (GRIDGATE_JOB_LEASE_SECONDS)."""
    return timedelta(seconds=settings.GRIDGATE_JOB_LEASE_SECONDS)


def claim_token() -> str:
    """A claim's owner (``Job.lease_owner``): one per dispatch or poll pass."""
    return uuid.uuid4().hex


def kept_claimed(job_ids, owner: str) -> leases.Heartbeat:
    """Renew, every quarter of the lease, the claims ``owner`` still holds among ``job_ids`` while
    driver calls run (one hand-over, or a whole poll pass). A provider call may take minutes (a
    QPU's timeouts and retries): without renewal the lease would have to outlast the slowest call
    (a dead worker's job waited that long), and the later jobs of a slow poll batch would lapse to
    another worker. One UPDATE per renewal whatever the batch size, none for a quick pass."""
    job_ids = list(job_ids)
    rows = Job.objects.filter(id__in=job_ids, status=JobStatus.RUNNING)
    what = f"renewing the claims of {owner} on {len(job_ids)} jobs"
    return leases.kept(rows, owner=owner, lease=lease, name=f"job-claims-{owner[:8]}", what=what)


MAX_TRANSIENT_ATTEMPTS = 5
DISPATCH_BATCH = 100
POLL_BATCH = 200


def _lock_queue(pool_id: int) -> PoolQueue:
    PoolQueue.objects.get_or_create(pool_id=pool_id)
    return PoolQueue.objects.select_for_update().get(pool_id=pool_id)


# -- dispatch --------------------------------------------------------------------------------
def running_count():
    """Running jobs of the outer device, counted on ``jobs_running_device`` (only running rows):
    the cost does not grow with the jobs the device ever ran."""
    running = Job.objects.filter(device_id=OuterRef("pk"), status=JobStatus.RUNNING)
    return Coalesce(Subquery(running.order_by().values("device_id").annotate(n=Count("pk")).values("n")[:1]), 0)


def free_devices(pool_id: int) -> list[Device]:
    """Online devices of the pool, not paused, below ``max_concurrent_jobs``."""
    devices = Device.objects.filter(pool_id=pool_id, online=True, paused_reason="").annotate(running=running_count())
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
        pool = (
            ResourcePool.objects.only("is_accessible", "paused_reason", "strategy", "share_by", "usage_half_life")
            .annotate(has_allocations=allocations.pool_has_allocations())
            .get(pk=pool_id)
        )
        if not pool.is_accessible or pool.paused_reason:
            return None  # jobs wait: the sweep dispatches them once the pool resumes
        # The devices below capacity are read before the clock: a job whose end committed before
        # this read freed its device before ``now``, so the job dispatched there starts
        # (``scheduled_at``) after the one it replaces finished (``finished_at``).
        below_capacity = free_devices(pool_id)
        now = timezone.now()
        calendar = calendar_now([pool_id], now)[pool_id]
        if calendar.maintenance:
            return None  # R-RES-2: as paused, until the window ends (the sweep dispatches then)
        free = [device for device in below_capacity if not calendar.paused(device.pk)]
        if not free:
            _set_awaiting(queue, False)  # the job-finished event will dispatch
            return None
        strategy = strategy_for(pool.strategy)
        owner = claim_token()
        # R-ALLOC-1: jobs of a project with no device time left wait (``allocation_exhausted``)
        # until a new period or a raised grant; read from the allocations' own rows, one query,
        # and only on a pool that has allocations (the others are unlimited).
        exhausted = allocations.exhausted_ids(pool_id, now) if pool.has_allocations else set()
        spendable = ~Q(session__allocation_id__in=exhausted) if exhausted else None
        for _ in range(3):  # a candidate cancelled under our feet: take the next one
            job, usable = next_on_calendar(strategy, pool, queue, free, now, calendar, spendable)
            if job is None:
                _set_awaiting(queue, True)  # a device is free: the next submission wakes us
                return None
            slots, vruntime, status = (
                Session.objects.select_for_update().values_list("slots", "vruntime", "status").get(pk=job.session_id)
            )
            if status != SessionStatus.ACTIVE:
                # Its session ended and the announcement that cancels its jobs was lost (the
                # process died after the revocation committed): a job of an ended session never runs.
                Job.objects.filter(pk=job.pk, status=JobStatus.PENDING).update(
                    status=JobStatus.CANCELLED, finished_at=now, error="Session ended."
                )
                continue
            if job.target_device_id:
                device = next(d for d in usable if d.pk == job.target_device_id)
            else:  # least loaded first, then by id: spreads jobs across devices
                device = min(usable, key=lambda d: (d.running / d.max_concurrent_jobs, d.pk))
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
        if job.eta_recorded_at is not None:  # R-JOB-5: did the bound it was shown hold?
            latency.observe(pool_id, LatencyKind.ETA_BOUND, bound_ratio(job, now))
        charge = strategy.dispatch_charge(job, slots)
        if charge:
            strategy.charge(job, charge)
        strategy.served(pool, queue, job, vruntime, now)  # the virtual times (R-SCHED-2, R-SCHED-6)
        queue.last_dispatch_at = now
        queue.awaiting_work = False
        queue.save(update_fields=["last_dispatch_at", "awaiting_work"])
    job.refresh_from_db()
    job.device = device
    job._dispatch_charge = charge
    return job


def bound_ratio(job: Job, started) -> float:
    """A job's wait over the bound it was shown (``eta_p90_seconds``), both from the moment its
    expected start was recorded and floored at a second (a job that started at once says
    nothing of ratios): at most 1 when the bound held."""
    wait = max((started - job.eta_recorded_at).total_seconds(), 1.0)
    bound = (job.eta_p90_recorded_seconds or 0.0) * (job.eta_p90_factor or 1.0)
    return wait / max(bound, 1.0)


RECORD_BATCH = 500  # pending jobs whose expected start one pass records at most


def record_predictions(pool_id: int) -> int:
    """Record the expected start of the pool's pending jobs that have none yet (R-JOB-5): the
    model's median and bound, uncorrected, with the correction of the bound shown, on the job
    row alone (no pool row, no lock a submission or an admission waits on). The dispatch
    compares them with the actual start, and the pool's last starts correct the ETA
    (``eta.learn``). One query when there is nothing to record; else the list read's queries
    and one UPDATE, which skips a job dispatched or cancelled meanwhile."""
    jobs = list(
        Job.objects.filter(pool_id=pool_id, status=JobStatus.PENDING, eta_recorded_at__isnull=True)
        .select_related("pool")
        .order_by("created_at", "id")[:RECORD_BATCH]
    )
    if not jobs:
        return 0
    info = selectors.queue_info(jobs)
    now = timezone.now()
    recorded = []
    for job in jobs:
        waiting = info.get(job.pk)
        if waiting is None or waiting.estimate is None:
            continue  # no device can run it now: nothing to promise
        job.eta_recorded_at = now
        job.eta_recorded_seconds = waiting.estimate.median
        job.eta_p90_recorded_seconds = waiting.estimate.p90
        job.eta_p90_factor = waiting.eta_p90_seconds / waiting.estimate.p90 if waiting.estimate.p90 > 0 else 1.0
        job.eta_p90_level = waiting.level
        recorded.append(job)
    fields = ["eta_recorded_at", "eta_recorded_seconds", "eta_p90_recorded_seconds", "eta_p90_factor", "eta_p90_level"]
    # Only jobs still pending and unrecorded: bulk_update keeps the queryset's filter.
    return Job.objects.filter(status=JobStatus.PENDING, eta_recorded_at__isnull=True).bulk_update(recorded, fields)


def next_on_calendar(
    strategy, pool, queue, free: list[Device], now, calendar, spendable: Q | None = None
) -> tuple[Job | None, list[Device]]:
    """Which sessions' jobs may use which free device now (R-RES-1): on a device an open
    reservation covers, its holders' jobs go first (the strategy's order among them); a device
    takes anyone's job only when no holder has one it could run. Returns the job and the devices
    it may go to. ``spendable``: only jobs whose allocation has time left (R-ALLOC-1)."""
    for devices, holders in calendar.first_on(free):
        only = Q(user_id__in=holders) if spendable is None else Q(user_id__in=holders) & spendable
        job = strategy.next_job(pool, queue, [d.pk for d in devices], now, only=only)
        if job is not None:
            return job, devices
    return strategy.next_job(pool, queue, [d.pk for d in free], now, only=spendable), free


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
    # the claim and this hand-over wins too: the user saw the job pending and asked to cancel it;
    # it must never reach the device. A cancel landing after this line is a running job's cancel
    # (R-JOB-2).
    ours = Job.objects.filter(pk=job.pk, status=JobStatus.RUNNING, remote_id="")
    if not taken_over:
        ours = ours.filter(cancel_requested_at=None)
    handed_over = leases.renew(ours, owner=owner, until=timezone.now() + lease())
    if not handed_over:
        # Still ours and cancelled: finish it. Another worker's claim now: theirs to hand over or
        # cancel, nothing to do here (finishing it would cancel a job they may be submitting).
        _finish(job, DriverState("cancelled", error="Cancelled before it started."), expect_remote_id="", owner=owner)
        return
    try:
        with nullcontext() if taken_over else kept_claimed([job.pk], owner):
            remote_id = get_driver(device.driver).submit(device, job)
    except UndecidedSubmission as exc:
        log.error("job %s: %s", job.pk, exc)
        _finish(job, DriverState("unknown", error=str(exc)), expect_remote_id="", owner=owner)
        return
    except SubmissionPending as exc:
        _hold_for_answer(job, exc, owner)
        return
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


def _hold_for_answer(job: Job, exc: SubmissionPending, owner: str) -> None:
    """The device may be creating the job (its submission's answer was lost): the job stays
    running on it, holding the slot (a job sent there meanwhile could be dropped by the late one,
    or run beside it), and its claim ends so that the poll pass due at ``retry_at`` takes the
    hand-over over and asks the driver again (its submit is idempotent: it looks before it sends).
    Nothing is charged back and no transient attempt is counted: nothing failed."""
    log.warning("job %s: %s", job.pk, exc)
    line = f"{timezone.now():%Y-%m-%d %H:%M:%S} {exc}\n"
    Job.objects.filter(pk=job.pk, status=JobStatus.RUNNING, remote_id="", lease_owner=owner).update(
        lease_owner="", lease_until=None, next_poll_at=exc.retry_at, logs=(job.logs + line)[-100_000:]
    )


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
        ours = Job.objects.filter(pk=job.pk, status=JobStatus.RUNNING, remote_id="", lease_owner=job.lease_owner)
        # R-JOB-2: a cancel recorded while the hand-over failed (the job read running) ends it
        # here: it never reached the device, and never goes back to the queue it was taken out of.
        ended = ours.exclude(cancel_requested_at=None).update(
            status=JobStatus.CANCELLED,
            finished_at=now,
            lease_owner="",
            lease_until=None,
            attempts=attempts,
            error="Cancelled before it started.",
        )
        requeued = ended or ours.update(
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
    if ended:
        log.info("job %s: cancelled while its hand-over failed (%s)", job.pk, exc)
        return
    log.warning("job %s: transient driver error, back in the queue (attempt %s): %s", job.pk, attempts, exc)


def _finish(job: Job, state: DriverState, *, expect_remote_id: str, owner: str | None = None) -> bool:
    """Record a terminal state once (compare-and-set on status and remote id, and on the claim's
    ``owner`` when given: a job not yet handed over is finished only by its claim's holder)."""
    now = timezone.now()
    status = {
        "completed": JobStatus.COMPLETED,
        "failed": JobStatus.FAILED,
        "cancelled": JobStatus.CANCELLED,
        "unknown": JobStatus.UNKNOWN,
    }[state.status]
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
        if updated and status != JobStatus.CANCELLED:
            # R-NOTE-1: the outbox row commits with the job's end (one statement, none matching
            # when its owner subscribed to nothing).
            notify_job_ended(job, status, now)
        if updated and state.runtime_seconds:
            # R-ALLOC-1: charged once (the ledger's unique job), with the record of its end.
            charges.charge_job(job=job, seconds=state.runtime_seconds, now=now)
    if updated and state.runtime_seconds:
        # usage_fair charges the device time a job used, whatever its end (a failed or cancelled
        # job ran too). In its own transaction, after the job row's, taking the session first:
        # lock order session → job, as revocation and dispatch.
        # R-SCHED-6: and to the job's share, in the same transaction (lock order session → share).
        pool = ResourcePool.objects.only("strategy", "share_by", "usage_half_life").get(pk=job.pool_id)
        strategy = strategy_for(pool.strategy)
        if strategy.charge_at_completion:
            with transaction.atomic():
                slots = Session.objects.select_for_update().values_list("slots", flat=True).get(pk=job.session_id)
                if Job.objects.filter(pk=job.pk, charged=False).update(charged=True):
                    job.runtime_seconds = state.runtime_seconds
                    strategy.charge(job, strategy.completion_charge(job, slots))
                    shares.charge(pool, job.user_id, state.runtime_seconds, now.timestamp())
        if status == JobStatus.COMPLETED and job.device_id:
            runtimes.observe(job.device_id, job.shots, state.runtime_seconds)  # R-JOB-5: the ETA's figures
    return bool(updated)


def notify_job_ended(job: Job, status: str, now) -> None:
    """R-NOTE-1: the owner's ``job.finished`` (completed) or ``job.failed`` (failed, unknown)."""
    event = Event.JOB_FINISHED if status == JobStatus.COMPLETED else Event.JOB_FAILED
    word = "finished" if status == JobStatus.COMPLETED else f"ended {status}"
    notifications.notify(
        user=job.user_id,
        event=event,
        subject=f"job:{job.pk}",
        payload={
            "summary": f"Job {job.pk} {word}",
            "job": {"id": job.pk, "status": status, "pool": job.pool_id, "session": str(job.session_id)},
            "finished_at": now,
        },
        now=now,
    )


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
    due = (
        Job.objects.filter(pool_id=pool_id, status=JobStatus.RUNNING)
        .filter(Q(next_poll_at__isnull=True) | Q(next_poll_at__lte=now))
        .order_by(F("next_poll_at").asc(nulls_first=True), "id")  # NULL means "poll now"
    )
    ids = leases.claim(due, owner=owner, now=now, lease=lease(), batch=POLL_BATCH)
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
    """One pass for a pool: poll what runs, fill free devices, then record the expected start of
    the jobs left waiting (after the dispatch, which it would delay: building the ETA of a
    100 000-job queue takes seconds). Idempotent and bounded."""
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
    record_predictions(pool_id)
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
