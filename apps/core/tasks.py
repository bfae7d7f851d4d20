"""django-q2 entry points of the core app (thin: the work lives in services)."""

import socket

from django.utils import timezone

from apps.core.models import WorkerHeartbeat


def heartbeat() -> str:
    """Record that a worker is alive; scheduled every minute (see the core data migration)."""
    name = socket.gethostname()
    WorkerHeartbeat.objects.update_or_create(name=name, defaults={"seen_at": timezone.now()})
    return name
