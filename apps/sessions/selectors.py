"""Read queries about sessions shared by several callers (STYLE.md: one selector per shared query)."""

from apps.resources.models import ResourcePool


def slots_usage(pool: ResourcePool) -> dict:
    """R-SESS-6: ``{"slots_total", "slots_used", "slots_available"}`` (total may be None), from
    the pool's usage counters (``apps.sessions.statements``): the slots endpoints, QRMI's
    ``qpu-slots``, the admin and the home gauges read the pool row they already have."""
    total, used = pool.slots_total, pool.slots_used
    return {
        "slots_total": total,
        "slots_used": used,
        "slots_available": None if total is None else max(total - used, 0),
    }
