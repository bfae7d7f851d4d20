"""Per-pool latency histograms of the scheduler, counted in the database when the event happens.

Two histograms (``LatencyKind``), exported by ``/metrics`` (docs/metrics.md):

- **queue wait**: a job's ``created_at`` → its dispatch (``scheduled_at``), observed in
  ``dispatch_once`` under the pool's queue lock. A job requeued after a transient driver error
  is observed again at its next dispatch (each dispatch is one observation).
- **eta bound**: not a duration but a dispatched job's wait over the bound it was shown
  (``eta_p90_seconds``, both from the moment its expected start was recorded, each floored at a
  second), observed in ``dispatch_once`` for the jobs with one recorded: the share at or below 1
  is the bound's observed coverage (R-JOB-5; 90 % promised).
- **dispatch**: the dispatch → the driver's acceptance (``remote_id`` recorded), observed in
  ``submit_claimed``: how long handing a job to its device takes, including a recovered claim
  whose first worker died.

Why rows written at the event rather than a count over the jobs at scrape time: the web and
worker processes are many, on several hosts, so no process's memory holds the whole picture;
a count over retained jobs grows with history (a sequential scan of every finished job per
scrape) and goes *down* when cleanup deletes old jobs, which Prometheus reads as a counter
reset and turns into a spike in ``rate()``. Here each observation is one single-row UPDATE
(under the pool queue lock for the queue wait, so it adds no contention there) and a scrape
reads a few rows per pool, while a per-bucket ``count(*) FILTER`` over retained jobs alone would
cost more than the whole scrape and keep growing (bench/metrics_scrape.py; docs/metrics.md).
An observation is one more single-row UPDATE in a transaction that commits anyway.
"""

import math

from django.db import IntegrityError, transaction
from django.db.models import F

from apps.scheduling.models import JobLatencyBucket, LatencyKind

# Upper bounds in seconds. Queue waits range from sub-second (a free emulator) to hours (a busy
# QPU); a hand-over is a driver call: milliseconds locally, seconds to a cloud provider.
BUCKETS: dict[str, tuple[float, ...]] = {
    LatencyKind.QUEUE_WAIT: (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400, 86400, math.inf),
    LatencyKind.DISPATCH: (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, math.inf),
    # A ratio, not seconds: the wait over the bound shown (1: the bound held, just).
    LatencyKind.ETA_BOUND: (0.1, 0.25, 0.5, 0.75, 0.9, 1, 1.1, 1.25, 1.5, 2, 3, 5, 10, math.inf),
}


def bucket_for(kind: str, seconds: float) -> float:
    return next(le for le in BUCKETS[kind] if seconds <= le)


def observe(pool_id: int, kind: str, seconds: float) -> None:
    """Count one observation. Negative durations (clocks of two hosts) count as 0."""
    seconds = max(float(seconds), 0.0)
    le = bucket_for(kind, seconds)
    rows = JobLatencyBucket.objects.filter(pool_id=pool_id, kind=kind, le=le)
    if rows.update(count=F("count") + 1, sum=F("sum") + seconds):
        return
    try:
        with transaction.atomic():  # a savepoint: losing the insert race must not abort the caller's transaction
            JobLatencyBucket.objects.create(pool_id=pool_id, kind=kind, le=le, count=1, sum=seconds)
    except IntegrityError:  # another worker created the bucket first: count on its row
        rows.update(count=F("count") + 1, sum=F("sum") + seconds)
