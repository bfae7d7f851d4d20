"""Scheduling strategies (R-SCHED-1), chosen by the pool's ``strategy``.

Each strategy answers two questions under the pool's queue lock: which pending job goes next,
and what the session is charged, at dispatch (``weighted_fair``) or at completion
(``usage_fair``). ``fifo`` charges nothing.
"""

from django.db.models import Exists, F, Min, OuterRef, Q

from apps.scheduling.models import Job, JobStatus
from apps.sessions.models import Session, SessionStatus


def eligible_jobs(pool_id: int, free_device_ids: list[int], now):
    """Pending jobs of the pool that a free device may take now."""
    return Job.objects.filter(pool_id=pool_id, status=JobStatus.PENDING).filter(
        Q(target_device__isnull=True) | Q(target_device_id__in=free_device_ids),
        Q(not_before__isnull=True) | Q(not_before__lte=now),
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


def catch_up(session: Session) -> None:
    """R-SCHED-2: a session that becomes runnable starts at the smallest vruntime among the pool's
    other runnable sessions, so a new or returning session never takes a burst of turns.
    Called under the pool's queue lock, before its new job is inserted."""
    others = Exists(Job.objects.filter(session_id=OuterRef("pk"), status=JobStatus.PENDING))
    floor = (
        Session.objects.filter(pool_id=session.pool_id, status=SessionStatus.ACTIVE)
        .exclude(pk=session.pk)
        .filter(others)
        .aggregate(v=Min("vruntime"))["v"]
    )
    if floor is not None and session.vruntime < floor:
        Session.objects.filter(pk=session.pk).update(vruntime=floor)
        session.vruntime = floor
