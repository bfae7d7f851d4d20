"""django-q2 entry points for case passes (thin: the work lives in ``apps.cases.passes``).

Cadence design (docs/operations.md, "Case passes"): django-q2 schedules fire at most once a
minute, so

- events enqueue work at once: a launch enqueues a poll of that case (``enqueue_poll``), which
  starts within the broker's poll interval;
- the ``gridgate.cases.ticker`` schedule (every minute) runs :func:`case_ticker`, a bounded loop
  (~50 s) that runs the submit, poll and sync passes every few seconds. A lease row
  (``PassLease``) lets one loop run across all clusters; the passes themselves are safe to run
  anywhere at any time (claims with leases), so a duplicate loop costs efficiency, not safety.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from apps.cases import passes
from apps.cases.models import PassLease

logger = logging.getLogger(__name__)

TICKER_LEASE = "cases.ticker"


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


def acquire_lease(name: str, owner: str, seconds: int) -> bool:
    """Take or renew the named lease; False when another live owner holds it."""
    now = timezone.now()
    try:
        with transaction.atomic():
            PassLease.objects.get_or_create(name=name)
    except IntegrityError:
        pass  # created concurrently by another cluster
    taken = (
        PassLease.objects.filter(name=name)
        .filter(Q(until__isnull=True) | Q(until__lt=now) | Q(owner=owner))
        .update(owner=owner, until=now + timedelta(seconds=seconds))
    )
    return taken == 1


def release_lease(name: str, owner: str) -> None:
    PassLease.objects.filter(name=name, owner=owner).update(owner="", until=None)


def case_ticker(duration: float | None = None, interval: float | None = None) -> str:
    """Scheduled every minute: run the passes every ``interval`` seconds for ``duration`` seconds.

    Bounded (well under django-q2's timeout) and idempotent: if a run is killed its lease expires
    and the next minute's run takes over.
    """
    duration = settings.GRIDGATE_CASE_TICKER_SECONDS if duration is None else duration
    interval = settings.GRIDGATE_CASE_TICK_INTERVAL if interval is None else interval
    owner = passes.worker_id()
    if not acquire_lease(TICKER_LEASE, owner, int(duration + 3 * interval + 10)):
        return "another cluster runs the case ticker"
    deadline = time.monotonic() + duration
    ticks = 0
    try:
        while True:
            for run in (passes.submit_pass, passes.poll_pass, passes.sync_pass):
                try:
                    run()
                except Exception:  # one failing pass must not stop the others or the loop
                    logger.exception("case pass %s failed", run.__name__)
            ticks += 1
            if time.monotonic() + interval >= deadline:
                break
            time.sleep(interval)
            if not acquire_lease(TICKER_LEASE, owner, int(duration + 3 * interval + 10)):
                break  # our lease was taken over (we stalled past it): let the new owner run
    finally:
        release_lease(TICKER_LEASE, owner)
    return f"{ticks} ticks"
