"""Read-side helpers: device load and why a job waits (R-JOB-4)."""

import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta

from django.db.models import Count, F, Func, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce, TruncMinute
from django.utils import timezone

from apps.reservations.selectors import now_for as calendar_now
from apps.scheduling import eta, runtimes
from apps.scheduling.models import UNFINISHED, Device, Job, JobStatus, PoolQueue
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


def visible_jobs(user, jobs=None):
    """The jobs ``user`` may read (``jobs``: among these): their own; staff all. A service
    principal that acts on others' sessions (it sees them, to release them) reads only its own
    jobs: others' payloads and results are theirs (SPEC §10)."""
    jobs = Job.objects.all() if jobs is None else jobs
    return jobs if user.is_staff else jobs.filter(user=user)


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
    jobs = Job.objects.filter(pool_id=pool.pk, status__in=UNFINISHED).aggregate(
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
    when it is expected to start, in seconds from now (None when no device can run it now): the
    median (``eta_seconds``, as likely before as after), one standard deviation of it
    (``eta_error_seconds``) and a start it beats 90 % of the time (``eta_p90_seconds``, corrected
    by what the pool's last starts showed); ``estimate``: the model's own figures, before
    correction, and ``level``: the quantile the bound's correction was learned at (what the
    dispatcher records to learn the next correction)."""

    code: str | None
    position: int | None
    eta_seconds: float | None
    eta_error_seconds: float | None
    eta_p90_seconds: float | None = None
    estimate: eta.Estimate | None = field(default=None, compare=False)
    level: float | None = field(default=None, compare=False)

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
    others submit meanwhile at their recent rates (``eta.Queue.arrivals``), and the
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

    correction: eta.Correction = eta.NO_CORRECTION  # what the pool's last starts taught (``eta.learn``)
    # R-RES-1/2 ahead: the live windows until ``CALENDAR_AHEAD``, and the usable devices' jobs at once
    windows: tuple = ()
    capacity_of: dict = field(default_factory=dict)
    _slowed: dict = field(default_factory=dict)  # (user id, target) -> ``slowed_for``, per read

    def slowed(self, user_id: int, target: int | None) -> list[tuple[float, float, float]]:
        """``slowed_for`` of this read's windows, once per user and target device: a list's jobs
        mostly share both."""
        key = (user_id, target)
        if key not in self._slowed:
            self._slowed[key] = slowed_for(self.windows, self.capacity_of, user_id, target, self.at)
        return self._slowed[key]


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
    calendars = calendar_now(pools, at, CALENDAR_AHEAD)
    corrections = eta.CACHE.corrections(pools, recorded_starts)
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
            correction=corrections[pool_id],
            windows=calendar.upcoming,
            capacity_of={d.pk: d.max_concurrent_jobs for d in usable},
        )
    return out


CALENDAR_AHEAD = timedelta(days=7)  # the ETA pushes a start past the calendar's windows this far ahead


def slowed_for(windows, capacity_of: dict, user_id: int, target: int | None, at) -> list[tuple[float, float, float]]:
    """``eta.capacity_left`` of the calendar for a job of ``user_id``, seconds from ``at``
    (R-RES-1, R-RES-2): a maintenance window, or a reservation it does not hold, keeps a device
    off: on the whole pool or the job's target device it stops the job's clock, on some of the
    pool's usable devices (``capacity_of``, {device id: jobs at once}) it slows the pool to what
    the others leave."""
    spans = []
    for w in windows:
        if w.kind != "maintenance" and user_id in w.holders:
            continue
        if target and w.device_id not in (None, target):
            continue
        device = None if w.device_id is None or w.device_id == target else w.device_id
        spans.append(((w.start - at).total_seconds(), (w.end - at).total_seconds(), device))
    return eta.capacity_left(spans, capacity_of)


def recorded_starts(pool_ids) -> dict[int, list[tuple[float, float, float, float, float | None]]]:
    """``{pool id: [(median wait expected, bound expected, actual wait, bound shown, the level
    its correction was learned at)]}`` of each pool's last ``eta.CORRECTION_STARTS`` dispatched
    jobs whose expected start was recorded (the expectations uncorrected), in seconds: what
    ``eta.learn`` corrects the ETA from. One query for every pool (a window over the
    jobs_eta_recorded_pool index), not a counter row written at each dispatch."""
    from django.db.models import Window
    from django.db.models.functions import RowNumber

    rows = (
        Job.objects.filter(pool_id__in=list(pool_ids), eta_recorded_at__isnull=False, scheduled_at__isnull=False)
        .annotate(nth=Window(RowNumber(), partition_by=[F("pool_id")], order_by=F("scheduled_at").desc()))
        .filter(nth__lte=eta.CORRECTION_STARTS)
        .order_by()
        .values_list(
            "pool_id",
            "eta_recorded_seconds",
            "eta_p90_recorded_seconds",
            "eta_p90_factor",
            "eta_p90_level",
            "eta_recorded_at",
            "scheduled_at",
        )
    )
    out: dict[int, list] = defaultdict(list)
    for pool_id, median, bound, factor, level, recorded_at, scheduled_at in rows:
        actual = (scheduled_at - recorded_at).total_seconds()
        out[pool_id].append((median, bound, actual, bound * (factor or 1.0), level))
    return out


# The per-process snapshots of pools' queues live in the ETA's one cache (``eta.CACHE``).
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
    cache = eta.CACHE.snapshots
    out = {}
    for pool_id, job_ids in listed.items():
        pool = pools[pool_id]
        queue = queues.get(pool_id)  # None: no queue row yet, the snapshot is never reused
        version = None
        if queue is not None:
            version = (queue.last_dispatch_at, queue.vtime, queue.share_vtime, queue.newest, pool.strategy)
        cached = cache.get(pool_id)
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
        cache[pool_id] = (version, now, out[pool_id])  # version None: only its arrivals are reused
    return out


class _QueueSnapshot:
    """What one pool's queue reads from the database for the ETA (``apps.scheduling.eta``):
    every pending job of an active session with its expected device time
    (``apps.scheduling.runtimes``), what was submitted lately, the shares (usage_fair), ordered
    and summed by ``eta.Queue``; ``waiting`` adds the facts of now (``_PoolNow``)."""

    def __init__(self, pool, queue, recent=None):
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

        pending = [
            eta.Pending(
                id=pk,
                session_id=session_id,
                user_id=user_id,
                mean=estimate(target, shots).mean,
                var=estimate(target, shots).var,
                not_before=not_before,
                vruntime=vruntime,
                slots=slots,
                session_created=created.timestamp(),
                session_ends=ends,
            )
            for pk, session_id, user_id, shots, target, not_before, vruntime, slots, created, ends, _ in rows
        ]
        self.recent = None  # (monotonic time read, ``_recent_submissions``), fifo: never read
        shares_now = None
        if pool.strategy != "fifo":
            self.recent = recent or (time.monotonic(), _recent_submissions(pool, self.table))
        if pool.strategy == "usage_fair":
            shares_now = _shares(pool, queue, {row.user_id for row in pending}, self.recent[1])
        self.queue = eta.Queue(
            pool.strategy,
            pending,
            capacity=self.capacity,
            recent=self.recent[1] if self.recent else (),
            vtime=queue.vtime if queue else 0.0,
            shares=shares_now,
        )
        self.rank = self.queue.rank
        self.first_of_session = self.queue.first_of_session
        self.target_of = {row[0]: row[4] for row in rows if row[4] is not None}
        self.allocation_of = {row[0]: row[10] for row in rows if row[10] is not None}

    def covers(self, job_ids) -> bool:
        return self.queue.covers(job_ids)

    def behind_reservation(self, job_id: int, state: _PoolNow) -> bool:
        """R-RES-1: the job is not its reservation holders' and they have work on the devices the
        open reservation covers (pending or running): theirs goes first."""
        holders = state.reserved_for
        if holders is None or self.queue.user_of.get(job_id) in holders:
            return False
        return bool(holders & (self.queue.pending_users | state.running_users))

    def remaining(self, state: _PoolNow) -> tuple[float, float]:
        """(mean, variance) of the running jobs' remaining device time, computed once per read."""
        if state.remaining is None:
            mean = var = 0.0
            for device_id, shots, scheduled_at in state.running:
                elapsed = (state.at - scheduled_at).total_seconds() if scheduled_at else 0.0
                left = self.table.on_device(device_id, shots).remaining(elapsed)
                mean += left.mean
                var += left.var
            state.remaining = (mean, var)
        return state.remaining

    def waiting(self, job_id: int, state: _PoolNow) -> Waiting:
        if job_id not in self.rank:  # its session ended meanwhile: it is about to be cancelled
            return Waiting(state.code or "waiting_turn", 1, None, None)
        rank = self.rank[job_id]
        if state.code or not state.capacity:
            return Waiting(state.code or "no_device", rank, None, None)
        found = self.queue.estimate(job_id, self.remaining(state), state.capacity)
        start, bound = state.correction.apply(found)
        queue = self.queue
        if state.windows:  # the calendar's windows stop or slow the job's clock
            slowed = state.slowed(queue.user_of[job_id], self.target_of.get(job_id))
            if slowed:
                start, bound = eta.push_past(start, slowed), eta.push_past(bound, slowed)
                found = eta.Estimate(eta.push_past(found.median, slowed), found.std, eta.push_past(found.p90, slowed))
        ends = queue.session_ends.get(job_id)
        not_before = queue.not_before.get(job_id)
        if state.allocation_exhausted(self.allocation_of.get(job_id)):
            code = "allocation_exhausted"
        elif not_before is not None and not_before > state.at:
            code = "backoff"
        elif self.behind_reservation(job_id, state):
            code = "reserved"
        elif ends is not None and (ends - state.at).total_seconds() < start:
            code = "session_expiring"
        elif job_id in queue.behind_share:
            code = "share_exhausted"
        elif state.busy:
            code = "device_busy"
        else:
            code = "waiting_turn"
        return Waiting(code, rank, start, found.std, bound, found, state.correction.level)


def _shares(pool, queue, user_ids, recent) -> eta.Shares:
    """usage_fair's facts for ``eta.Queue``: the shares of the pending and recent users, their
    virtual times, weights and level-one keys now (``apps.scheduling.shares``)."""
    from apps.scheduling import shares

    now = timezone.now().timestamp()
    keys = shares.keys_of(pool, set(user_ids) | {r.user_id for r in recent})
    found = shares.read(pool, set(keys.values()), now)
    flying = shares.in_flight(pool, keys)
    v1 = shares.decayed(queue.share_vtime, queue.share_vtime_at, now, pool.usage_half_life) if queue else 0.0
    return eta.Shares(
        key_of=keys,
        vtime={key: share.vtime for key, share in found.items()},
        weight={key: share.weight for key, share in found.items()},
        start=shares.level_one(pool, found, flying, v1, now),
        half_life=pool.usage_half_life,
    )


def _recent_submissions(pool, table) -> list[eta.Submitted]:
    """What was submitted to ``pool`` over the last ``eta.ARRIVAL_WINDOW``, per session and minute."""
    since = timezone.now() - timedelta(seconds=eta.ARRIVAL_WINDOW)
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
        out.append(eta.Submitted(user_id, session_id, vruntime, slots, active, minute, n * means[key], n))
    return out


def _count_running():
    return _count(Job.objects.filter(device_id=OuterRef("pk"), status=JobStatus.RUNNING))
