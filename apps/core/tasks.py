"""django-q2 entry points of the core app, and helpers to enqueue and beat (leases: apps.core.leases)."""

import logging

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.core.models import WorkerHeartbeat

log = logging.getLogger(__name__)


def heartbeat() -> str:
    """Record that this worker is alive: its ticker process calls it every
    ``GRIDGATE_WORKER_HEARTBEAT_SECONDS`` (apps.core.ticker). The host also writes its marker
    under the cases root first, so ``manage.py doctor`` can tell whether every live host shares
    that root (a failed write is doctor's to report, not a crash)."""
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


def cleanup() -> str:
    """Daily schedule: ``manage.py cleanup`` with the configured retention."""
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("cleanup", stdout=out)
    return out.getvalue()
