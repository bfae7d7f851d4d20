"""Read-side helpers: device load and why a job waits (R-JOB-4)."""

import math
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta

from django.db.models import Count, F, Func, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce, TruncMinute
from django.utils import timezone

from apps.reservations.selectors import now_for as calendar_now
from apps.scheduling import runtimes
from apps.scheduling.models import Device, Job, JobStatus, PoolQueue
from apps.sessions.models import SessionStatus

# R-JOB-4: why a pending job waits, as a stable code (API ``pending_code``, Prometheus
# ``gridgate_pending_jobs{reason}``) and its text (``pending_reason``); the first that holds wins.
REASONS = {
    "pool_not_accessible": "pool not accessible",
    "pool_paused": "paused",  # calibration or maintenance
    "maintenance": "maintenance window",  # R-RES-2: the calendar pauses the pool or every usable device
    "no_device": "no device online",
    "device_down": "device down",  # its provider (a real QPU) reports it down or cannot be reached
    "device_paused": "paused",  # every online device of the pool is paused
    "allocation_exhausted": "your project's allocation is used up for this period",  # R-ALLOC-1
    "backoff": "retrying after a transient device error",
    "reserved": "reserved for others now",  # R-RES-1: the holders of an open reservation go first
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
    ``status``, the Slurm licence): three queries, the calendar (a maintenance window pauses the
    pool or a device with its title, R-RES-2), the devices and a count of unfinished jobs."""
    calendar = calendar_now([pool.pk], timezone.now())[pool.pk]  # R-RES-2: maintenance pauses
    devices = [
        (is_online, paused or calendar.paused(pk), capacity)
        for pk, is_online, paused, capacity in Device.objects.filter(pool_id=pool.pk).values_list(
            "pk", "online", "paused_reason", "max_concurrent_jobs"
        )
    ]
    jobs = Job.objects.filter(pool_id=pool.pk, status__in=[JobStatus.PENDING, JobStatus.RUNNING]).aggregate(
        pending=Count("pk", filter=Q(status=JobStatus.PENDING)), running=Count("pk", filter=Q(status=JobStatus.RUNNING))
    )
    online = [(paused, capacity) for is_online, paused, capacity in devices if is_online]
    usable = [capacity for paused, capacity in online if not paused]
    if not pool.is_accessible:
        status, reason = "offline", pool.accessibility_message or "the pool is not accessible"
    elif pool.paused_reason or calendar.maintenance:
        status, reason = "paused", pool.paused_reason or calendar.maintenance
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
    100. Positions follow the pool's strategy as if nothing else arrived; ETAs also expect what
    others submit meanwhile at their recent rates (``_QueueSnapshot.arrivals``), and the
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
    # R-RES-1: the holders of the open reservations covering every usable device (None: no such
    # reservation), and the users whose jobs run now
    reserved_for: frozenset | None = None
    running_users: frozenset = frozenset()
    pool_id: int = 0
    exhausted: set | None = None  # R-ALLOC-1: read once, when a listed job spends an allocation

    def allocation_exhausted(self, allocation_id) -> bool:
        if allocation_id is None:
            return False
        if self.exhausted is None:
            from apps.allocations.selectors import exhausted_ids

            self.exhausted = exhausted_ids(self.pool_id, self.at)
        return allocation_id in self.exhausted


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
    running_users = defaultdict(set)
    for pool_id, device_id, shots, scheduled_at, user_id in Job.objects.filter(
        pool_id__in=pools, status=JobStatus.RUNNING
    ).values_list("pool_id", "device_id", "shots", "scheduled_at", "user_id"):
        running[pool_id].append((device_id, shots, scheduled_at))
        running_users[pool_id].add(user_id)
    calendars = calendar_now(pools, at)
    out = {}
    for pool_id, pool in pools.items():
        calendar = calendars[pool_id]
        devices = online.get(pool_id, [])
        usable = [d for d in devices if not d.paused_reason and not calendar.paused(d.pk)]
        if not pool.is_accessible:
            code = "pool_not_accessible"
        elif pool.paused_reason:
            code = "pool_paused"
        elif calendar.maintenance:
            code = "maintenance"
        elif not devices:
            code = "device_down" if pool_id in down else "no_device"
        elif not usable:
            code = "maintenance" if any(calendar.paused(d.pk) for d in devices) else "device_paused"
        else:
            code = None
        covering = [r for r in calendar.reserved if r.device_id is None or {d.pk for d in usable} <= {r.device_id}]
        usable_ids = {d.pk for d in usable}
        out[pool_id] = _PoolNow(
            code=code,
            busy=all(d.running_jobs >= d.max_concurrent_jobs for d in usable),
            capacity=sum(d.max_concurrent_jobs for d in usable),
            running=[row for row in running.get(pool_id, []) if row[0] in usable_ids],
            at=at,
            reserved_for=frozenset().union(*(r.holders for r in covering)) if covering else None,
            running_users=frozenset(running_users.get(pool_id, ())),
            pool_id=pool_id,
        )
    return out


# Per-process snapshots of pools' queues: {pool id: (version, taken at, _QueueSnapshot)}.
_SNAPSHOT_CACHE: dict[int, tuple[tuple, float, "_QueueSnapshot"]] = {}
SNAPSHOT_MAX_AGE = 5.0  # seconds: bounds what the version below does not see (a cancelled job)
ARRIVALS_MAX_AGE = 60.0  # seconds: a snapshot's figures of the last hour's submissions are reused this long


def _snapshots(listed: dict[int, set], pools: dict) -> dict[int, "_QueueSnapshot"]:
    """The queue snapshot of each pool, rebuilt only when the pool's queue changed.

    Reading every pending job of a pool on every list read made the first page of the job list
    grow with the backlog (bench/api_lists.py measures it). The version is one index probe per
    pool, with its queue row: the last dispatch and the newest pending job (a submission or a
    dispatch changes it), and the virtual times, which a rebuild reads from that row; a
    cancellation or a charge alone is seen within ``SNAPSHOT_MAX_AGE`` seconds, or at once when a
    listed job is missing from the snapshot.
    """
    newest = Job.objects.filter(pool_id=OuterRef("pool_id"), status=JobStatus.PENDING).order_by("-created_at", "-id")
    queues = {
        queue.pool_id: queue
        for queue in PoolQueue.objects.filter(pool_id__in=listed).annotate(newest=Subquery(newest.values("id")[:1]))
    }
    now = time.monotonic()
    out = {}
    for pool_id, job_ids in listed.items():
        pool = pools[pool_id]
        queue = queues.get(pool_id)  # None: no queue row yet, the snapshot is never reused
        version = None
        if queue is not None:
            version = (queue.last_dispatch_at, queue.vtime, queue.share_vtime, queue.newest, pool.strategy)
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
        # What the pool's users submitted in the last hour (the ETA's arrival rates) is read again
        # once a minute, not at each rebuild: a busy pool's queue changes at every submission.
        previous = cached[2].recent if cached is not None else None
        fresh = previous is not None and now - previous[0] < ARRIVALS_MAX_AGE
        out[pool_id] = _QueueSnapshot(pool, queue, previous if fresh else None)
        _SNAPSHOT_CACHE[pool_id] = (version, now, out[pool_id])  # version None: only its arrivals are reused
    return out


class _QueueSnapshot:
    """Every pending job of one pool (of an active session) in the order the pool's strategy
    would serve them if nothing else arrived, with the expected device time before each.

    The order: ``fifo`` by (created_at, id); ``weighted_fair`` by the start tag of each session's
    k-th job, vruntime + k/slots (ties: older session); ``usage_fair`` the same within each share
    with tags in expected device time / slots, and across shares by (decayed usage + in flight +
    the expected device time of the share's jobs before it, charged later weighing more) /
    weight, each level raised to its virtual time (``apps.scheduling.shares``). A job's expected
    start (``waiting``): the running jobs' expected remaining time plus the expected device time
    of every job before it, over the usable devices' capacity, its variance summed likewise
    (``apps.scheduling.runtimes``); then what others are expected to submit meanwhile and that
    goes first (``arrivals``); shown as the median of the sum.
    """

    def __init__(self, pool, queue, recent=None):
        import numpy as np

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
                "session__allocation_id",
            )
        )
        devices = list(Device.objects.filter(pool_id=pool.pk).values_list("pk", "max_concurrent_jobs"))
        device_ids = [pk for pk, _ in devices]
        self.capacity = sum(n for _, n in devices)
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
        # What may arrive and go first (``arrivals``): each job's tag in its strategy's order and
        # the expected device time before it; each flow's tag after its pending jobs, the device
        # seconds a unit of tag stands for, what it submitted lately. None in a fifo pool.
        self.tag: dict = {}  # job id -> (tag, expected seconds before it, its share, its tag there)
        self.flows: list = []  # figures (``_Flow.figures``) of the flows of the pool's order
        self.siblings: dict = {}  # usage_fair: {share: figures of its sessions}, the order within it
        self.half_life = math.inf  # usage_fair: device time charged later weighs more
        self.recent = None  # (monotonic time read, ``_recent_submissions``), fifo: never read
        if pool.strategy == "fifo":
            order = np.arange(n)
        elif pool.strategy == "weighted_fair":
            tag = vruntime + index / slots
            order = np.lexsort((index, sid, age, tag))
            self.recent = recent or (time.monotonic(), _recent_submissions(pool, self.table))
            v = queue.vtime if queue else 0.0
            flows = _session_flows(
                rows, tag, 1.0 / slots, self.recent[1], lambda user_id, vruntime: max(vruntime, v), True
            )
            self.flows = [figures for _, figures in flows]
            self.tag = {ids[j]: (float(tag[j]), 0.0, None, 0.0) for j in range(n)}
        else:
            self.recent = recent or (time.monotonic(), _recent_submissions(pool, self.table))
            order = self._two_level(pool, queue, rows, ids, mean, index, before, vruntime, slots, age, sid)
        self.rank = {ids[j]: r for r, j in enumerate(order, start=1)}
        self.first_of_session: dict = {}
        for j in order:
            self.first_of_session.setdefault(rows[j][1], ids[j])
        # Device time expected before the job at each rank (its mean and variance).
        self.before_mean = np.concatenate(([0.0], np.cumsum(mean[order])))
        self.before_var = np.concatenate(([0.0], np.cumsum(var[order])))
        self.not_before = {row[0]: row[5] for row in rows if row[5] is not None}
        self.session_ends = {row[0]: row[9] for row in rows}
        self.user_of = {row[0]: row[2] for row in rows}
        self.allocation_of = {row[0]: row[10] for row in rows if row[10] is not None}
        self.pending_users = frozenset(self.user_of.values())

    def _two_level(self, pool, queue, rows, ids, mean, index, before, vruntime, slots, age, sid):
        """The usage_fair order, and what the ETA needs to foresee arrivals (``self.flows``)."""
        import heapq

        import numpy as np

        from apps.scheduling import shares

        now = timezone.now().timestamp()
        recent = self.recent[1]
        keys = shares.keys_of(pool, {row[2] for row in rows} | {r.user_id for r in recent})
        submitted: dict = defaultdict(_Flow)
        for r in recent:
            submitted[keys[r.user_id]].add(r.minute, r.seconds, r.jobs)
        found = shares.read(pool, set(keys.values()), now)
        flying = shares.in_flight(pool, keys)
        v1 = shares.decayed(queue.share_vtime, queue.share_vtime_at, now, pool.usage_half_life) if queue else 0.0
        share_of = [keys[row[2]] for row in rows]
        share_rank = {key: r for r, key in enumerate(sorted(found))}
        share_id = np.array([share_rank[key] for key in share_of], dtype=float)
        # Level 2: within each share, by session tag in expected device time / slots.
        floor = np.array([found[key].vtime for key in share_of], dtype=float)
        inner_tag = np.maximum(vruntime, floor) + before / slots
        inner = np.lexsort((index, sid, age, inner_tag, share_id))
        queues: dict = {}
        for j in inner:
            queues.setdefault(share_of[j], []).append(j)
        # Level 1: the share with the smallest key goes next; a job adds its expected device time
        # over the share's weight. Keys are decayed to now, so device time charged later weighs
        # more (2^(t / half-life) at t seconds from now): the sooner the past is forgotten.
        start = shares.level_one(pool, found, flying, v1, now)
        capacity = max(self.capacity, 1)
        heap = [(start[key], share_rank[key], key, 0) for key in queues]
        heapq.heapify(heap)
        order, elapsed = [], 0.0
        while heap:
            value, rank, key, k = heapq.heappop(heap)
            j = queues[key][k]
            order.append(j)
            self.tag[ids[j]] = (value, elapsed, key, float(inner_tag[j]))
            value += mean[j] * _growth(elapsed, pool.usage_half_life) / found[key].weight
            elapsed += mean[j] / capacity
            start[key] = value
            if k + 1 < len(queues[key]):
                heapq.heappush(heap, (value, rank, key, k + 1))
        # Each share that submitted lately may add before a job: its key after its pending jobs,
        # and a key unit is 1 / weight device seconds; within the job's own share, its sessions
        # (an idle one starts at the share's virtual time).
        self.flows = [flow.figures(start[key], found[key].weight) for key, flow in submitted.items()]
        self.half_life = pool.usage_half_life

        def idle_start(user_id, vruntime):
            return max(vruntime, found[keys[user_id]].vtime)

        for user_id, figures in _session_flows(rows, inner_tag, mean / slots, recent, idle_start, False):
            self.siblings.setdefault(keys[user_id], []).append(figures)
        if order:
            first = share_of[order[0]]
            self.behind_share = {ids[j] for j in range(len(rows)) if share_of[j] != first}
        return np.array(order, dtype=int)

    def arrivals(self, job_id: int, base: float, capacity: int) -> tuple[float, float, float]:
        """What the other flows (sessions in weighted_fair; in usage_fair the other shares, and the
        other sessions of the job's share) are expected to submit while the job waits and that
        goes first: each submits at its recent rate of device time, up to the room its tag leaves
        below the job's (usage_fair's shares: weighted, and device time charged later weighs more).
        ``base`` is the wait with nothing arriving; the wait ``W`` is the fixed point of
        ``W = base + sum(min(rate * W, room)) / capacity``, solved exactly (the right side is
        concave and piecewise linear). Returns the seconds added to ``base``, the
        variance of the flows' arrivals while their room is not used up (compound Poisson), and
        ``1 / (1 - slope)``: how much any deviation of the wait is amplified by the arrivals it
        lets in."""
        if job_id not in self.tag:
            return 0.0, 0.0, 1.0
        tag, at, share, inner_tag = self.tag[job_id]
        growth = _growth(at, self.half_life)
        rooms = [((tag - end) * unit / growth, rate, lump) for end, unit, rate, lump in self.flows]
        rooms += [((inner_tag - end) * unit, rate, lump) for end, unit, rate, lump in self.siblings.get(share, ())]
        # None for the job's own flow (share, session): it ends past the job.
        flows = [(room / rate, room, rate, lump) for room, rate, lump in rooms if room > 0 and rate > 0]
        flows.sort()
        constant, slope, filled = base, sum(f[2] for f in flows) / capacity, 0
        for breakpoint, room, rate, _ in flows:
            if slope < 1 and constant / (1 - slope) <= breakpoint:
                break
            constant += room / capacity
            slope -= rate / capacity
            filled += 1
        wait = constant / (1 - slope) if slope < 1 else constant
        variance = sum(rate * wait * lump for _, _, rate, lump in flows[filled:]) / (capacity * capacity)
        return wait - base, variance, 1.0 / (1.0 - slope) if slope < 1 else 1.0

    def behind_reservation(self, job_id: int, state: _PoolNow) -> bool:
        """R-RES-1: the job is not its reservation holders' and they have work on the devices the
        open reservation covers (pending or running): theirs goes first."""
        holders = state.reserved_for
        if holders is None or self.user_of.get(job_id) in holders:
            return False
        return bool(holders & (self.pending_users | state.running_users))

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
        # The wait: what is queued now (the running jobs' rest and the jobs before it), then what
        # others submit meanwhile that goes first; deviations of either let more arrivals in.
        queued = (state.remaining[0] + float(self.before_mean[rank - 1])) / state.capacity
        queued_var = (state.remaining[1] + float(self.before_var[rank - 1])) / state.capacity**2
        arriving, arriving_var, gain = self.arrivals(job_id, queued, state.capacity)
        start = _median(queued, queued_var) + _median(arriving, gain * gain * arriving_var)
        spread = gain * math.sqrt(queued_var + arriving_var)
        ends = self.session_ends.get(job_id)
        not_before = self.not_before.get(job_id)
        if state.allocation_exhausted(self.allocation_of.get(job_id)):
            code = "allocation_exhausted"
        elif not_before is not None and not_before > state.at:
            code = "backoff"
        elif self.behind_reservation(job_id, state):
            code = "reserved"
        elif ends is not None and (ends - state.at).total_seconds() < start:
            code = "session_expiring"
        elif job_id in self.behind_share:
            code = "share_exhausted"
        elif state.busy:
            code = "device_busy"
        else:
            code = "waiting_turn"
        return Waiting(code, rank, start, spread)


def _growth(seconds: float, half_life: float) -> float:
    """How much more device time charged ``seconds`` from now weighs than today's usage; past 60
    half-lives today's usage is forgotten anyway (and 2^x would overflow a float)."""
    return 2.0 ** min(seconds / half_life, 60.0)


def _median(mean: float, variance: float) -> float:
    """The median of a skewed positive quantity known by its mean and variance (a log-normal's):
    the ETA is a start as likely before as after, and waits are long-tailed (a job's device time;
    a burst that may or may not arrive)."""
    return mean / math.sqrt(1.0 + variance / (mean * mean)) if mean > 0 else 0.0


ARRIVAL_WINDOW = 3600.0  # seconds: what a share submitted over this is its recent rate


def _session_flows(rows, tag, step, recent, idle_start, per_job: bool) -> list:
    """[(user id, figures)] of the active sessions that submitted lately (``recent``), for
    ``arrivals``: each one's tag after its pending jobs (its last job's ``tag`` + ``step``), or
    ``idle_start(user id, vruntime)`` when none is pending; a unit of tag stands for ``slots``
    device seconds, or with ``per_job`` (tags that count jobs) ``slots`` of its mean job's."""
    submitted: dict = defaultdict(_Flow)
    sessions = {}
    for submission in recent:
        if submission.active:
            submitted[submission.session_id].add(submission.minute, submission.seconds, submission.jobs)
            sessions[submission.session_id] = submission
    ends: dict = {}
    for j, row in enumerate(rows):
        ends[row[1]] = max(ends.get(row[1], -math.inf), float(tag[j] + step[j]))
    out = []
    for session_id, flow in submitted.items():
        session = sessions[session_id]
        end = ends.get(session_id, idle_start(session.user_id, session.vruntime))
        out.append((session.user_id, flow.figures(end, session.slots * (flow.mean_job if per_job else 1.0))))
    return out


@dataclass(frozen=True)
class _Submitted:
    """Jobs one session submitted to a pool in one minute, with what the ETA reads of the session."""

    user_id: int
    session_id: object
    vruntime: float
    slots: int
    active: bool
    minute: object
    seconds: float  # expected device time
    jobs: int


def _recent_submissions(pool, table) -> list[_Submitted]:
    """What was submitted to ``pool`` over the last ``ARRIVAL_WINDOW``, per session and minute."""
    since = timezone.now() - timedelta(seconds=ARRIVAL_WINDOW)
    grouped = (
        "user_id",
        "session_id",
        "session__vruntime",
        "session__slots",
        "session__status",
        "target_device_id",
        "shots",
    )
    rows = (
        Job.objects.filter(pool_id=pool.pk, created_at__gte=since)
        .order_by()
        .values(*grouped, minute=TruncMinute("created_at"))
        .annotate(n=Count("pk"))
        .values_list(*grouped, "minute", "n")
    )
    device_ids = list(table.devices)
    means: dict = {}
    out = []
    for user_id, session_id, vruntime, slots, status, target, shots, minute, n in rows:
        key = (target, runtimes.band(shots))
        if key not in means:
            means[key] = (table.on_device(target, shots) if target else table.on_any(device_ids, shots)).mean
        active = status == SessionStatus.ACTIVE
        out.append(_Submitted(user_id, session_id, vruntime, slots, active, minute, n * means[key], n))
    return out


class _Flow:
    """What one share (usage_fair) or session (weighted_fair) submitted lately, added up per minute."""

    def __init__(self):
        self.minutes: dict = {}
        self.jobs = 0

    def add(self, minute, seconds: float, jobs: int) -> None:
        self.minutes[minute] = self.minutes.get(minute, 0.0) + seconds
        self.jobs += jobs

    def figures(self, end: float, seconds_per_unit: float) -> tuple:
        """For ``arrivals``: the flow's tag after its pending jobs, the device seconds a unit of
        tag stands for, its rate in device seconds per second, and how lumpy it comes (a compound
        Poisson's variance per unit of mean: each minute's device time, squared, over their sum)."""
        seconds = sum(self.minutes.values())
        lump = sum(v * v for v in self.minutes.values()) / seconds if seconds else 0.0
        return end, seconds_per_unit, seconds / ARRIVAL_WINDOW, lump

    @property
    def mean_job(self) -> float:
        return sum(self.minutes.values()) / self.jobs if self.jobs else 0.0


def _count_running():
    return _count(Job.objects.filter(device_id=OuterRef("pk"), status=JobStatus.RUNNING))
