"""The tick loop: every registered periodic pass at its own sub-minute cadence (SPEC §8).

django-q2 schedules fire at most once a minute, so the sub-minute passes do not run as
schedules: each worker cluster runs one long-lived **ticker process** beside it
(``manage.py ticker``, started by ``manage.py worker``). All tickers contend for one short lease
(``core.Lease`` ``gridgate.tick``, ``GRIDGATE_TICK_LEASE_SECONDS``, 5 s by default); the holder
runs the passes, the others retry every second. A thread of the ticker renews the lease every
second whatever the passes are doing (a slow provider call must not hand the loop to a second
cluster), so the lease expires only when the process is gone or stuck: another cluster's ticker
takes over within the lease plus a second, and a running loop has no gap (it replaced a ~55 s loop
on a minutely schedule, absent ~60 s after its holder died and 5 s of every minute).

Apps register their passes in ``AppConfig.ready``. The passes are safe to run anywhere at any time
(their own claims and leases): the lease only avoids wasted work. Some work can only be done on
one host (a local case's process is seen in its own host's /proc only): passes registered
``per_host=True`` run in every ticker, lease or not, and claim only what is pinned to their host.
The lease thread stamps this worker's ``core.WorkerHeartbeat`` every
``GRIDGATE_WORKER_HEARTBEAT_SECONDS`` (health, metrics).

The lease counts as held only within ``GRIDGATE_TICK_LEASE_SECONDS`` of its last renewal
(:attr:`Ticker.holding`): a keeper thread hung in a database call stops the shared passes when
the lease it can no longer renew expires, as another cluster's ticker may take it then. The
keeper also notes since when it has had unbroken database contact
(:func:`database_contact_seconds`): after a database outage, passes that judge other processes
dead by their silence (``emulator.recover_runs``) wait until those processes had the time to
reconnect and beat again.
"""

import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import close_old_connections

from apps.core.leases import Heartbeat, acquire_lease, release_lease
from apps.core.tasks import heartbeat

log = logging.getLogger(__name__)

TICK_LEASE = "gridgate.tick"
KEEPER_SECONDS = 1.0  # lease renewal, and how often a ticker without the lease tries to take it
# A step (one round of due passes) running longer than this is stuck (a hung call without its own
# timeout): the keeper stops renewing, so another cluster's ticker takes the loop over.
STALL_SECONDS = 600.0
clock = time.monotonic  # the ticker's clock (a test moves it)


@dataclass
class Periodic:
    name: str
    func: Callable[[], object]
    every: Callable[[], float]  # seconds, read at each step so settings overrides apply
    per_host: bool = False  # run by every worker host's ticker, not only the lease holder's


_REGISTRY: dict[str, Periodic] = {}
_running: "Ticker | None" = None  # this process's ticker while it runs (Ticker.run)


def register(name: str, func: Callable[[], object], every: Callable[[], float], *, per_host: bool = False) -> None:
    _REGISTRY[name] = Periodic(name, func, every, per_host)


def registered() -> dict[str, Periodic]:
    return dict(_REGISTRY)


def database_contact_seconds() -> float:
    """For how long this process's ticker has had unbroken database contact: 0 while it has none
    (its keeper failed its last renewal), infinite where no ticker runs (a direct call, from a
    shell or a test: its own queries are the contact)."""
    ticker = _running
    if ticker is None:
        return math.inf
    since = ticker.connected_since
    return 0.0 if since is None else max(0.0, clock() - since)


def worker_identity() -> str:
    return f"{settings.GRIDGATE_WORKER_HOST}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Ticker:
    """One ticker process's state: the lease it may hold and when each pass last ran."""

    def __init__(self, owner: str | None = None):
        self.owner = owner or worker_identity()
        self.last_run: dict[str, float] = {}
        self.renewed_at: float | None = None  # clock() before the last renewal that succeeded
        self.connected_since: float | None = None  # clock() when the keeper (re)gained DB contact
        self.step_started: float | None = None  # set while the main thread runs a step
        self._last_beat = -1e18
        self._last_contact: float | None = None  # clock() after the last renewal that succeeded

    @property
    def holding(self) -> bool:
        """The lease is ours: renewed less than GRIDGATE_TICK_LEASE_SECONDS ago. A keeper hung in
        a database call (no error, no renewal) thus stops the shared passes when the lease expires
        in the database, where another cluster's ticker may take it; ``renewed_at`` is read before
        the renewal's statement, so this side expires first."""
        renewed = self.renewed_at
        return renewed is not None and clock() - renewed < settings.GRIDGATE_TICK_LEASE_SECONDS

    # -- the main thread: the passes ------------------------------------------------------------
    def run_due(self, *, shared: bool | Callable[[], bool] = True) -> list[str]:
        """Run every registered pass whose period has elapsed (only the per-host ones unless
        ``shared``: this ticker holds the loop; a callable is asked before each shared pass, so a
        lease lost in the middle of a step stops the step's remaining shared passes); return
        their names."""
        ran = []
        for periodic in list(_REGISTRY.values()):
            if not (periodic.per_host or (shared() if callable(shared) else shared)):
                continue
            now = clock()
            if now - self.last_run.get(periodic.name, -1e18) < periodic.every():
                continue
            self.last_run[periodic.name] = now
            try:
                periodic.func()
            except Exception:  # one failing pass must not stop the others or the loop
                log.exception("periodic pass %s failed", periodic.name)
                close_old_connections()  # a pass that broke the connection must not break the next
            ran.append(periodic.name)
        return ran

    # -- the keeper thread: lease and heartbeat -------------------------------------------------
    def keep(self) -> bool:
        """Take or renew the lease (unless the main thread is stuck) and beat when due; note since
        when the database answers."""
        now = clock()
        stuck = self.step_started is not None and now - self.step_started > STALL_SECONDS
        try:
            if stuck:
                if self.holding:
                    log.error("ticker %s: a step has run for %.0f s; leaving the loop", self.owner, STALL_SECONDS)
                    release_lease(TICK_LEASE, self.owner)
                self.renewed_at = None
            else:
                ttl = timedelta(seconds=settings.GRIDGATE_TICK_LEASE_SECONDS)
                self.renewed_at = now if acquire_lease(TICK_LEASE, self.owner, ttl) else None
            if now - self._last_beat >= settings.GRIDGATE_WORKER_HEARTBEAT_SECONDS:
                heartbeat()
                self._last_beat = now
        except Exception:  # the database is away: do not run passes on a lease we cannot renew
            log.warning("ticker %s: could not renew the lease", self.owner, exc_info=True)
            self.renewed_at = None
            self.connected_since = None
            self._last_contact = None
            close_old_connections()
        else:
            done = clock()
            # A renewal that hung (dropped packets: no error, just no answer) and then succeeded
            # is an outage too: contact counts again from now, not from before the hang.
            hung = self._last_contact is not None and done - self._last_contact > 3 * KEEPER_SECONDS + 5
            if self.connected_since is None or hung:
                self.connected_since = done
            self._last_contact = done
        return self.holding

    # -- the process ----------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Until ``stop`` is set: run the passes while this ticker holds the lease."""
        global _running
        _running = self
        keeper = Heartbeat(self.keep, every=lambda: KEEPER_SECONDS, name="ticker-lease", immediately=True, stop=stop)
        keeper.start()
        log.info("ticker %s started", self.owner)
        try:
            while not stop.is_set():
                holding = self.holding
                passes = [p for p in _REGISTRY.values() if holding or p.per_host]
                if not passes:
                    stop.wait(KEEPER_SECONDS / 4)
                    continue
                started = clock()
                self.step_started = started
                try:
                    close_old_connections()
                    self.run_due(shared=lambda: self.holding)
                finally:
                    self.step_started = None
                interval = min(min(p.every() for p in passes), KEEPER_SECONDS)
                stop.wait(max(0.0, interval - (clock() - started)))
        finally:
            keeper.stop()  # sets ``stop``, then joins the keeper
            if _running is self:
                _running = None
            try:
                release_lease(TICK_LEASE, self.owner)  # a clean stop hands the loop over at once
            except Exception:
                log.warning("ticker %s: could not release the lease", self.owner, exc_info=True)
            log.info("ticker %s stopped", self.owner)
