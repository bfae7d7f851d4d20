"""The expected start of a pending job (R-JOB-5): pure functions over plain rows, and the one
per-process cache the ETA keeps.

The selector (``apps.scheduling.selectors``) reads the database, what is pending, the measured
device times, what was submitted lately, the shares, and hands plain rows to ``Queue``, which
orders them as the pool's strategy would serve them if nothing else arrived and knows the
expected device time before each; ``Queue.estimate`` turns that and the running jobs' remaining
time into a start: its median, one standard deviation, and a bound the job beats 90 % of the
time. Nothing here queries the database, so the math is tested without one
(``tests/scheduling/unit/``).

The cache (``CACHE``, cleared by ``clear_cache``) holds each pool's queue snapshot, reused
while its queue does not change, and each pool's correction learned from its last starts
(``Correction``).
"""

import heapq
import math
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from itertools import pairwise

import numpy as np

ARRIVAL_WINDOW = 3600.0  # seconds: what a share or session submitted over this is its recent rate
Z90 = 1.2815515655446004  # the standard normal's 90th percentile


# -- the plain rows the selector hands over ------------------------------------------------------
@dataclass(frozen=True)
class Pending:
    """One pending job of an active session, with its expected device time."""

    id: int
    session_id: object
    user_id: int
    mean: float  # expected device time, seconds
    var: float
    not_before: datetime | None
    vruntime: float  # its session's
    slots: int
    session_created: float  # timestamp, the tie-break between sessions
    session_ends: datetime | None


@dataclass(frozen=True)
class Submitted:
    """Jobs one session submitted to a pool in one minute, with what the ETA reads of the session."""

    user_id: int
    session_id: object
    vruntime: float
    slots: int
    active: bool
    minute: object
    seconds: float  # expected device time
    jobs: int


@dataclass(frozen=True)
class Shares:
    """usage_fair's facts, read by the selector: each user's share, each share's virtual time
    and weight, each runnable share's level-one key now (``shares.level_one``), the decay."""

    key_of: dict  # user id -> share key
    vtime: dict  # share key -> its virtual time (the floor of its sessions' tags)
    weight: dict  # share key -> weight
    start: dict  # share key -> its key now
    half_life: float


# -- the math ------------------------------------------------------------------------------------
def growth(seconds: float, half_life: float) -> float:
    """How much more device time charged ``seconds`` from now weighs than today's usage; past 60
    half-lives today's usage is forgotten anyway (and 2^x would overflow a float)."""
    return 2.0 ** min(seconds / half_life, 60.0)


def lognormal(mean: float, variance: float) -> tuple[float, float]:
    """(mu, sigma) of the log-normal of this mean and variance."""
    sigma2 = math.log1p(variance / (mean * mean))
    return math.log(mean) - sigma2 / 2, math.sqrt(sigma2)


def median(mean: float, variance: float) -> float:
    """The median of a skewed positive quantity known by its mean and variance (a log-normal's):
    the ETA is a start as likely before as after, and waits are long-tailed (a job's device time;
    a burst that may or may not arrive)."""
    return mean / math.sqrt(1.0 + variance / (mean * mean)) if mean > 0 else 0.0


def quantile90(mean: float, variance: float) -> float:
    """The 90th percentile of the same log-normal."""
    if mean <= 0:
        return 0.0
    mu, sigma = lognormal(mean, variance)
    return math.exp(mu + Z90 * sigma)


@dataclass(frozen=True)
class Estimate:
    """A start in seconds from now: ``median`` (as likely before as after), ``std`` (one standard
    deviation), ``p90`` (beaten 90 % of the time, before any correction)."""

    median: float
    std: float
    p90: float


def estimate(queued: float, queued_var: float, arriving: float, arriving_var: float, gain: float) -> Estimate:
    """The wait: what is queued now (its mean and variance: the running jobs' rest and the jobs
    before it, over the capacity), then what others submit meanwhile and goes first (``arrivals``);
    deviations of either let more arrivals in (``gain``). The median is the sum of each part's
    median; the bound is the 90th percentile of one log-normal of the whole wait's mean and
    variance, never below the median."""
    start = median(queued, queued_var) + median(arriving, gain * gain * arriving_var)
    variance = gain * gain * (queued_var + arriving_var)
    p90 = max(quantile90(queued + arriving, variance), start)
    return Estimate(start, math.sqrt(variance), p90)


def fill(base: float, flows: list, capacity: int) -> tuple[float, float, float]:
    """What flows ``[(room, rate, lump)]`` submit while a job waits and that goes first: each at
    its rate of device time up to its room. ``base`` is the wait with nothing arriving; the wait
    ``W`` is the fixed point of ``W = base + sum(min(rate * W, room)) / capacity``, solved exactly
    (the right side is concave and piecewise linear). Returns the seconds added to ``base``, the
    variance of the flows' arrivals while their room is not used up (compound Poisson), and
    ``1 / (1 - slope)``: how much any deviation of the wait is amplified by the arrivals it lets in."""
    flows = sorted((room / rate, room, rate, lump) for room, rate, lump in flows if room > 0 and rate > 0)
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


class Flow:
    """What one share (usage_fair) or session (weighted_fair) submitted lately, added up per minute."""

    def __init__(self):
        self.minutes: dict = {}
        self.jobs = 0

    def add(self, minute, seconds: float, jobs: int) -> None:
        self.minutes[minute] = self.minutes.get(minute, 0.0) + seconds
        self.jobs += jobs

    def figures(self, end: float, seconds_per_unit: float) -> tuple:
        """For ``Queue.arrivals``: the flow's tag after its pending jobs, the device seconds a unit
        of tag stands for, its rate in device seconds per second, and how lumpy it comes (a compound
        Poisson's variance per unit of mean: each minute's device time, squared, over their sum)."""
        seconds = sum(self.minutes.values())
        lump = sum(v * v for v in self.minutes.values()) / seconds if seconds else 0.0
        return end, seconds_per_unit, seconds / ARRIVAL_WINDOW, lump

    @property
    def mean_job(self) -> float:
        return sum(self.minutes.values()) / self.jobs if self.jobs else 0.0


def session_flows(rows: list[Pending], tag, step, recent: list[Submitted], idle_start, per_job: bool) -> list:
    """[(user id, figures)] of the active sessions that submitted lately (``recent``), for
    ``Queue.arrivals``: each one's tag after its pending jobs (its last job's ``tag`` + ``step``), or
    ``idle_start(user id, vruntime)`` when none is pending; a unit of tag stands for ``slots``
    device seconds, or with ``per_job`` (tags that count jobs) ``slots`` of its mean job's."""
    submitted: dict = defaultdict(Flow)
    sessions = {}
    for submission in recent:
        if submission.active:
            submitted[submission.session_id].add(submission.minute, submission.seconds, submission.jobs)
            sessions[submission.session_id] = submission
    ends: dict = {}
    for j, row in enumerate(rows):
        ends[row.session_id] = max(ends.get(row.session_id, -math.inf), float(tag[j] + step[j]))
    out = []
    for session_id, flow in submitted.items():
        session = sessions[session_id]
        end = ends.get(session_id, idle_start(session.user_id, session.vruntime))
        out.append((session.user_id, flow.figures(end, session.slots * (flow.mean_job if per_job else 1.0))))
    return out


class Queue:
    """Every pending job of one pool (``rows``, in submission order) in the order the pool's
    strategy would serve them if nothing else arrived, with the expected device time before each.

    The order: ``fifo`` by (created_at, id); ``weighted_fair`` by the start tag of each session's
    k-th job, vruntime + k/slots (ties: older session); ``usage_fair`` the same within each share
    with tags in expected device time / slots, and across shares by (decayed usage + in flight +
    the expected device time of the share's jobs before it, charged later weighing more) /
    weight, each level raised to its virtual time (``apps.scheduling.shares``). What others may
    submit meanwhile and that goes first: ``arrivals``, from ``recent`` (none in fifo).
    ``vtime``: weighted_fair's pool virtual time; ``shares``: usage_fair's facts.
    """

    def __init__(
        self,
        strategy: str,
        rows: list[Pending],
        *,
        capacity: int,
        recent: list[Submitted] = (),
        vtime: float = 0.0,
        shares: Shares | None = None,
    ):
        n = len(rows)
        self.capacity = capacity
        ids = [row.id for row in rows]
        mean = np.array([row.mean for row in rows], dtype=float)
        var = np.array([row.var for row in rows], dtype=float)
        # Each job's index in its session, and the expected device time before it there.
        index, before = np.zeros(n), np.zeros(n)
        seen: dict = {}
        for i, row in enumerate(rows):
            k, spent = seen.get(row.session_id, (0, 0.0))
            index[i], before[i] = k, spent
            seen[row.session_id] = (k + 1, spent + mean[i])
        vruntime = np.array([row.vruntime for row in rows], dtype=float)
        slots = np.array([row.slots for row in rows], dtype=float)
        age = np.array([row.session_created for row in rows], dtype=float)
        session_rank = {session_id: r for r, session_id in enumerate(sorted(seen, key=str))}
        sid = np.array([session_rank[row.session_id] for row in rows], dtype=float)
        self.behind_share: set = set()  # usage_fair: jobs of a share other than the one served next
        # What may arrive and go first (``arrivals``): each job's tag in its strategy's order and
        # the expected device time before it; each flow's tag after its pending jobs, the device
        # seconds a unit of tag stands for, what it submitted lately. None in a fifo pool.
        self.tag: dict = {}  # job id -> (tag, expected seconds before it, its share, its tag there)
        self.flows: list = []  # figures (``Flow.figures``) of the flows of the pool's order
        self.siblings: dict = {}  # usage_fair: {share: figures of its sessions}, the order within it
        self.half_life = math.inf  # usage_fair: device time charged later weighs more
        if strategy == "fifo":
            order = np.arange(n)
        elif strategy == "weighted_fair":
            tag = vruntime + index / slots
            order = np.lexsort((index, sid, age, tag))
            flows = session_flows(rows, tag, 1.0 / slots, recent, lambda user_id, v: max(v, vtime), True)
            self.flows = [figures for _, figures in flows]
            self.tag = {ids[j]: (float(tag[j]), 0.0, None, 0.0) for j in range(n)}
        else:
            order = self._two_level(shares, rows, ids, mean, index, before, vruntime, slots, age, sid, recent)
        self.rank = {ids[j]: r for r, j in enumerate(order, start=1)}
        self.first_of_session: dict = {}
        for j in order:
            self.first_of_session.setdefault(rows[j].session_id, ids[j])
        # Device time expected before the job at each rank (its mean and variance).
        self.before_mean = np.concatenate(([0.0], np.cumsum(mean[order])))
        self.before_var = np.concatenate(([0.0], np.cumsum(var[order])))
        self.not_before = {row.id: row.not_before for row in rows if row.not_before is not None}
        self.session_ends = {row.id: row.session_ends for row in rows}
        self.user_of = {row.id: row.user_id for row in rows}
        self.pending_users = frozenset(self.user_of.values())

    def _two_level(self, shares: Shares, rows, ids, mean, index, before, vruntime, slots, age, sid, recent):
        """The usage_fair order, and what the ETA needs to foresee arrivals (``self.flows``)."""
        keys = shares.key_of
        submitted: dict = defaultdict(Flow)
        for r in recent:
            submitted[keys[r.user_id]].add(r.minute, r.seconds, r.jobs)
        share_of = [keys[row.user_id] for row in rows]
        share_rank = {key: r for r, key in enumerate(sorted(shares.vtime))}
        share_id = np.array([share_rank[key] for key in share_of], dtype=float)
        # Level 2: within each share, by session tag in expected device time / slots.
        floor = np.array([shares.vtime[key] for key in share_of], dtype=float)
        inner_tag = np.maximum(vruntime, floor) + before / slots
        inner = np.lexsort((index, sid, age, inner_tag, share_id))
        queues: dict = {}
        for j in inner:
            queues.setdefault(share_of[j], []).append(j)
        # Level 1: the share with the smallest key goes next; a job adds its expected device time
        # over the share's weight. Keys are decayed to now, so device time charged later weighs
        # more (2^(t / half-life) at t seconds from now): the sooner the past is forgotten.
        start = dict(shares.start)
        capacity = max(self.capacity, 1)
        heap = [(start[key], share_rank[key], key, 0) for key in queues]
        heapq.heapify(heap)
        order, elapsed = [], 0.0
        while heap:
            value, rank, key, k = heapq.heappop(heap)
            j = queues[key][k]
            order.append(j)
            self.tag[ids[j]] = (value, elapsed, key, float(inner_tag[j]))
            value += mean[j] * growth(elapsed, shares.half_life) / shares.weight[key]
            elapsed += mean[j] / capacity
            start[key] = value
            if k + 1 < len(queues[key]):
                heapq.heappush(heap, (value, rank, key, k + 1))
        # Each share that submitted lately may add before a job: its key after its pending jobs,
        # and a key unit is 1 / weight device seconds; within the job's own share, its sessions
        # (an idle one starts at the share's virtual time).
        self.flows = [flow.figures(start[key], shares.weight[key]) for key, flow in submitted.items()]
        self.half_life = shares.half_life

        def idle_start(user_id, v):
            return max(v, shares.vtime[keys[user_id]])

        for user_id, figures in session_flows(rows, inner_tag, mean / slots, recent, idle_start, False):
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
        ``fill`` solves the wait; returns what it returns."""
        if job_id not in self.tag:
            return 0.0, 0.0, 1.0
        tag, at, share, inner_tag = self.tag[job_id]
        g = growth(at, self.half_life)
        rooms = [((tag - end) * unit / g, rate, lump) for end, unit, rate, lump in self.flows]
        # None for the job's own flow (share, session): it ends past the job.
        rooms += [((inner_tag - end) * unit, rate, lump) for end, unit, rate, lump in self.siblings.get(share, ())]
        return fill(base, rooms, capacity)

    def covers(self, job_ids) -> bool:
        return all(job_id in self.rank for job_id in job_ids)

    def estimate(self, job_id: int, remaining: tuple[float, float], capacity: int) -> Estimate:
        """The start of a ranked job when the running jobs have ``remaining`` (mean, variance) of
        device time left, on ``capacity`` jobs at once."""
        rank = self.rank[job_id]
        queued = (remaining[0] + float(self.before_mean[rank - 1])) / capacity
        queued_var = (remaining[1] + float(self.before_var[rank - 1])) / capacity**2
        arriving, arriving_var, gain = self.arrivals(job_id, queued, capacity)
        return estimate(queued, queued_var, arriving, arriving_var, gain)


def capacity_left(spans: list[tuple[float, float, object]], capacity_of: dict) -> list[tuple[float, float, float]]:
    """[(from, to, share)] seconds from now, in order and apart: the share of the devices'
    capacity (``capacity_of``, {device: jobs at once}) left while ``spans`` ([(from, to, device)],
    None: every device) keep devices off, where some is lost. Two spans on one device count once."""
    total = sum(capacity_of.values())
    points = sorted({point for start, end, _ in spans for point in (start, end)})
    out: list[tuple[float, float, float]] = []
    for start, end in pairwise(points):
        off = {device for a, b, device in spans if a <= start and end <= b}
        lost = total if None in off else sum(capacity_of.get(device, 0) for device in off)
        share = max(1.0 - lost / total, 0.0) if total else 0.0
        if share >= 1.0:
            continue
        if out and out[-1][1] == start and out[-1][2] == share:
            out[-1] = (out[-1][0], end, share)
        else:
            out.append((start, end, share))
    return out


def push_past(wait: float, slowed: list[tuple[float, float, float]]) -> float:
    """The start of a job that needs ``wait`` seconds of its devices' time before it when the
    calendar leaves only a ``share`` of that time during ``slowed`` ([(from, to, share)] seconds
    from now, in order and apart: ``capacity_left``): the clock runs at that share in each one it
    reaches, and stops in one that leaves nothing (a maintenance window, others' reservation on
    every device the job may use), so a start that would fall in it moves to its end."""
    t, need = 0.0, wait
    for start, end, share in slowed:
        if end <= t:
            continue
        if start > t + need:
            break
        need -= max(start - t, 0.0)
        t = max(t, start)
        if share > 0 and need < share * (end - t):
            return t + need / share
        need -= share * (end - t)
        t = end
    return t + need


# -- self-correction -----------------------------------------------------------------------------
CORRECTION_STARTS = 200  # the last dispatched jobs of a pool a correction is learned from
CORRECTION_MIN = 30  # fewer recorded starts: no correction
CORRECTION_MAX = 8.0  # the bound's correction widens it at most this much
LEVEL_RANGE = (0.5, 0.99)  # the quantile the bound's correction is learned at stays in this range
CORRECTION_MAX_AGE = 60.0  # seconds a pool's correction is reused


@dataclass(frozen=True)
class Correction:
    """What a pool's last starts say about its predictions: multiply the bound by ``p90`` to make
    it hold 9 times in 10; ``level`` is the quantile of the starts' actual / predicted bound that
    ``p90`` is, ``starts`` how many it is learned from, ``coverage`` how often the bound shown to
    those jobs (corrected as it was then) held, ``early`` how often they started by the median
    shown (promised: half of them)."""

    p90: float = 1.0
    starts: int = 0
    coverage: float | None = None
    early: float | None = None
    level: float = 0.9

    def apply(self, found: Estimate) -> tuple[float, float]:
        """The (median, bound) shown: the bound corrected, never below the median."""
        return found.median, max(found.p90 * self.p90, found.median)


NO_CORRECTION = Correction()


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def learn(starts: list[tuple[float, float, float, float, float | None]]) -> Correction:
    """The correction from recorded starts ``[(predicted median wait, predicted bound, actual
    wait, bound shown, level it was learned at)]`` in seconds, the predictions uncorrected: a
    quantile of actual / predicted bound, at least 1. Waits are floored at one second (a job that
    started at once says nothing of ratios).

    The quantile is the level those bounds were learned at (0.9 when none was), raised by what
    they fell short of holding 9 times in 10, or lowered by what they held beyond: the level
    integrates the coverage's error, as adaptive conformal inference does (Gibbs and Candès,
    2021), so the bound holds 9 times in 10 over the pool's run even while its waits shift and
    the starts it learns from lag behind them. The integral lives in the job rows (the level
    each recorded), not in a row every dispatch would write.

    Only the bound is corrected, and only widened: the last starts come in runs that waited
    behind the same jobs, and a factor learned from one run and applied to the next added its
    noise to the median and made a narrowed bound miss (bench/eta.py; docs/api.md)."""
    if not starts:
        return NO_CORRECTION
    n = len(starts)
    coverage = sum(max(actual, 1.0) <= max(shown, 1.0) for _, _, actual, shown, _ in starts) / n
    early = sum(max(actual, 1.0) <= max(median, 1.0) for median, _, actual, _, _ in starts) / n
    if n < CORRECTION_MIN:
        return Correction(starts=n, coverage=coverage, early=early)
    used = statistics.fmean(0.9 if level is None else level for *_, level in starts)
    level = min(max(used + 0.9 - coverage, LEVEL_RANGE[0]), LEVEL_RANGE[1])
    to_bound = [max(actual, 1.0) / max(bound, 1.0) for _, bound, actual, _, _ in starts]
    return Correction(min(max(_quantile(to_bound, level), 1.0), CORRECTION_MAX), n, coverage, early, level)


# -- the one per-process cache -------------------------------------------------------------------
@dataclass
class Cache:
    """Per-process: each pool's queue snapshot ``{pool id: (version, taken at, snapshot)}`` and
    its correction ``learned``, ``{pool id: (taken at, Correction)}``, monotonic times."""

    snapshots: dict = field(default_factory=dict)
    learned: dict = field(default_factory=dict)

    def clear(self) -> None:
        self.snapshots.clear()
        self.learned.clear()

    def corrections(self, pool_ids, read) -> dict[int, Correction]:
        """Each pool's correction, learned again once a ``CORRECTION_MAX_AGE``: ``read(pool ids)``
        returns ``{pool id: its recorded starts}`` for the pools whose correction is stale (one
        query for them all)."""
        now = time.monotonic()
        out, stale = {}, []
        for pool_id in pool_ids:
            cached = self.learned.get(pool_id)
            if cached is not None and now - cached[0] < CORRECTION_MAX_AGE:
                out[pool_id] = cached[1]
            else:
                stale.append(pool_id)
        if stale:
            starts = read(stale)
            for pool_id in stale:
                out[pool_id] = learn(starts.get(pool_id, []))
                self.learned[pool_id] = (now, out[pool_id])
        return out


CACHE = Cache()


def clear_cache() -> None:
    """Forget every snapshot and correction of this process (tests: pool ids are reused)."""
    CACHE.clear()
