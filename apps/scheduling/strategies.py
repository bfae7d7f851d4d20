"""Scheduling strategies (R-SCHED-1), chosen by the pool's ``strategy``.

Each strategy answers two questions under the pool's queue lock: which pending job goes next,
and what the session is charged, at dispatch (``weighted_fair``) or at completion
(``usage_fair``). ``fifo`` charges nothing.
"""

from django.db import connection
from django.db.models import Exists, F, OuterRef, Q

from apps.scheduling.models import Job, JobStatus, PoolQueue
from apps.sessions.models import Session, SessionStatus


def in_backoff(now):
    """R-SCHED-3: a session whose queue is in back-off after a transient driver error. Its head
    job waits, and so do the jobs behind it: FIFO within a session survives the error
    (served by ``jobs_backoff_session``, which holds only jobs in back-off)."""
    return Exists(Job.objects.filter(session_id=OuterRef("session_id"), status=JobStatus.PENDING, not_before__gt=now))


def eligible_jobs(pool_id: int, free_device_ids: list[int], now):
    """Pending jobs of the pool that a free device may take now."""
    return (
        Job.objects.filter(pool_id=pool_id, status=JobStatus.PENDING)
        .filter(Q(target_device__isnull=True) | Q(target_device_id__in=free_device_ids))
        .exclude(in_backoff(now))
    )


class Strategy:
    name = ""
    charge_at_completion = False

    def next_job(self, pool_id: int, free_device_ids: list[int], now) -> Job | None:
        raise NotImplementedError

    def charge(self, job: Job, amount: float) -> None:
        Session.objects.filter(pk=job.session_id).update(vruntime=F("vruntime") + amount)

    def dispatch_charge(self, job: Job, slots: int) -> float:
        return 0.0

    def completion_charge(self, job: Job, slots: int) -> float:
        return 0.0


class Fifo(Strategy):
    """Jobs by (created_at, id) across the pool."""

    name = "fifo"

    def next_job(self, pool_id, free_device_ids, now):
        return eligible_jobs(pool_id, free_device_ids, now).order_by("created_at", "id").first()


class WeightedFair(Strategy):
    """The runnable session with the smallest vruntime (ties: older session, then id) gives its
    oldest pending job; each dispatch adds 1/slots to its vruntime. A five-slot session gets about
    five turns for every turn of a one-slot session."""

    name = "weighted_fair"

    def next_job(self, pool_id, free_device_ids, now):
        # Exists, not a join + DISTINCT: one index probe per session, in vruntime order, stopping
        # at the first runnable one (sessions_active_vruntime + jobs_pending_session).
        runnable = Exists(eligible_jobs(pool_id, free_device_ids, now).filter(session_id=OuterRef("pk")))
        session_id = (
            Session.objects.filter(pool_id=pool_id, status=SessionStatus.ACTIVE)
            .filter(runnable)
            .order_by("vruntime", "created_at", "id")
            .values_list("id", flat=True)
            .first()
        )
        if session_id is None:
            return None
        return (
            eligible_jobs(pool_id, free_device_ids, now)
            .filter(session_id=session_id)
            .order_by("created_at", "id")
            .first()
        )

    def dispatch_charge(self, job, slots):
        return 1.0 / slots


class UsageFair(WeightedFair):
    """Like weighted_fair, but the charge is the job's measured device time / slots, at the end:
    weighting by QPU time rather than job count."""

    name = "usage_fair"
    charge_at_completion = True

    def dispatch_charge(self, job, slots):
        return 0.0

    def completion_charge(self, job, slots):
        return (job.runtime_seconds or 0.0) / slots


STRATEGIES = {cls.name: cls() for cls in (Fifo, WeightedFair, UsageFair)}


def strategy_for(name: str) -> Strategy:
    return STRATEGIES[name]


def caught_up_vruntime_sql(session: str) -> str:
    """R-SCHED-2, as the SQL value of ``vruntime`` in the session UPDATE of a submission (the
    session's table is named ``session`` there): a session that becomes runnable (no pending
    job before this one) starts at max(its vruntime, the pool's virtual time V); a session that
    already had work pending keeps its vruntime::

        CASE WHEN the session has a pending job THEN vruntime
             ELSE max(vruntime, the pool queue's vtime, or 0) END

    V is read without locking the pool's queue row: a dispatch committing meanwhile only moves
    V by the vruntime of a session it served, which the next arrival then sees. Written by hand
    with the submission statement it belongs to.
    """
    greatest = "GREATEST" if connection.vendor == "postgresql" else "MAX"  # SQLite's scalar max()
    return (
        f"CASE WHEN EXISTS (SELECT 1 FROM {Job._meta.db_table} j"  # noqa: S608 (names from _meta)
        f" WHERE j.session_id = {session}.id AND j.status = '{JobStatus.PENDING}')"
        f" THEN {session}.vruntime"
        f" ELSE {greatest}({session}.vruntime, COALESCE((SELECT q.vtime FROM {PoolQueue._meta.db_table} q"
        f" WHERE q.pool_id = {session}.pool_id), 0)) END"
    )
