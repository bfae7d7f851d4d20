"""django-q2 entry points for case passes (thin: the work lives in ``apps.cases.passes``).

The route from schedule to work is one way: ``tasks`` → ``passes`` → backends; ``passes`` never
imports ``services``. Cadence design (docs/operations.md, "Case passes"): django-q2 schedules
fire at most once a minute, so

- events enqueue work at once through the one enqueue helper (``apps.core.tasks.enqueue``, sent
  once the transaction commits), called by name from ``passes`` so that ``passes`` needs no
  import of this module: a launch enqueues the submit step of that case
  (``passes.enqueue_submit``), a submission its first poll (``passes.enqueue_poll``);
- the shared tick loop (``apps.core.ticker``: each worker's ticker process, one holder per site
  through a lease) runs
  :func:`run_passes` every ``GRIDGATE_CASE_TICK_INTERVAL`` seconds: the safety net for a lost
  broker message, a dead worker's leases, and submissions waiting out a back-off. The passes are
  safe to run anywhere at any time (claims with leases).
"""

from __future__ import annotations

import logging

from apps.cases import passes

logger = logging.getLogger(__name__)


def submit_cases(case_ids) -> str:
    """Event-triggered by a launch: submit these cases now (if no other worker holds them)."""
    return str(passes.submit_pass(case_ids=case_ids))


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


def run_passes(*, host_only: bool = False) -> str:
    """The case passes, registered with the shared tick loop (``apps.core.ticker``) and run
    every ``GRIDGATE_CASE_TICK_INTERVAL`` seconds: submit (recovery), orphan cancel (launches
    cancelled from another host), poll, sync. The shared loop skips cases pinned to other hosts;
    ``host_only``: only those pinned to this one."""
    outcomes = []
    for run in (passes.submit_pass, passes.orphan_cancel_pass, passes.poll_pass, passes.sync_pass):
        try:
            outcomes.append(str(run(host_only=host_only)))
        except Exception:  # one failing pass must not stop the others
            logger.exception("case pass %s failed", run.__name__)
    return "; ".join(outcomes)


def run_host_passes() -> str:
    """The passes over the cases pinned to this worker host (local processes), run by every host's
    ticker (``per_host=True`` in ``apps.core.ticker``) whichever host holds the shared loop."""
    return run_passes(host_only=True)
