"""Read queries of the user pages that no other caller needs (the rest come from the domain apps)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

from django.conf import settings

from apps.resources.models import ResourcePool, fmt, usage_of

EXAMPLES_DIR = Path(settings.BASE_DIR) / "examples"


@dataclass
class Meter:
    """One gauge line: ``used`` of ``total`` (total None: unlimited)."""

    label: str
    used: Decimal | int
    total: Decimal | int | None

    @property
    def percent(self) -> int | None:
        if not self.total:
            return None
        return min(100, round(100 * Decimal(self.used) / Decimal(self.total)))

    @property
    def text(self) -> str:
        if self.total is None:
            return f"{fmt(self.used)} used (unlimited)"
        return f"{fmt(self.used)} of {fmt(self.total)}"


@dataclass
class PoolGauge:
    slots: Meter
    quota: list[Meter] = field(default_factory=list)


def pool_gauges(pools: list[ResourcePool]) -> dict[int, PoolGauge]:
    """Slots used/total and quota used per pool: the pools' usage rows (read with them), which
    admission (R-SESS-1) and the slots endpoints (R-SESS-6) read too."""
    gauges = {}
    for pool in pools:
        usage = usage_of(pool)
        gauge = PoolGauge(slots=Meter("slots", usage.slots_used, pool.slots_total))
        if pool.has_quota:
            gauge.quota = [
                Meter("CPU", usage.cpu_used, pool.quota_cpu),
                Meter("memory (GB)", usage.memory_used, pool.quota_memory),
                Meter("GPU", usage.gpu_used, pool.quota_gpu or 0),
            ]
        gauges[pool.pk] = gauge
    return gauges


def bundled_examples() -> dict[str, dict]:
    """The Pulser examples shipped in ``examples/`` (name → parsed file)."""
    out = {}
    for path in sorted(EXAMPLES_DIR.glob("*.json")):
        try:
            out[path.stem] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return out


@dataclass
class PoolUse:
    """What a pool takes, in the words of the home page."""

    takes_jobs: bool
    devices: int
    devices_online: int
    takes_cases: bool
    cases_ready: bool
    cases_message: str
    usable: bool = True  # would accept this user's work now: listed first

    @property
    def tag(self) -> str:
        return "QPU" if self.takes_jobs else ""


def pool_uses(pools: list[ResourcePool], user) -> dict[int, PoolUse]:
    """Jobs and/or cases per pool, for ``user``, in a constant number of queries whatever the
    number of pools.

    A pool with devices takes jobs (its classes are access to a QPU or its emulator); a pool without
    devices whose kind has a case backend takes cases, when that backend is set up on this host and
    would run this user's cases (``apps.backends.readiness.user_readiness``: no provider call).
    """
    from django.db.models import Count, Q

    from apps.backends.readiness import user_readiness
    from apps.scheduling.models import Device

    rows = (
        Device.objects.filter(pool_id__in=[pool.pk for pool in pools])
        .order_by()
        .values("pool_id")
        .annotate(total=Count("id"), online=Count("id", filter=Q(online=True)))
    )
    counts = {row["pool_id"]: row for row in rows}
    readiness = user_readiness(user, pools)
    out = {}
    for pool in pools:
        row = counts.get(pool.pk, {})
        devices = row.get("total", 0)
        usability = readiness[pool.pk]
        if devices:
            out[pool.pk] = PoolUse(True, devices, row.get("online", 0), False, False, "", usability.usable)
            continue
        out[pool.pk] = PoolUse(
            False, 0, 0, usability.runs == "cases", usability.usable, usability.reason, usability.usable
        )
    return out


def case_classes(user):
    """Classes the case form offers: visible, of pools without devices that would run this user's
    cases (the backend is set up here, the user's account or credential is there)."""
    from apps.backends.readiness import user_readiness
    from apps.resources.selectors import visible_classes

    classes = visible_classes(user).filter(pool__devices__isnull=True)
    pools = ResourcePool.objects.filter(pk__in=classes.values("pool_id"))
    readiness = user_readiness(user, pools)
    ready = [pk for pk, usability in readiness.items() if usability.usable and usability.runs == "cases"]
    return classes.filter(pool_id__in=ready).order_by("pool__name", "name", "id")
