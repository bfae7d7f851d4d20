"""django-q2 entry points of the core app, and helpers to enqueue and tick."""

import logging
import os
import time
import uuid
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from apps.core.models import Lease, WorkerHeartbeat

log = logging.getLogger(__name__)


def heartbeat() -> str:
    """Record that this worker host is alive: scheduled every minute (see the core data
    migration) and run by each host's own loop (``apps.core.ticker.host_loop``). The host also
    writes its marker under the cases root first, so ``manage.py doctor`` can tell whether every
    live host shares that root (issue 17; a failed write is doctor's to report, not a crash)."""
    from apps.core import hosts

    name = settings.GRIDGATE_WORKER_HOST
    now = timezone.now()
    try:
        hosts.write_marker(name, now)
    except OSError as exc:
        log.warning("heartbeat: cannot write the host marker under the cases root: %s", exc)
    WorkerHeartbeat.objects.update_or_create(name=name, defaults={"seen_at": now})
    return name


def enqueue(func: str, *args, **kwargs) -> None:
    """Run ``func`` in a worker once the current transaction commits (never before: the worker
    must see the rows that caused the event). ``GRIDGATE_TASKS_EAGER`` runs it inline (tests)."""

    def send():
        if settings.GRIDGATE_TASKS_EAGER:
            module, name = func.rsplit(".", 1)
            getattr(__import__(module, fromlist=[name]), name)(*args, **kwargs)
            return
        try:
            from django_q.tasks import async_task

            async_task(func, *args, **kwargs)
        except Exception:  # the tick loop is the safety net: a broker hiccup only delays the work
            log.warning("could not enqueue %s%r; the tick loop will take it", func, args, exc_info=True)

    transaction.on_commit(send)


def acquire_lease(name: str, owner: str, ttl: timedelta) -> bool:
    """Take or renew the lease ``name`` for ``owner``; False while someone else holds it."""
    now = timezone.now()
    renewed = Lease.objects.filter(Q(owner=owner) | Q(expires_at__lt=now), name=name).update(
        owner=owner, expires_at=now + ttl
    )
    if renewed:
        return True
    try:
        with transaction.atomic():
            Lease.objects.create(name=name, owner=owner, expires_at=now + ttl)
        return True
    except IntegrityError:
        return False


def release_lease(name: str, owner: str) -> None:
    Lease.objects.filter(name=name, owner=owner).delete()


def run_ticker(name: str, step: Callable[[], object], *, interval: float, duration: float) -> int:
    """Call ``step`` every ``interval`` seconds for ``duration`` seconds, once across clusters.

    django-q2 schedules fire at most once a minute; a minutely task running this loop gives the
    sub-minute cadence (SPEC §8). The lease makes a second loop started meanwhile (another
    cluster, an overlapping minute) return at once; a killed loop's lease expires after
    ``interval * 3 + 10`` seconds and the next minute's task takes over. Returns the step count.
    """
    owner = f"{settings.GRIDGATE_WORKER_HOST}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    ttl = timedelta(seconds=interval * 3 + 10)
    steps = 0
    deadline = time.monotonic() + duration
    if not acquire_lease(name, owner, ttl):
        return 0
    try:
        # At least one step once the lease is held, whatever the time the lease took to get (a
        # short ``duration`` used to run none on a slow database); no sleep past the deadline.
        while True:
            started = time.monotonic()
            try:
                step()
            except Exception:  # one bad step must not end the loop: log and go on
                log.exception("ticker %s: step failed", name)
            steps += 1
            if time.monotonic() >= deadline:
                break
            if not acquire_lease(name, owner, ttl):
                break  # lost the lease (we stalled past its expiry): another loop runs now
            time.sleep(max(0.0, min(interval - (time.monotonic() - started), deadline - time.monotonic())))
    finally:
        release_lease(name, owner)
    return steps


def cleanup() -> str:
    """Daily schedule: ``manage.py cleanup`` with the configured retention."""
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("cleanup", stdout=out)
    return out.getvalue()


def tick() -> str:
    """Minutely schedule ``gridgate.tick``: the shared sub-minute loop (apps.core.ticker)."""
    from apps.core import ticker

    return ticker.tick()
