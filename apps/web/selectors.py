"""Read queries of the user pages that no other caller needs (the rest come from the domain apps)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

from django.conf import settings

from apps.resources.models import ResourcePool, fmt
from apps.sessions.selectors import active_usage

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
    """Slots used/total and quota used per pool, in one query whatever the number of pools.

    The same sums as admission (R-SESS-1) and the slots endpoints (R-SESS-6): ``active_usage``.
    """
    used = active_usage(pool.pk for pool in pools)
    gauges = {}
    for pool in pools:
        usage = used[pool.pk]
        gauge = PoolGauge(slots=Meter("slots", usage.slots, pool.slots_total))
        if pool.has_quota:
            gauge.quota = [
                Meter("CPU", usage.cpu, pool.quota_cpu),
                Meter("memory (GB)", usage.memory, pool.quota_memory),
                Meter("GPU", usage.gpu, pool.quota_gpu or 0),
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
