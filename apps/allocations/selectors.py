"""Read queries about allocations, shared by admission, dispatch, the API, the pages and /metrics."""

from django.contrib.auth import get_user_model
from django.db.models import Exists, OuterRef, Q

from apps.allocations.models import INFINITY, Allocation


def visible_to(user):
    """Staff see every allocation; others those of their own projects (theirs and their groups')."""
    allocations = Allocation.objects.select_related("pool", "user", "group")
    if user.is_staff:
        return allocations
    return allocations.filter(of_user(user.pk))


def of_user(user_id) -> Q:
    """The allocations a user spends from: granted to them, or to one of their groups."""
    groups = get_user_model().groups.through.objects.filter(user_id=user_id).values("group_id")
    return Q(user_id=user_id) | Q(group_id__in=groups)


def preferred(allocations, now):
    """The default among a user's allocations on one pool: one in its period first, then the
    user's own before a group's, then the oldest. None when there is none."""
    ranked = sorted(allocations, key=lambda a: (a.period_at(now) is None, a.user_id is None, a.pk))
    return ranked[0] if ranked else None


def default_for(user_id, pool_id, now) -> Allocation | None:
    """The allocation a session of ``user_id`` on the pool spends unless it names one."""
    return preferred(Allocation.objects.filter(of_user(user_id), pool_id=pool_id), now)


def pool_has_allocations():
    """An ``Exists`` to annotate pools with: whether any allocation is defined on it (else the
    pool is unlimited and the dispatcher reads nothing more)."""
    return Exists(Allocation.objects.filter(pool_id=OuterRef("pk")))


def exhausted_ids(pool_id: int, now) -> set[int]:
    """R-ALLOC-1: the allocations of the pool with no device time left now (their jobs wait with
    ``allocation_exhausted``). One query over the pool's allocations (a handful of rows)."""
    return {
        allocation.pk
        for allocation in Allocation.objects.filter(pool_id=pool_id, device_seconds__isnull=False)
        if allocation.remaining_at(now)[0] <= 0
    }


def remaining(allocation: Allocation | None, now) -> dict | None:
    """What a session, a submission or a page shows of its allocation (None: unlimited)."""
    if allocation is None:
        return None
    device, cores = allocation.remaining_at(now)
    period = allocation.period_at(now)
    return {
        "allocation": allocation.pk,
        "name": allocation.name,
        "device_seconds": None if device == INFINITY else round(device, 3),
        "core_hours": None if cores == INFINITY else round(cores, 6),
        "period_end": period[1] if period else None,
    }


def remaining_by_id(ids, now) -> dict:
    """``remaining`` of each allocation in ``ids`` in one query (none when ``ids`` is empty)."""
    ids = {pk for pk in ids if pk is not None}
    if not ids:
        return {}
    return {a.pk: remaining(a, now) for a in Allocation.objects.filter(pk__in=ids)}


def summary(allocation: Allocation, now) -> str:
    """'1.2 h of 5 h left this period' (device time), or core-hours, for the pages."""
    device, cores = allocation.remaining_at(now)
    parts = []
    if allocation.device_seconds is not None:
        parts.append(f"{_hours(max(device, 0.0))} of {_hours(allocation.device_seconds)} device time")
    if allocation.core_hours is not None:
        parts.append(f"{max(cores, 0.0):.1f} of {allocation.core_hours:g} core-h")
    return " and ".join(parts) + " left this period"


def _hours(seconds: float) -> str:
    if seconds < 3600:
        return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"
    return f"{seconds / 3600:.1f} h"


def defaults_on(user, pool_ids, now) -> dict:
    """The pools page: ``user``'s default allocation on each of ``pool_ids`` with its summary
    ('1.2 h of 5 h device time left this period'), in one query."""
    mine: dict[int, list] = {}
    for allocation in Allocation.objects.filter(of_user(user.pk), pool_id__in=list(pool_ids)):
        mine.setdefault(allocation.pool_id, []).append(allocation)
    out = {}
    for pool_id, allocations in mine.items():
        chosen = preferred(allocations, now)
        out[pool_id] = {"allocation": chosen, "summary": summary(chosen, now)}
    return out
