"""Read-side helpers: device load and why a job waits (R-JOB-4)."""

import time
from collections import defaultdict
from dataclasses import dataclass

from django.db.models import Count, F, Func, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce

from apps.scheduling.models import Device, Job, JobStatus, PoolQueue
from apps.sessions.models import SessionStatus

NO_DEVICE = "no device online"
DEVICE_DOWN = "device down"  # its provider (a real QPU) reports it down or cannot be reached
BUSY = "devices busy"
NOT_ACCESSIBLE = "pool not accessible"
PAUSED = "paused"  # the pool or every usable device is paused (calibration, maintenance)
TURN = "waiting for its turn"


def _count(jobs):
    """``COUNT(*)`` of ``jobs`` as a scalar subquery (0 when none)."""
    return Coalesce(Subquery(jobs.order_by().annotate(n=Func(F("pk"), function="COUNT")).values("n")[:1]), 0)


def devices_with_load(queryset=None):
    """Devices annotated with ``running_jobs`` and ``pending_jobs``.

    Each is a count over unfinished jobs only, probing the partial indexes (running jobs by
    device, pending jobs by pool): the cost never grows with the finished jobs a device ran.
    ``pending_jobs`` counts every pending job the device could take: those naming it and those
    naming no device in its pool.
    """
    queryset = Device.objects.all() if queryset is None else queryset
    running = Job.objects.filter(device_id=OuterRef("pk"), status=JobStatus.RUNNING)
    pending = Job.objects.filter(pool_id=OuterRef("pool_id"), status=JobStatus.PENDING).filter(
        Q(target_device__isnull=True) | Q(target_device_id=OuterRef("pk"))
    )
    return queryset.annotate(running_jobs=_count(running), pending_jobs=_count(pending))


@dataclass(frozen=True)
class PoolStatus:
    """What a pool can do now, as QRMI's ``status()`` reports it: ``online`` (it runs jobs),
    ``paused`` (calibration or maintenance: sessions and jobs are taken, jobs wait) or ``offline``
    (not accessible, or no device to run on), with the reason; ``busy`` when every usable device
    runs all it may; the pending jobs, and the running ones."""

    status: str
    reason: str
    busy: bool
    pending_jobs: int
    running_jobs: int
    capacity: int  # jobs the usable devices may run at once


def pool_status(pool) -> PoolStatus:
    """The one definition of a pool's state for schedulers and clients (QRMI ``accessible`` and
    ``status``, the Slurm licence): two queries, the devices and a count of unfinished jobs."""
    devices = list(Device.objects.filter(pool_id=pool.pk).values_list("online", "paused_reason", "max_concurrent_jobs"))
    jobs = Job.objects.filter(pool_id=pool.pk, status__in=[JobStatus.PENDING, JobStatus.RUNNING]).aggregate(
        pending=Count("pk", filter=Q(status=JobStatus.PENDING)), running=Count("pk", filter=Q(status=JobStatus.RUNNING))
    )
    online = [(paused, capacity) for is_online, paused, capacity in devices if is_online]
    usable = [capacity for paused, capacity in online if not paused]
    if not pool.is_accessible:
        status, reason = "offline", pool.accessibility_message or "the pool is not accessible"
    elif pool.paused_reason:
        status, reason = "paused", pool.paused_reason
    elif not devices:
        status, reason = "offline", "the pool has no device"
    elif not online:
        status, reason = "offline", "no device of the pool is online"
    elif not usable:
        status, reason = "paused", next(paused for paused, _ in online)
    else:
        status, reason = "online", ""
    capacity = sum(usable)
    return PoolStatus(
        status=status,
        reason=reason,
        busy=status == "online" and jobs["running"] >= capacity,
        pending_jobs=jobs["pending"],
        running_jobs=jobs["running"],
        capacity=capacity,
    )


def queue_info(jobs) -> dict[int, tuple[str, int]]:
    """``{job id: (pending_reason, queue_position)}`` for the pending jobs among ``jobs``.

    A constant number of queries whatever the number of jobs. Positions follow the pool's
    strategy: FIFO rank for ``fifo``; for the fair strategies, the order in which the weighted
    scheduler would reach each job if nothing else arrived (session vruntime + k/slots for its
    k-th pending job), which for ``usage_fair`` is an estimate (device time is not known ahead).
    Positions come from a per-pool snapshot of the queue (``_snapshots``): a list read costs the
    same with 10 000 pending jobs as with 100.
    """
    pending = [j for j in jobs if j.status == JobStatus.PENDING]
    if not pending:
        return {}
    pool_ids = {j.pool_id for j in pending}
    devices = defaultdict(list)
    running = Job.objects.filter(device_id=OuterRef("pk"), status=JobStatus.RUNNING)
    online = Device.objects.filter(pool_id__in=pool_ids, online=True).annotate(running_jobs=_count(running))
    for device in online:
        devices[device.pool_id].append(device)
    pools = {j.pool_id: j.pool for j in pending}
    down_pools = set(
        Device.objects.filter(pool_id__in=pool_ids - set(devices), provider_status__in=["down", "unreachable"])
        .order_by()
        .values_list("pool_id", flat=True)
        .distinct()
    )
    listed = defaultdict(set)
    for job in pending:
        listed[job.pool_id].add(job.pk)
    snapshots = _snapshots(listed)

    info = {}
    for job in pending:
        pool = pools[job.pool_id]
        usable = devices.get(job.pool_id, [])
        if not pool.is_accessible:
            reason = NOT_ACCESSIBLE
        elif pool.paused_reason:
            reason = PAUSED
        elif not usable:
            reason = DEVICE_DOWN if job.pool_id in down_pools else NO_DEVICE
        elif all(d.paused_reason for d in usable):
            reason = PAUSED
        elif all(d.running_jobs >= d.max_concurrent_jobs for d in usable):
            reason = BUSY
        else:
            reason = TURN
        info[job.pk] = (reason, snapshots[job.pool_id].position(job.pk, fifo=pool.strategy == "fifo"))
    return info


# Per-process snapshots of pools' queues: {pool id: (version, taken at, _QueueSnapshot)}.
_SNAPSHOT_CACHE: dict[int, tuple[tuple, float, "_QueueSnapshot"]] = {}
SNAPSHOT_MAX_AGE = 5.0  # seconds: bounds what the version below does not see (a cancelled job)


def _snapshots(listed: dict[int, set]) -> dict[int, "_QueueSnapshot"]:
    """The queue snapshot of each pool, rebuilt only when the pool's queue changed.

    Reading every pending job of a pool on every list read made the first page of the job list
    grow with the backlog (bench/api_lists.py measures it). The version is one index probe per
    pool: the last dispatch and the newest pending job (a submission or a dispatch changes it); a
    cancellation or revocation alone is seen within ``SNAPSHOT_MAX_AGE`` seconds, or at once when
    a listed job is missing from the snapshot.
    """
    newest = Job.objects.filter(pool_id=OuterRef("pool_id"), status=JobStatus.PENDING).order_by("-created_at", "-id")
    versions = {
        row[0]: row[1:]
        for row in PoolQueue.objects.filter(pool_id__in=listed)
        .annotate(newest=Subquery(newest.values("id")[:1]))
        .values_list("pool_id", "last_dispatch_at", "vtime", "newest")
    }
    now = time.monotonic()
    out = {}
    for pool_id, job_ids in listed.items():
        version = versions.get(pool_id)  # None: no queue row yet, never cached
        cached = _SNAPSHOT_CACHE.get(pool_id)
        if (
            version is not None
            and cached is not None
            and cached[0] == version
            and now - cached[1] < SNAPSHOT_MAX_AGE
            and cached[2].covers(job_ids)
        ):
            out[pool_id] = cached[2]
            continue
        out[pool_id] = _QueueSnapshot(pool_id)
        if version is not None:
            _SNAPSHOT_CACHE[pool_id] = (version, now, out[pool_id])
    return out


class _QueueSnapshot:
    """Every pending job of one pool (of an active session) in (created_at, id) order: its rank
    in the pool (FIFO) and its index in its session, and the sessions' vruntime and slots (the
    fair strategies). One query, served by ``jobs_pending_pool``."""

    def __init__(self, pool_id: int):
        rows = (
            Job.objects.filter(pool_id=pool_id, status=JobStatus.PENDING, session__status=SessionStatus.ACTIVE)
            .order_by("created_at", "id")
            .values_list("id", "session_id", "session__vruntime", "session__slots", "session__created_at")
        )
        self.ranks: dict[int, tuple[int, object, int]] = {}  # job id: (rank in pool, session, index)
        self.sessions: dict = {}
        for rank, (job_id, session_id, vruntime, slots, created_at) in enumerate(rows, start=1):
            row = self.sessions.get(session_id)
            if row is None:
                row = {"id": session_id, "vruntime": vruntime, "slots": slots, "created_at": created_at, "pending": 0}
                self.sessions[session_id] = row
            self.ranks[job_id] = (rank, session_id, row["pending"])
            row["pending"] += 1
        self._fair = None

    def covers(self, job_ids) -> bool:
        return all(job_id in self.ranks for job_id in job_ids)

    def position(self, job_id: int, *, fifo: bool) -> int:
        if job_id not in self.ranks:  # its session ended meanwhile: it is about to be cancelled
            return 1
        rank, session_id, index = self.ranks[job_id]
        if fifo:
            return rank
        if self._fair is None:  # built once per snapshot, reused by every read until it changes
            self._fair = _FairQueue(list(self.sessions.values()))
        return self._fair.position(session_id, index)


class _FairQueue:
    """The runnable sessions of one pool as arrays, to place many jobs in the weighted order
    without a Python loop over every session per job (numpy comes with pulser)."""

    def __init__(self, sessions: list[dict]):
        import numpy as np

        self.np = np
        ordered = sorted(sessions, key=lambda row: (row["created_at"], row["id"]))  # the tie-break order
        self.index = {row["id"]: i for i, row in enumerate(ordered)}
        self.vruntime = np.array([row["vruntime"] for row in ordered], dtype=float)
        self.slots = np.array([row["slots"] for row in ordered], dtype=float)
        self.pending = np.array([row["pending"] for row in ordered], dtype=float)

    def position(self, session_id, index: int) -> int:
        """1 + the jobs the weighted scheduler reaches before the session's ``index``-th job."""
        np = self.np
        own = self.index.get(session_id)
        if own is None:
            return 1
        tag = self.vruntime[own] + index / self.slots[own]
        # Jobs of other sessions with a smaller tag, or an equal tag in an older session.
        span = (tag - self.vruntime) * self.slots
        before = np.where(np.arange(len(span)) < own, np.floor(span) + 1, np.ceil(span))
        ahead = np.clip(np.minimum(self.pending, before), 0, None)
        ahead[own] = index
        return int(ahead.sum()) + 1
