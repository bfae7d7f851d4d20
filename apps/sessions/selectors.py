"""Read queries about sessions shared by several callers (STYLE.md: one selector per shared query)."""

from dataclasses import dataclass

from django.db.models import Sum
from django.db.models.functions import Coalesce
from django.http import Http404

from apps.sessions.models import Session, is_service_principal


@dataclass(frozen=True)
class Usage:
    """What a pool's active sessions hold: slots, and their classes' resources (quota pools)."""

    slots: int = 0
    cpu: float = 0
    memory: float = 0
    gpu: float = 0


def active_usage(pool_ids) -> dict[int, Usage]:
    """R-SESS-1/R-SESS-6: slots and class resources held by the active sessions of each pool.

    The one definition of "a pool's usage": admission sums it under the pool lock, the slots
    endpoints, the admin and the home gauges read it. One query whatever the number of pools
    (served by the ``sessions_active_pool`` partial index); a pool without active sessions maps
    to ``Usage()``.
    """
    pool_ids = list(pool_ids)
    rows = (
        Session.objects.active()
        .filter(pool_id__in=pool_ids)
        .order_by()
        .values("pool_id")
        .annotate(
            slots=Coalesce(Sum("slots"), 0),
            # A group has at least one session, and class resources are NOT NULL: never null.
            cpu=Sum("resource_class__cpu"),
            memory=Sum("resource_class__memory"),
            gpu=Sum("resource_class__gpu"),
        )
        .values_list("pool_id", "slots", "cpu", "memory", "gpu")
    )
    usage = dict.fromkeys(pool_ids, Usage())
    for pool_id, slots, cpu, memory, gpu in rows:
        usage[pool_id] = Usage(slots=slots, cpu=cpu, memory=memory, gpu=gpu)
    return usage


def slots_usage(pool) -> dict:
    """R-SESS-6: ``{"slots_total", "slots_used", "slots_available"}`` (total may be None)."""
    used = active_usage([pool.pk])[pool.pk].slots
    total = pool.slots_total
    return {
        "slots_total": total,
        "slots_used": used,
        "slots_available": None if total is None else max(total - used, 0),
    }


def visible_or_404(queryset, user, pk) -> Session:
    """One session of ``queryset`` by id, or 404 unless ``user`` may see it (the rule of
    ``SessionQuerySet.visible_to``: the owner, staff and service principals).

    Owner first: the common path (the owner submitting a job) costs the session's own query only;
    the permission lookup (two queries on a fresh user) is asked only about someone else's session
    (issue 15: a REST submission in four statements, token lookup included)."""
    session = queryset.filter(pk=pk).first()
    if session is None or (session.user_id != user.pk and not is_service_principal(user)):
        raise Http404("No such session.")
    return session
