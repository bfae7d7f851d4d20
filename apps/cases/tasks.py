"""django-q2 entry points for case passes (thin: the work lives in ``apps.cases.passes``).

Cadence design (docs/operations.md, "Case passes"): django-q2 schedules fire at most once a
minute, so

- events enqueue work at once: a launch enqueues a poll of that case (``enqueue_poll``), which
  starts within the broker's poll interval;
- the shared ``gridgate.tick`` loop (``apps.core.ticker``, one per site through a lease) runs
  :func:`run_passes` every ``GRIDGATE_CASE_TICK_INTERVAL`` seconds; the passes themselves are
  safe to run anywhere at any time (claims with leases).
"""

from __future__ import annotations

import logging

from django.db import transaction

from apps.cases import passes

logger = logging.getLogger(__name__)


def _enqueue(func: str, case_ids, what: str) -> None:
    ids = [str(case_id) for case_id in case_ids]

    def send():
        try:
            from django_q.tasks import async_task

            async_task(f"apps.cases.tasks.{func}", ids, task_name=f"gridgate.cases.{func}")
        except Exception:  # the ticker is the safety net: a broker hiccup only delays the poll
            logger.warning("could not enqueue the %s of %s; the ticker will take them", what, ids, exc_info=True)

    transaction.on_commit(send)


def enqueue_poll(case_ids) -> None:
    """Poll these cases soon, in a worker (never in the request: R-CASE-2)."""
    _enqueue("poll_cases", case_ids, "poll")


def enqueue_refresh(case_ids) -> None:
    """A user asked to refresh these cases: poll and sync them soon, in a worker (R-CASE-2)."""
    _enqueue("refresh_cases", case_ids, "refresh")


def poll_cases(case_ids) -> str:
    """Event-triggered: poll these cases now (if no other worker holds them)."""
    return str(passes.poll_pass(case_ids=case_ids))


def refresh_cases(case_ids) -> str:
    """Event-triggered by a user's refresh: poll, then sync, these cases now."""
    return f"{passes.poll_pass(case_ids=case_ids)}; {passes.sync_pass(case_ids=case_ids)}"


def poll_pass() -> str:
    return str(passes.poll_pass())


def sync_pass() -> str:
    return str(passes.sync_pass())


def submit_pass() -> str:
    return str(passes.submit_pass())


def run_passes() -> str:
    """The case passes, registered with the shared tick loop (``apps.core.ticker``) and run
    every ``GRIDGATE_CASE_TICK_INTERVAL`` seconds: submit (recovery), poll, sync."""
    outcomes = []
    for run in (passes.submit_pass, passes.poll_pass, passes.sync_pass):
        try:
            outcomes.append(str(run()))
        except Exception:  # one failing pass must not stop the others
            logger.exception("case pass %s failed", run.__name__)
    return "; ".join(outcomes)
