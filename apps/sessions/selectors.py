"""Read queries about sessions shared by several callers (STYLE.md: one selector per shared query)."""

from apps.resources.models import ResourcePool, usage_of


def slots_usage(pool: ResourcePool) -> dict:
    """R-SESS-6: ``{"slots_total", "slots_used", "slots_available"}`` (total may be None), from
    the pool's usage row (``apps.sessions.statements``): the slots endpoints, QRMI's
    ``qpu-slots``, the admin and the home gauges read it with the pool (``select_related``)."""
    total, used = pool.slots_total, usage_of(pool).slots_used
    return {
        "slots_total": total,
        "slots_used": used,
        "slots_available": None if total is None else max(total - used, 0),
    }
