"""Read-side helpers: device load and why a job waits (R-JOB-4)."""

import math
import time
from collections import defaultdict
from dataclasses import dataclass

from django.db.models import Count, F, Func, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from apps.scheduling.models import Device, Job, JobStatus, PoolQueue
from apps.sessions.models import SessionStatus

# R-JOB-4: why a pending job waits, as a stable code (API ``pending_code``, Prometheus
# ``gridgate_pending_jobs{reason}``) and its text (``pending_reason``); the first that holds wins.
REASONS = {
    "pool_not_accessible": "pool not accessible",
    "pool_paused": "paused",  # calibration or maintenance
    "no_device": "no device online",
    "device_down": "device down",  # its provider (a real QPU) reports it down or cannot be reached
    "device_paused": "paused",  # every online device of the pool is paused
    "backoff": "retrying after a transient device error",
    "session_expiring": "its session ends before its expected start",
    "share_exhausted": "others have used less of their share",  # usage_fair: another share goes first
    "device_busy": "devices busy",
    "waiting_turn": "waiting for its turn",
}
NOT_ACCESSIBLE, PAUSED, NO_DEVICE = REASONS["pool_not_accessible"], REASONS["pool_paused"], REASONS["no_device"]
DEVICE_DOWN, BUSY, TURN = REASONS["device_down"], REASONS["device_busy"], REASONS["waiting_turn"]


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


@dataclass(frozen=True)
class Waiting:
    """Why a pending job waits (``code``, ``reason``), where it stands in its pool's queue and
    when it is expected to start (seconds from now, with one standard deviation; None when no
    device can run it now)."""

    code: str | None
    position: int | None
    eta_seconds: float | None
    eta_error_seconds: float | None

    @property
    def reason(self) -> str | None:
        return REASONS[self.code] if self.code else None


NOT_WAITING = Waiting(None, None, None, None)  # a job that is not pending


def queue_info(jobs) -> dict[int, Waiting]:
    """``{job id: Waiting}`` for the pending jobs among ``jobs`` (R-JOB-4, R-JOB-5).

    A constant number of queries whatever the number of jobs: what holds now (devices, access,
    pause, running jobs) is read for all the pools at once (``_now``), and each pool's order and
    the device time before each job come from a snapshot of its queue (``_snapshots``), rebuilt
    only when the queue changed: a list read costs the same with 100 000 pending jobs as with
    100. Positions and ETAs follow the pool's strategy; they assume nothing else arrives, and the
    device times measured so far.
    """
    pending = [j for j in jobs if j.status == JobStatus.PENDING]
    if not pending:
        return {}
    pools = {j.pool_id: j.pool for j in pending}
    listed: dict[int, set] = {pool_id: set() for pool_id in pools}
    for job in pending:
        listed[job.pool_id].add(job.pk)
    snapshots, states = _snapshots(listed, pools), _now(pools)
    return {job.pk: snapshots[job.pool_id].waiting(job.pk, states[job.pool_id]) for job in pending}


def session_waits(sessions) -> dict:
    """``{session id: (job id, Waiting)}`` of each active session's next job (its first in the
    pool's order): when a waiting session gets the device next."""
    active = [s for s in sessions if s.status == SessionStatus.ACTIVE]
    pools = {s.pool_id: s.pool for s in active}
    if not pools:
        return {}
    snapshots, states = _snapshots({pool_id: set() for pool_id in pools}, pools), _now(pools)
    out = {}
    for session in active:
        job_id = snapshots[session.pool_id].first_of_session.get(session.pk)
        if job_id is not None:
            out[session.pk] = (job_id, snapshots[session.pool_id].waiting(job_id, states[session.pool_id]))
    return out


def pending_by_reason(pool_ids) -> dict[tuple[int, str], int]:
    """``{(pool id, code): pending jobs}`` over ``pool_ids`` (``gridgate_pending_jobs``): the
    pools read once, then per pool its snapshot (built unless cached) and the facts of now."""
    from apps.resources.models import ResourcePool

    pools = {pool.pk: pool for pool in ResourcePool.objects.filter(pk__in=list(pool_ids))}
    if not pools:
        return {}
    snapshots, states = _snapshots({pool_id: set() for pool_id in pools}, pools), _now(pools)
    out: dict[tuple[int, str], int] = {}
    for pool_id, snapshot in snapshots.items():
        for job_id in snapshot.rank:
            code = snapshot.waiting(job_id, states[pool_id]).code
            out[(pool_id, code)] = out.get((pool_id, code), 0) + 1
    return out


@dataclass
class _PoolNow:
    """What holds now for one pool: the reason every job of it waits, if one does (``code``),
    whether every usable device runs all it may, their capacity, and the running jobs."""

    code: str | None
    busy: bool
    capacity: int
    running: list  # (device id, shots, scheduled at)
    at: object  # the time it was read
    remaining: tuple | None = None  # (mean, variance) of the running jobs' remaining device time


def _now(pools: dict) -> dict[int, _PoolNow]:
    """Three queries for every pool at once: their online devices with their load, which pools
    have a device reported down, and their running jobs."""
    at = timezone.now()
    online = defaultdict(list)
    for device in Device.objects.filter(pool_id__in=pools, online=True).annotate(running_jobs=_count_running()):
        online[device.pool_id].append(device)
    down = set()
    if set(pools) - set(online):
        down = set(
            Device.objects.filter(pool_id__in=set(pools) - set(online), provider_status__in=["down", "unreachable"])
            .order_by()
            .values_list("pool_id", flat=True)
            .distinct()
        )
    running = defaultdict(list)
    for pool_id, device_id, shots, scheduled_at in Job.objects.filter(
        pool_id__in=pools, status=JobStatus.RUNNING
    ).values_list("pool_id", "device_id", "shots", "scheduled_at"):
        running[pool_id].append((device_id, shots, scheduled_at))
    out = {}
    for pool_id, pool in pools.items():
        devices = online.get(pool_id, [])
        usable = [d for d in devices if not d.paused_reason]
        if not pool.is_accessible:
            code = "pool_not_accessible"
        elif pool.paused_reason:
            code = "pool_paused"
        elif not devices:
            code = "device_down" if pool_id in down else "no_device"
        elif not usable:
            code = "device_paused"
        else:
            code = None
        usable_ids = {d.pk for d in usable}
        out[pool_id] = _PoolNow(
            code=code,
            busy=all(d.running_jobs >= d.max_concurrent_jobs for d in usable),
            capacity=sum(d.max_concurrent_jobs for d in usable),
            running=[row for row in running.get(pool_id, []) if row[0] in usable_ids],
            at=at,
        )
    return out


# Per-process snapshots of pools' queues: {pool id: (version, taken at, _QueueSnapshot)}.
_SNAPSHOT_CACHE: dict[int, tuple[tuple, float, "_QueueSnapshot"]] = {}
SNAPSHOT_MAX_AGE = 5.0  # seconds: bounds what the version below does not see (a cancelled job)


def _snapshots(listed: dict[int, set], pools: dict) -> dict[int, "_QueueSnapshot"]:
    """The queue snapshot of each pool, rebuilt only when the pool's queue changed.

    Reading every pending job of a pool on every list read made the first page of the job list
    grow with the backlog (bench/api_lists.py measures it). The version is one index probe per
    pool: the last dispatch and the newest pending job (a submission or a dispatch changes it),
    and the virtual times; a cancellation or a charge alone is seen within ``SNAPSHOT_MAX_AGE``
    seconds, or at once when a listed job is missing from the snapshot.
    """
    newest = Job.objects.filter(pool_id=OuterRef("pool_id"), status=JobStatus.PENDING).order_by("-created_at", "-id")
    versions = {
        row[0]: row[1:]
        for row in PoolQueue.objects.filter(pool_id__in=listed)
        .annotate(newest=Subquery(newest.values("id")[:1]))
        .values_list("pool_id", "last_dispatch_at", "vtime", "share_vtime", "newest")
    }
    now = time.monotonic()
    out = {}
    for pool_id, job_ids in listed.items():
        pool = pools[pool_id]
        version = versions.get(pool_id)  # None: no queue row yet, never cached
        if version is not None:
            version = (*version, pool.strategy)
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
        out[pool_id] = _QueueSnapshot(pool)
        if version is not None:
            _SNAPSHOT_CACHE[pool_id] = (version, now, out[pool_id])
    return out


class _QueueSnapshot:
    """Every pending job of one pool (of an active session) in the order the pool's strategy
    would serve them if nothing else arrived, with the expected device time before each.

    The order: ``fifo`` by (created_at, id); ``weighted_fair`` by the start tag of each session's
    k-th job, vruntime + k/slots (ties: older session); ``usage_fair`` the same within each share
    with tags in expected device time / slots, and across shares by (decayed usage + in flight +
    the expected device time of the share's jobs before it) / weight, each level raised to its
    virtual time (``apps.scheduling.shares``). A job's expected start (``waiting``): the running
    jobs' expected remaining time plus the expected device time of every job before it, over the
    usable devices' capacity; its variance summed likewise (``apps.scheduling.runtimes``).
    """

    def __init__(self, pool):
        import numpy as np

        from apps.scheduling import runtimes

        rows = list(
            Job.objects.filter(pool_id=pool.pk, status=JobStatus.PENDING, session__status=SessionStatus.ACTIVE)
            .order_by("created_at", "id")
            .values_list(
                "id",
                "session_id",
                "user_id",
                "shots",
                "target_device_id",
                "not_before",
                "session__vruntime",
                "session__slots",
                "session__created_at",
                "session__expires_at",
            )
        )
        device_ids = list(Device.objects.filter(pool_id=pool.pk).values_list("pk", flat=True))
        self.table = runtimes.Table(device_ids)
        estimates: dict = {}

        def estimate(target, shots):
            key = (target, runtimes.band(shots))
            if key not in estimates:
                estimates[key] = self.table.on_device(target, shots) if target else self.table.on_any(device_ids, shots)
            return estimates[key]

        n = len(rows)
        ids = [row[0] for row in rows]
        mean = np.array([estimate(row[4], row[3]).mean for row in rows], dtype=float)
        var = np.array([estimate(row[4], row[3]).var for row in rows], dtype=float)
        # Each job's index in its session, and the expected device time before it there.
        index, before = np.zeros(n), np.zeros(n)
        seen: dict = {}
        for i, row in enumerate(rows):
            k, spent = seen.get(row[1], (0, 0.0))
            index[i], before[i] = k, spent
            seen[row[1]] = (k + 1, spent + mean[i])
        vruntime = np.array([row[6] for row in rows], dtype=float)
        slots = np.array([row[7] for row in rows], dtype=float)
        age = np.array([row[8].timestamp() for row in rows], dtype=float)
        session_rank = {session_id: r for r, session_id in enumerate(sorted(seen, key=str))}
        sid = np.array([session_rank[row[1]] for row in rows], dtype=float)
        self.behind_share: set = set()  # usage_fair: jobs of a share other than the one served next
        if pool.strategy == "fifo":
            order = np.arange(n)
        elif pool.strategy == "weighted_fair":
            order = np.lexsort((index, sid, age, vruntime + index / slots))
        else:
            order = self._two_level(pool, rows, ids, mean, index, before, vruntime, slots, age, sid)
        self.rank = {ids[j]: r for r, j in enumerate(order, start=1)}
        self.first_of_session: dict = {}
        for j in order:
            self.first_of_session.setdefault(rows[j][1], ids[j])
        # Device time expected before the job at each rank (its mean and variance).
        self.before_mean = np.concatenate(([0.0], np.cumsum(mean[order])))
        self.before_var = np.concatenate(([0.0], np.cumsum(var[order])))
        self.not_before = {row[0]: row[5] for row in rows if row[5] is not None}
        self.session_ends = {row[0]: row[9] for row in rows}

    def _two_level(self, pool, rows, ids, mean, index, before, vruntime, slots, age, sid):
        import numpy as np

        from apps.scheduling import shares

        now = timezone.now().timestamp()
        keys = shares.keys_of(pool, {row[2] for row in rows})
        found = shares.read(pool, set(keys.values()), now)
        flying = shares.in_flight(pool, keys)
        queue = PoolQueue.objects.filter(pool_id=pool.pk).first()
        v1 = shares.decayed(queue.share_vtime, queue.share_vtime_at, now, pool.usage_half_life) if queue else 0.0
        share_of = [keys[row[2]] for row in rows]
        share_rank = {key: r for r, key in enumerate(sorted(found))}
        share_id = np.array([share_rank[key] for key in share_of], dtype=float)
        # Level 2: within each share, by session tag in expected device time / slots.
        floor = np.array([found[key].vtime for key in share_of], dtype=float)
        inner = np.lexsort((index, sid, age, np.maximum(vruntime, floor) + before / slots, share_id))
        # Level 1: a share's next job at (usage + in flight + its jobs before it) / weight.
        start = {
            key: value * found[key].weight for key, value in shares.level_one(pool, found, flying, v1, now).items()
        }
        tag = np.zeros(len(rows))
        for j in inner:
            key = share_of[j]
            tag[j] = start[key] / found[key].weight
            start[key] += mean[j]
        in_share = np.zeros(len(rows))
        in_share[inner] = np.arange(len(rows))
        order = np.lexsort((in_share, share_id, tag))
        if len(order):
            first = share_of[order[0]]
            self.behind_share = {ids[j] for j in range(len(rows)) if share_of[j] != first}
        return order

    def covers(self, job_ids) -> bool:
        return all(job_id in self.rank for job_id in job_ids)

    def waiting(self, job_id: int, state: _PoolNow) -> Waiting:
        if job_id not in self.rank:  # its session ended meanwhile: it is about to be cancelled
            return Waiting(state.code or "waiting_turn", 1, None, None)
        rank = self.rank[job_id]
        if state.code or not state.capacity:
            return Waiting(state.code or "no_device", rank, None, None)
        if state.remaining is None:
            mean = var = 0.0
            for device_id, shots, scheduled_at in state.running:
                elapsed = (state.at - scheduled_at).total_seconds() if scheduled_at else 0.0
                left = self.table.on_device(device_id, shots).remaining(elapsed)
                mean += left.mean
                var += left.var
            state.remaining = (mean, var)
        start = (state.remaining[0] + float(self.before_mean[rank - 1])) / state.capacity
        spread = math.sqrt(state.remaining[1] + float(self.before_var[rank - 1])) / state.capacity
        ends = self.session_ends.get(job_id)
        not_before = self.not_before.get(job_id)
        if not_before is not None and not_before > state.at:
            code = "backoff"
        elif ends is not None and (ends - state.at).total_seconds() < start:
            code = "session_expiring"
        elif job_id in self.behind_share:
            code = "share_exhausted"
        elif state.busy:
            code = "device_busy"
        else:
            code = "waiting_turn"
        return Waiting(code, rank, start, spread)


def _count_running():
    return _count(Job.objects.filter(device_id=OuterRef("pk"), status=JobStatus.RUNNING))
