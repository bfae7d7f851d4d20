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


def enqueue_poll(case_ids) -> None:
    """Poll these cases soon, in a worker (never in the request: R-CASE-2)."""
    ids = [str(case_id) for case_id in case_ids]

    def send():
        try:
            from django_q.tasks import async_task

            async_task("apps.cases.tasks.poll_cases", ids, task_name="gridgate.cases.poll_cases")
        except Exception:  # the ticker is the safety net: a broker hiccup only delays the poll
            logger.warning("could not enqueue the poll of %s; the ticker will poll them", ids, exc_info=True)

    transaction.on_commit(send)


def poll_cases(case_ids) -> str:
    """Event-triggered: poll these cases now (if no other worker holds them)."""
    return str(passes.poll_pass(case_ids=case_ids))


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
