"""Usage per (user, pool) over a period (SPEC §7 ``GET /accounting/``).

Everything a QRMI client does is an ordinary session and job (R-QRMI-3), so it is counted here
like the rest. Aggregation happens in the database, one grouped query per kind of usage; only
the wait-time percentile is computed in Python, over the waits of the period.
"""

import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.db import connection, models
from django.db.models import Aggregate, Avg, Count, DurationField, ExpressionWrapper, F, IntegerField, Q, Sum, Value
from django.db.models.functions import Coalesce, Greatest, Least
from django.utils import timezone

from apps.cases.models import Case
from apps.scheduling.models import Job
from apps.sessions.models import Session, SessionStatus

# Accepted period bounds: outside them ``until - 30 days`` and the SQL interval arithmetic overflow
# (``?until=0001-01-01`` was a 500). A date out of range is the client's error.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)


def alive_since(since: datetime) -> Q:
    """Sessions not revoked before ``since``: the active ones and those revoked after it. Written
    with the status, not ``revoked_at IS NULL`` (the same rows, by the check constraint
    sessions_revoked_at_matches_status), so that the partial indexes sessions_active_pool and
    sessions_revoked serve it and the sessions that ended before ``since`` are never read."""
    return Q(status=SessionStatus.ACTIVE) | Q(revoked_at__gt=since)


def _p95(values: list[float]) -> float | None:
    return percentile(values, 0.95)


def usage(since: datetime, until: datetime, *, pool_id: int | None = None, username: str | None = None) -> list[dict]:
    rows: dict[tuple[str, str], dict] = defaultdict(
        lambda: {
            "session_slot_hours": 0.0,
            "sessions": 0,
            "jobs": {},
            "device_seconds": 0.0,
            "wait_mean_seconds": None,
            "wait_p95_seconds": None,
            "cases": {},
            "case_execution_seconds": 0.0,
        }
    )

    sessions = Session.objects.filter(created_at__lt=until).filter(alive_since(since))
    jobs = Job.objects.filter(created_at__gte=since, created_at__lt=until)
    cases = Case.objects.filter(created_at__gte=since, created_at__lt=until)
    if pool_id is not None:
        sessions, jobs = sessions.filter(pool_id=pool_id), jobs.filter(pool_id=pool_id)
        cases = cases.filter(resource_class__pool_id=pool_id)
    if username:
        sessions, jobs = sessions.filter(user__username=username), jobs.filter(user__username=username)
        cases = cases.filter(owner__username=username)

    # Slot-hours: slots × the part of each session's life inside the period.
    overlap = ExpressionWrapper(
        Least(Coalesce("revoked_at", Value(until)), Value(until)) - Greatest("created_at", Value(since)),
        output_field=DurationField(),
    )
    for row in (
        sessions.annotate(overlap=overlap)
        .values("user__username", "pool__name", "slots", "overlap")
        .iterator(chunk_size=2000)
    ):
        entry = rows[(row["user__username"], row["pool__name"])]
        entry["session_slot_hours"] += row["slots"] * max(row["overlap"].total_seconds(), 0) / 3600
        entry["sessions"] += 1

    for row in jobs.values("user__username", "pool__name", "status").annotate(n=Count("id")).order_by():
        rows[(row["user__username"], row["pool__name"])]["jobs"][row["status"]] = row["n"]
    wait = ExpressionWrapper(F("scheduled_at") - F("created_at"), output_field=DurationField())
    dispatched = jobs.filter(scheduled_at__isnull=False)
    for row in (
        jobs.values("user__username", "pool__name")
        .annotate(
            device=Coalesce(Sum("runtime_seconds"), 0.0), wait_mean=Avg(wait, filter=Q(scheduled_at__isnull=False))
        )
        .order_by()
    ):
        entry = rows[(row["user__username"], row["pool__name"])]
        entry["device_seconds"] = round(row["device"], 3)
        if row["wait_mean"] is not None:
            entry["wait_mean_seconds"] = round(row["wait_mean"].total_seconds(), 3)
    waits = defaultdict(list)
    for row in dispatched.annotate(wait=wait).values("user__username", "pool__name", "wait").iterator(chunk_size=5000):
        waits[(row["user__username"], row["pool__name"])].append(row["wait"].total_seconds())
    for key, values in waits.items():
        rows[key]["wait_p95_seconds"] = round(_p95(values), 3)

    for row in (
        cases.values("owner__username", "resource_class__pool__name", "status")
        .annotate(n=Count("id"), execution=Coalesce(Sum("execution_time"), 0.0))
        .order_by()
    ):
        entry = rows[(row["owner__username"], row["resource_class__pool__name"])]
        entry["cases"][row["status"]] = row["n"]
        entry["case_execution_seconds"] += row["execution"]

    out = []
    for (user, pool), entry in sorted(rows.items()):
        entry["session_slot_hours"] = round(entry["session_slot_hours"], 4)
        entry["case_execution_seconds"] = round(entry["case_execution_seconds"], 3)
        out.append({"user": user, "pool": pool, **entry})
    return out


# -- utilization over time (the operators' charts) -------------------------------------------------
#: Bucket widths tried in order: the first that cuts the period into at most MAX_BUCKETS buckets.
STEPS = [timedelta(minutes=m) for m in (5, 15, 60, 180, 360, 720, 1440, 7 * 1440)]
MAX_BUCKETS = 60
#: The longest period the charts accept (one year and a day), so a bucket is at most a week.
MAX_PERIOD = timedelta(days=366)


@dataclass(frozen=True)
class Bucket:
    start: datetime
    end: datetime

    @property
    def seconds(self) -> float:
        return (self.end - self.start).total_seconds()


def buckets(since: datetime, until: datetime) -> tuple[timedelta, list[Bucket]]:
    """Cut ``[since, until)`` into buckets of a round width, their edges on multiples of the width
    since a Monday's midnight in UTC (whole hours, whole days, weeks from Monday); the first and
    last may be partial."""
    if not since < until <= since + MAX_PERIOD:
        raise ValueError("the period must be positive and at most MAX_PERIOD long")
    span = until - since
    step = next((s for s in STEPS if span / s <= MAX_BUCKETS), STEPS[-1])
    epoch = datetime(1970, 1, 5, tzinfo=UTC)  # a Monday: a week's bucket is Monday to Sunday
    first_edge = epoch + step * math.ceil((since - epoch) / step)
    edges = [since]
    edge = first_edge if first_edge > since else first_edge + step
    while edge < until:
        edges.append(edge)
        edge += step
    edges.append(until)
    return step, [Bucket(a, b) for a, b in zip(edges, edges[1:], strict=False)]


@dataclass
class DeviceUse:
    name: str
    capacity: int  # jobs it runs at once
    busy_seconds: float  # job-seconds it held in the period


@dataclass
class PoolUtilization:
    """One pool over the period, each list one value per bucket."""

    pool_id: int
    name: str
    slots_total: int | None
    slots: list[float | None]  # slots held, averaged over the bucket's elapsed part (None: all in the future)
    busy_seconds: list[float]  # job-seconds the pool's devices were held
    capacity: int  # jobs the pool's devices run at once (sum of max_concurrent_jobs)
    wait_p50: list[float | None]  # seconds, jobs dispatched in the bucket (None: none dispatched)
    wait_p95: list[float | None]
    devices: list[DeviceUse] = field(default_factory=list)
    dispatched: int = 0
    wait_p50_all: float | None = None
    wait_p95_all: float | None = None
    jobs: dict[str, int] = field(default_factory=dict)  # jobs created in the period, by status
    cases: dict[str, int] = field(default_factory=dict)  # cases created in the period, by status

    def busy_share(self, elapsed: list[float]) -> list[float | None]:
        """Busy job-seconds over what the pool's *current* devices could run in the elapsed part of
        each bucket (:attr:`Utilization.elapsed`; None: no device, or a bucket all in the future).
        Devices added or removed since make older buckets' shares approximate, and can take one
        over 1: it is reported as it is, never clamped."""
        return [
            busy / (self.capacity * seconds) if self.capacity and seconds > 0 else None
            for busy, seconds in zip(self.busy_seconds, elapsed, strict=True)
        ]

    @property
    def active(self) -> bool:
        return bool(any(self.slots) or any(self.busy_seconds) or self.jobs or self.cases)


@dataclass
class Utilization:
    since: datetime
    until: datetime
    step: timedelta
    buckets: list[Bucket]
    pools: list[PoolUtilization]
    #: seconds of each bucket up to now: a bucket's averages are over this part (the current
    #: bucket of a period that includes today is partly in the future; later ones are empty)
    elapsed: list[float]


class PercentileDisc(Aggregate):
    """PostgreSQL's ``percentile_disc``: the first value whose cumulative share reaches the
    fraction, i.e. the nearest rank, the same definition as :func:`percentile` in Python."""

    function = "PERCENTILE_DISC"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"

    def __init__(self, expression, fraction: float, **extra):
        super().__init__(expression, fraction=float(fraction), **extra)


def percentile(values: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile: the smallest value with at least ``fraction`` of them at or below it."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(fraction * len(ordered)) - 1))]


def _overlap(start, end, bucket: Bucket):
    """The part of ``[start, end)`` inside the bucket, as a duration (negative when disjoint: filter)."""
    return ExpressionWrapper(
        Least(end, Value(bucket.end)) - Greatest(start, Value(bucket.start)), output_field=DurationField()
    )


def _held_per_bucket(start: str, end: str, parts: list[Bucket], now) -> dict:
    """``{"b<i>": Σ overlap of [start, end or now) with bucket i}`` for the buckets that began
    before ``now``: the time sessions held slots, or jobs held a device, in each bucket."""
    until = Coalesce(end, Value(now))
    return {
        f"b{i}": Sum(
            _overlap(F(start), until, b),
            filter=Q(**{f"{start}__lt": b.end}) & (Q(**{f"{end}__isnull": True}) | Q(**{f"{end}__gt": b.start})),
        )
        for i, b in enumerate(parts)
        if b.start < now
    }


def _bucket_of(field_name: str, parts: list[Bucket]):
    """The index of the bucket a moment falls in, computed by the database (NULL outside the period)."""
    return models.Case(
        *(models.When(**{f"{field_name}__lt": b.end}, then=Value(i)) for i, b in enumerate(parts)),
        output_field=IntegerField(),
    )


def percentiles_in_sql() -> bool:
    """PostgreSQL ranks the waits itself; elsewhere (SQLite) they are ranked in Python."""
    return connection.vendor == "postgresql"


def _seconds(value) -> float:
    return value.total_seconds() if value is not None else 0.0


def utilization(
    since: datetime, until: datetime, *, pool_ids: list[int] | None = None, now: datetime | None = None
) -> Utilization:
    """Per pool and per bucket of ``[since, until)``: slots held, device time held by jobs, queue
    wait p50/p95 of the jobs dispatched, and jobs and cases created in the period by status.

    Eight queries (seven on SQLite) whatever the number of pools, sessions, jobs and cases: every series is summed or
    bucketed by the database (one aggregate column per bucket for what spans buckets, a CASE
    bucket index for what happens at a moment). The wait percentiles are PostgreSQL's
    ``percentile_disc``; SQLite (the demo) has no percentile aggregate, so there the waits of the
    period are read in one query and ranked in Python with the same nearest-rank definition.
    Sessions still active, and jobs still running, count until ``now``; averages and shares are
    over the part of each bucket before ``now`` (none for a bucket entirely after it).
    """
    from apps.resources.models import ResourcePool
    from apps.scheduling.models import Device

    now = now or timezone.now()
    step, parts = buckets(since, until)
    n = len(parts)
    elapsed = [max((min(b.end, now) - b.start).total_seconds(), 0.0) for b in parts]
    pools_qs = ResourcePool.objects.order_by("name", "id")
    if pool_ids is not None:
        pools_qs = pools_qs.filter(pk__in=pool_ids)
    pools = {
        pool.pk: PoolUtilization(
            pool_id=pool.pk,
            name=pool.name,
            slots_total=pool.slots_total,
            slots=[0.0 if seconds > 0 else None for seconds in elapsed],
            busy_seconds=[0.0] * n,
            capacity=0,
            wait_p50=[None] * n,
            wait_p95=[None] * n,
        )
        for pool in pools_qs.only("id", "name", "slots_total")
    }
    ids = list(pools)

    devices = {}
    for device in (
        Device.objects.filter(pool_id__in=ids).order_by("name", "id").only("pool_id", "name", "max_concurrent_jobs")
    ):
        use = DeviceUse(device.name, device.max_concurrent_jobs, 0.0)
        devices[device.pk] = use
        pools[device.pool_id].devices.append(use)
        pools[device.pool_id].capacity += device.max_concurrent_jobs

    # Slots held: Σ slots × overlap / bucket length. SQLite cannot multiply a duration by a
    # number, so the durations are summed per (pool, slots) and multiplied here: a handful of rows.
    sums = _held_per_bucket("created_at", "revoked_at", parts, now)
    sessions = Session.objects.filter(pool_id__in=ids, created_at__lt=min(until, now)).filter(alive_since(since))
    for row in sessions.order_by().values("pool_id", "slots").annotate(**sums):
        series = pools[row["pool_id"]].slots
        for i, seconds in enumerate(elapsed):
            if seconds > 0:
                series[i] += row["slots"] * _seconds(row.get(f"b{i}")) / seconds

    # Device time held: each dispatched job from dispatch to its end (or now), per device.
    sums = _held_per_bucket("scheduled_at", "finished_at", parts, now)
    held = Job.objects.filter(
        pool_id__in=ids, device__isnull=False, scheduled_at__isnull=False, scheduled_at__lt=min(until, now)
    ).filter(Q(finished_at__isnull=True) | Q(finished_at__gt=since))
    for row in held.order_by().values("pool_id", "device_id").annotate(**sums):
        series = pools[row["pool_id"]].busy_seconds
        total = 0.0
        for i in range(n):
            seconds = _seconds(row.get(f"b{i}"))
            series[i] += seconds
            total += seconds
        if row["device_id"] in devices:
            devices[row["device_id"]].busy_seconds += total

    # Queue wait of the jobs dispatched in the period, by the bucket of their dispatch.
    wait = ExpressionWrapper(F("scheduled_at") - F("created_at"), output_field=DurationField())
    dispatched = Job.objects.filter(pool_id__in=ids, scheduled_at__gte=since, scheduled_at__lt=until)
    if percentiles_in_sql():
        percentiles = {
            "p50": PercentileDisc(wait, 0.5, output_field=DurationField()),
            "p95": PercentileDisc(wait, 0.95, output_field=DurationField()),
            "n": Count("id"),
        }
        # Two grouped queries: per bucket, and over the whole period (a percentile of percentiles
        # is not the period's percentile).
        for row in (
            dispatched.annotate(bucket=_bucket_of("scheduled_at", parts))
            .order_by()
            .values("pool_id", "bucket")
            .annotate(**percentiles)
        ):
            pool = pools[row["pool_id"]]
            pool.wait_p50[row["bucket"]] = _seconds(row["p50"])
            pool.wait_p95[row["bucket"]] = _seconds(row["p95"])
        for row in dispatched.order_by().values("pool_id").annotate(**percentiles):
            pool = pools[row["pool_id"]]
            pool.dispatched = row["n"]
            pool.wait_p50_all, pool.wait_p95_all = _seconds(row["p50"]), _seconds(row["p95"])
    else:
        waits: dict[int, list[list[float]]] = {pk: [[] for _ in parts] for pk in ids}
        rows = dispatched.annotate(bucket=_bucket_of("scheduled_at", parts), wait=wait)
        for pool_id, bucket, value in rows.order_by().values_list("pool_id", "bucket", "wait").iterator(5000):
            waits[pool_id][bucket].append(value.total_seconds())
        for pool_id, per_bucket in waits.items():
            pool = pools[pool_id]
            pool.wait_p50 = [percentile(values, 0.5) for values in per_bucket]
            pool.wait_p95 = [percentile(values, 0.95) for values in per_bucket]
            everything = [v for values in per_bucket for v in values]
            pool.dispatched = len(everything)
            pool.wait_p50_all, pool.wait_p95_all = percentile(everything, 0.5), percentile(everything, 0.95)

    created = {"created_at__gte": since, "created_at__lt": until}
    for row in (
        Job.objects.filter(pool_id__in=ids, **created).order_by().values("pool_id", "status").annotate(n=Count("id"))
    ):
        pools[row["pool_id"]].jobs[row["status"]] = row["n"]
    for row in (
        Case.objects.filter(resource_class__pool_id__in=ids, **created)
        .order_by()
        .values("resource_class__pool_id", "status")
        .annotate(n=Count("id"))
    ):
        pools[row["resource_class__pool_id"]].cases[row["status"]] = row["n"]

    return Utilization(since=since, until=until, step=step, buckets=parts, pools=list(pools.values()), elapsed=elapsed)
