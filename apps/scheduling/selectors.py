"""Read-side helpers: device load and why a job waits (R-JOB-4)."""

from collections import defaultdict

from django.db import connection
from django.db.models import Count, F, Q, Window
from django.db.models.functions import RowNumber

from apps.scheduling.models import Device, Job, JobStatus
from apps.sessions.models import Session, SessionStatus

NO_DEVICE = "no device online"
DEVICE_DOWN = "device down"  # its provider (a real QPU) reports it down or cannot be reached
BUSY = "devices busy"
NOT_ACCESSIBLE = "pool not accessible"
TURN = "waiting for its turn"


def devices_with_load(queryset=None):
    queryset = Device.objects.all() if queryset is None else queryset
    return queryset.annotate(
        running_jobs=Count("jobs", filter=Q(jobs__status=JobStatus.RUNNING), distinct=True),
        pending_jobs=Count("targeted_jobs", filter=Q(targeted_jobs__status=JobStatus.PENDING), distinct=True),
    )


def queue_info(jobs) -> dict[int, tuple[str, int]]:
    """``{job id: (pending_reason, queue_position)}`` for the pending jobs among ``jobs``.

    A constant number of queries whatever the number of jobs. Positions follow the pool's
    strategy: FIFO rank for ``fifo``; for the fair strategies, the order in which the weighted
    scheduler would reach each job if nothing else arrived (session vruntime + k/slots for its
    k-th pending job), which for ``usage_fair`` is an estimate (device time is not known ahead).
    """
    pending = [j for j in jobs if j.status == JobStatus.PENDING]
    if not pending:
        return {}
    pool_ids = {j.pool_id for j in pending}
    devices = defaultdict(list)
    for device in devices_with_load(Device.objects.filter(pool_id__in=pool_ids, online=True)):
        devices[device.pool_id].append(device)
    pools = {j.pool_id: j.pool for j in pending}
    down_pools = set(
        Device.objects.filter(pool_id__in=pool_ids - set(devices), provider_status__in=["down", "unreachable"])
        .order_by()
        .values_list("pool_id", flat=True)
        .distinct()
    )

    fifo_pools = {p for p in pool_ids if pools[p].strategy == "fifo"}
    in_session = _ranks(
        Job.objects.filter(session_id__in={j.session_id for j in pending}), "session_id", [j.pk for j in pending]
    )
    in_pool = (
        _ranks(
            Job.objects.filter(pool_id__in=fifo_pools), "pool_id", [j.pk for j in pending if j.pool_id in fifo_pools]
        )
        if fifo_pools
        else {}
    )

    fair_pools = [p for p in pool_ids if pools[p].strategy != "fifo"]
    sessions = defaultdict(list)
    if fair_pools:
        for row in (
            Session.objects.filter(pool_id__in=fair_pools, status=SessionStatus.ACTIVE)
            .annotate(pending=Count("jobs", filter=Q(jobs__status=JobStatus.PENDING)))
            .filter(pending__gt=0)
            .values("id", "pool_id", "vruntime", "slots", "created_at", "pending")
        ):
            sessions[row["pool_id"]].append(row)

    info = {}
    queues: dict[int, _FairQueue] = {}
    for job in pending:
        pool = pools[job.pool_id]
        online = devices.get(job.pool_id, [])
        if not pool.is_accessible:
            reason = NOT_ACCESSIBLE
        elif not online:
            reason = DEVICE_DOWN if job.pool_id in down_pools else NO_DEVICE
        elif all(d.running_jobs >= d.max_concurrent_jobs for d in online):
            reason = BUSY
        else:
            reason = TURN
        if pool.strategy == "fifo":
            position = in_pool.get(job.pk, 1)
        else:
            if job.pool_id not in queues:
                queues[job.pool_id] = _FairQueue(sessions[job.pool_id])
            position = queues[job.pool_id].position(job.session_id, in_session.get(job.pk, 1) - 1)
        info[job.pk] = (reason, position)
    return info


def _ranks(jobs, partition: str, job_ids) -> dict[int, int]:
    """``{job id: rank}`` by (created_at, id) among *all* pending ``jobs`` of each ``partition``.

    The row numbers must be computed over every pending job before picking the listed ones: a
    WHERE on the ids inside the same query would number only the listed jobs. Hence the derived
    table (the ORM applies non-window filters inside the windowed query). Callers keep the
    ranked set small: the listed jobs' sessions, or the FIFO pools only.
    """
    if not job_ids:
        return {}
    ranked = (
        jobs.filter(status=JobStatus.PENDING)
        .annotate(rank=Window(RowNumber(), partition_by=[F(partition)], order_by=[F("created_at"), F("id")]))
        .values_list("id", "rank")
    )
    sql, params = ranked.query.sql_with_params()
    placeholders = ", ".join(["%s"] * len(job_ids))
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT ranked.id, ranked.rank FROM ({sql}) ranked WHERE ranked.id IN ({placeholders})",  # noqa: S608
            [*params, *job_ids],
        )
        return dict(cursor.fetchall())


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
