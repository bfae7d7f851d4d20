"""django-q2 entry points of the core app, and helpers to enqueue, lease and beat."""

import logging
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from apps.core.models import Lease, WorkerHeartbeat

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


def cleanup() -> str:
    """Daily schedule: ``manage.py cleanup`` with the configured retention."""
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("cleanup", stdout=out)
    return out.getvalue()
