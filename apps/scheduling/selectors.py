"""Read-side helpers: device load and why a job waits (R-JOB-4)."""

import math
from collections import defaultdict

from django.db import connection
from django.db.models import Count, F, Q, Window
from django.db.models.functions import RowNumber

from apps.scheduling.models import Device, Job, JobStatus
from apps.sessions.models import Session, SessionStatus

NO_DEVICE = "no device online"
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

    ranks = _ranks(pool_ids, [j.pk for j in pending])

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
    for job in pending:
        pool = pools[job.pool_id]
        online = devices.get(job.pool_id, [])
        if not pool.is_accessible:
            reason = NOT_ACCESSIBLE
        elif not online:
            reason = NO_DEVICE
        elif all(d.running_jobs >= d.max_concurrent_jobs for d in online):
            reason = BUSY
        else:
            reason = TURN
        in_session, in_pool = ranks.get(job.pk, (1, 1))
        if pool.strategy == "fifo":
            position = in_pool
        else:
            position = _fair_position(job, in_session - 1, sessions[job.pool_id])
        info[job.pk] = (reason, position)
    return info


def _ranks(pool_ids, job_ids) -> dict[int, tuple[int, int]]:
    """``{job id: (rank in its session, rank in its pool)}`` among *all* pending jobs of the pools.

    The row numbers must be computed over every pending job before picking the listed ones: a
    WHERE on the ids inside the same query would number only the listed jobs. Hence the derived
    table (the ORM applies non-window filters inside the windowed query).
    """
    ranked = (
        Job.objects.filter(pool_id__in=pool_ids, status=JobStatus.PENDING)
        .annotate(
            in_session=Window(RowNumber(), partition_by=[F("session_id")], order_by=[F("created_at"), F("id")]),
            in_pool=Window(RowNumber(), partition_by=[F("pool_id")], order_by=[F("created_at"), F("id")]),
        )
        .values_list("id", "in_session", "in_pool")
    )
    sql, params = ranked.query.sql_with_params()
    placeholders = ", ".join(["%s"] * len(job_ids))
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT ranked.id, ranked.in_session, ranked.in_pool FROM ({sql}) ranked "  # noqa: S608 - placeholders only
            f"WHERE ranked.id IN ({placeholders})",
            [*params, *job_ids],
        )
        return {job_id: (in_session, in_pool) for job_id, in_session, in_pool in cursor.fetchall()}


def _fair_position(job, index: int, sessions: list[dict]) -> int:
    own = next((s for s in sessions if s["id"] == job.session_id), None)
    if own is None:
        return 1
    tag = own["vruntime"] + index / own["slots"]
    own_key = (own["created_at"], own["id"])
    ahead = 0
    for other in sessions:
        if other["id"] == own["id"]:
            ahead += index
            continue
        # Jobs of `other` reached before ours: tags below ours, or equal with an older session.
        span = (tag - other["vruntime"]) * other["slots"]
        before = math.ceil(span) if (other["created_at"], other["id"]) > own_key else math.floor(span) + 1
        ahead += max(0, min(other["pending"], before))
    return ahead + 1
