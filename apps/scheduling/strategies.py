"""Scheduling strategies (R-SCHED-1), chosen by the pool's ``strategy``.

Each strategy answers three questions under the pool's queue lock: which pending job goes next,
what the session is charged, at dispatch (``weighted_fair``) or at completion (``usage_fair``;
``fifo`` charges nothing), and how the virtual times move once it is claimed (``served``).
``usage_fair`` has two levels, shares then sessions: ``apps.scheduling.shares``.
"""

from django.db.models import Exists, F, OuterRef, Q

from apps.scheduling import shares
from apps.scheduling.models import Job, JobStatus, PoolQueue
from apps.sessions.models import Session, SessionStatus


def in_backoff(now):
    """R-SCHED-3: a session whose queue is in back-off after a transient driver error. Its head
    job waits, and so do the jobs behind it: FIFO within a session survives the error
    (served by ``jobs_backoff_session``, which holds only jobs in back-off)."""
    return Exists(Job.objects.filter(session_id=OuterRef("session_id"), status=JobStatus.PENDING, not_before__gt=now))


def eligible_jobs(pool_id: int, free_device_ids: list[int], now, only: Q | None = None):
    """Pending jobs of the pool that a free device may take now (among ``only``, when the
    calendar restricts them: ``apps.scheduling.passes.next_on_calendar``). Not those of a session
    past its lifetime (R-SESS-3, R-SESS-7): it has ended, whether or not the expiry sweep has
    revoked it yet (which cancels them)."""
    jobs = (
        Job.objects.filter(pool_id=pool_id, status=JobStatus.PENDING, session__expires_at__gt=now)
        .filter(Q(target_device__isnull=True) | Q(target_device_id__in=free_device_ids))
        .exclude(in_backoff(now))
    )
    return jobs if only is None else jobs.filter(only)


class Strategy:
    name = ""
    charge_at_completion = False

    def next_job(self, pool, queue: PoolQueue, free_device_ids: list[int], now, only: Q | None = None) -> Job | None:
        raise NotImplementedError

    def served(self, pool, queue: PoolQueue, job: Job, vruntime: float, now) -> None:
        """R-SCHED-2: V = max(V, vruntime of the session served, before its charge)."""
        if vruntime > queue.vtime:
            queue.vtime = vruntime
            PoolQueue.objects.filter(pk=queue.pk).update(vtime=vruntime)

    def charge(self, job: Job, amount: float) -> None:
        Session.objects.filter(pk=job.session_id).update(vruntime=F("vruntime") + amount)

    def dispatch_charge(self, job: Job, slots: int) -> float:
        return 0.0

    def completion_charge(self, job: Job, slots: int) -> float:
        return 0.0


class Fifo(Strategy):
    """Jobs by (created_at, id) across the pool."""

    name = "fifo"

    def next_job(self, pool, queue, free_device_ids, now, only=None):
        return eligible_jobs(pool.pk, free_device_ids, now, only).order_by("created_at", "id").first()


class WeightedFair(Strategy):
    """The runnable session with the smallest vruntime (ties: older session, then id) gives its
    oldest pending job; each dispatch adds 1/slots to its vruntime. A five-slot session gets about
    five turns for every turn of a one-slot session."""

    name = "weighted_fair"

    def next_job(self, pool, queue, free_device_ids, now, only=None):
        pool_id = pool.pk
        # Exists, not a join + DISTINCT: one index probe per session, in vruntime order, stopping
        # at the first runnable one (sessions_active_vruntime + jobs_pending_session).
        runnable = Exists(eligible_jobs(pool_id, free_device_ids, now, only).filter(session_id=OuterRef("pk")))
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
            eligible_jobs(pool_id, free_device_ids, now, only)
            .filter(session_id=session_id)
            .order_by("created_at", "id")
            .first()
        )

    def dispatch_charge(self, job, slots):
        return 1.0 / slots


class UsageFair(Strategy):
    """R-SCHED-6, two levels: the user (or group) with the smallest decayed device time per
    unit of weight, then among its sessions the one with the smallest vruntime, whose charge is
    the job's measured device time / slots at the end (``apps.scheduling.shares``)."""

    name = "usage_fair"
    charge_at_completion = True

    def next_job(self, pool, queue, free_device_ids, now, only=None):
        eligible = eligible_jobs(pool.pk, free_device_ids, now, only)
        choice = shares.choose(pool, queue, shares.runnable_sessions(pool.pk, eligible), now.timestamp())
        if choice is None:
            return None
        job = eligible.filter(session_id=choice.session_id).order_by("created_at", "id").first()
        if job is not None:
            job._share_choice = choice
        return job

    def served(self, pool, queue, job, vruntime, now):
        shares.served(pool, queue, job._share_choice, vruntime, now.timestamp())

    def completion_charge(self, job, slots):
        return (job.runtime_seconds or 0.0) / slots


STRATEGIES = {cls.name: cls() for cls in (Fifo, WeightedFair, UsageFair)}


def strategy_for(name: str) -> Strategy:
    return STRATEGIES[name]
