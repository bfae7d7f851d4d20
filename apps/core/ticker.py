"""One sub-minute loop for all periodic passes (SPEC §8).

django-q2 schedules fire at most once a minute. The ``gridgate.tick`` schedule (every minute)
runs :func:`tick`: a ~55 s loop, held by one cluster at a time through a lease, that calls every
registered pass when its period has elapsed. Apps register their passes in ``AppConfig.ready``.
One loop for everything keeps a single worker busy with ticking, whatever the number of apps;
the passes themselves are safe to run anywhere at any time (their own claims and leases), so
the lease only avoids wasted work.
"""

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from apps.core.tasks import run_ticker

log = logging.getLogger(__name__)

TICK_LEASE = "gridgate.tick"
LOOP_SECONDS = 55


@dataclass
class Periodic:
    name: str
    func: Callable[[], object]
    every: Callable[[], float]  # seconds, read at each step so settings overrides apply


_REGISTRY: dict[str, Periodic] = {}


def register(name: str, func: Callable[[], object], every: Callable[[], float]) -> None:
    _REGISTRY[name] = Periodic(name, func, every)


def registered() -> dict[str, Periodic]:
    return dict(_REGISTRY)


def tick(duration: float = LOOP_SECONDS) -> str:
    """The minutely task: run each registered pass every ``every()`` seconds for ``duration``."""
    if not _REGISTRY:
        return "nothing registered"
    last_run: dict[str, float] = {}
    counts = dict.fromkeys(_REGISTRY, 0)

    def step():
        now = time.monotonic()
        for periodic in _REGISTRY.values():
            if now - last_run.get(periodic.name, -1e18) < periodic.every():
                continue
            last_run[periodic.name] = now
            try:
                periodic.func()
                counts[periodic.name] += 1
            except Exception:  # one failing pass must not stop the others or the loop
                log.exception("periodic pass %s failed", periodic.name)

    interval = min(p.every() for p in _REGISTRY.values())
    steps = run_ticker(TICK_LEASE, step, interval=interval, duration=duration)
    if not steps:
        return "another cluster runs the tick loop"
    return ", ".join(f"{name}: {n}" for name, n in counts.items())
