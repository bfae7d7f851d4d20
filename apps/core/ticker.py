"""One sub-minute loop for all periodic passes (SPEC §8).

django-q2 schedules fire at most once a minute. The ``gridgate.tick`` schedule (every minute)
runs :func:`tick`: a ~55 s loop, held by one cluster at a time through a lease, that calls every
registered pass when its period has elapsed. Apps register their passes in ``AppConfig.ready``.
One loop for everything keeps a single worker busy with ticking, whatever the number of apps;
the passes themselves are safe to run anywhere at any time (their own claims and leases), so
the lease only avoids wasted work.

Some work can only be done on one host (issue 17): a local case's process is seen in its own
host's /proc only. Passes registered ``per_host=True`` do not run in the shared loop but in
:func:`host_loop`, which ``manage.py worker`` runs on every worker host under a lease of its own
host (``gridgate.tick@<host>``), whichever host holds the shared loop.
"""

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings
from django.db import close_old_connections

from apps.core.tasks import run_ticker

log = logging.getLogger(__name__)

TICK_LEASE = "gridgate.tick"
LOOP_SECONDS = 55
NOTHING = "nothing registered"
TAKEN = "another cluster runs the tick loop"


@dataclass
class Periodic:
    name: str
    func: Callable[[], object]
    every: Callable[[], float]  # seconds, read at each step so settings overrides apply
    per_host: bool = False  # run by every worker host's host_loop, not the shared loop


_REGISTRY: dict[str, Periodic] = {}


def register(name: str, func: Callable[[], object], every: Callable[[], float], *, per_host: bool = False) -> None:
    _REGISTRY[name] = Periodic(name, func, every, per_host)


def registered() -> dict[str, Periodic]:
    return dict(_REGISTRY)


def tick(duration: float = LOOP_SECONDS) -> str:
    """The minutely task: run each shared pass every ``every()`` seconds for ``duration``."""
    return _loop(TICK_LEASE, per_host=False, duration=duration)


def host_lease() -> str:
    return f"{TICK_LEASE}@{settings.GRIDGATE_WORKER_HOST}"


def host_tick(duration: float = LOOP_SECONDS) -> str:
    """This host's passes (``per_host=True``) every ``every()`` seconds for ``duration``."""
    return _loop(host_lease(), per_host=True, duration=duration)


def host_loop(stop: threading.Event) -> None:
    """Run :func:`host_tick` until ``stop`` is set (a daemon thread of ``manage.py worker``).
    A second worker on the same host waits for the lease; a database outage is waited out."""
    while not stop.is_set():
        close_old_connections()
        try:
            if host_tick() in (NOTHING, TAKEN):  # no step ran: do not spin
                stop.wait(5)
        except Exception:  # the database is away: try again shortly, never end the thread
            log.exception("host loop: tick failed")
            stop.wait(5)


def _loop(lease: str, *, per_host: bool, duration: float) -> str:
    periodics = {name: p for name, p in _REGISTRY.items() if p.per_host == per_host}
    if not periodics:
        return NOTHING
    last_run: dict[str, float] = {}
    counts = dict.fromkeys(periodics, 0)

    def step():
        now = time.monotonic()
        for periodic in periodics.values():
            if now - last_run.get(periodic.name, -1e18) < periodic.every():
                continue
            last_run[periodic.name] = now
            try:
                periodic.func()
                counts[periodic.name] += 1
            except Exception:  # one failing pass must not stop the others or the loop
                log.exception("periodic pass %s failed", periodic.name)

    interval = min(p.every() for p in periodics.values())
    steps = run_ticker(lease, step, interval=interval, duration=duration)
    if not steps:
        return TAKEN
    return ", ".join(f"{name}: {n}" for name, n in counts.items())
