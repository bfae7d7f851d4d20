"""One worker per worker host name: what ``manage.py worker`` holds while its cluster runs.

``GRIDGATE_WORKER_HOST`` names a worker everywhere (its heartbeat, its leases, the local cases
pinned to it), so two clusters under one name are two workers pretending to be one: both would
claim the host's local cases and neither heartbeat would say so. Before it starts its cluster and
ticker, a worker therefore takes, and keeps while they run:

1. **the host's lock on this machine**, an ``flock`` on ``GRIDGATE_VAR_DIR/run/worker-<name>.lock``
   passed on to the cluster and the ticker. A lock belongs to its open file, which every process
   of the worker holds, so it is free only once none of them is left: a worker restarted after its
   supervisor was SIGKILLed waits (at most the moment the lifeline takes) until the old cluster is
   gone, however it went, instead of starting beside it;
2. **the host's lease** ``gridgate.worker.<name>`` (``core.Lease``), renewed every second by a
   thread, ``GRIDGATE_WORKER_LEASE_SECONDS`` (10) long: the same name on two machines (a copied
   configuration, a container rescheduled elsewhere while its old node still runs) waits too. A
   clean stop deletes it; after a crash the next worker takes it once it has expired. A worker
   that finds its lease taken by another (it could not renew it for longer than its length, the
   database being away) stops its cluster: its supervisor exits and its service manager restarts
   it, to wait its turn.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import socket
import threading
import uuid
from datetime import timedelta

from django.conf import settings
from django.db import connection

from apps.core.leases import Heartbeat, Lost, acquire_lease, release_lease

log = logging.getLogger(__name__)

RENEW_SECONDS = 1.0


def lease_name(host: str) -> str:
    return f"gridgate.worker.{host}"


def lock_path(host: str):
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", host) or "_"
    return settings.VAR_DIR / "run" / f"worker-{safe}.lock"


class HostClaim:
    """The host's lock and lease, held from :meth:`wait` until :meth:`release`."""

    def __init__(self, host: str | None = None, *, say=print):
        self.host = host or settings.GRIDGATE_WORKER_HOST
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"[:200]
        self.say = say
        self.lock_fd: int | None = None
        self._lost = ""
        self._keeper: Heartbeat | None = None

    @property
    def ttl(self) -> timedelta:
        return timedelta(seconds=settings.GRIDGATE_WORKER_LEASE_SECONDS)

    # -- taking it -------------------------------------------------------------------------------
    def wait(self, stop: threading.Event | None = None) -> bool:
        """Block until this worker holds the host's lock and lease (True), or ``stop`` is set."""
        stop = stop or threading.Event()
        if not self._take_lock(stop):
            return False
        said = False
        while not stop.is_set():
            try:
                if acquire_lease(lease_name(self.host), self.owner, self.ttl):
                    break
                holder = self._holder()
                if not said:
                    self.say(
                        f"worker host '{self.host}' is held by {holder} (GRIDGATE_WORKER_HOST): waiting until it "
                        "stops or its lease expires"
                    )
                    said = True
            except Exception as exc:  # the database is away: nothing can start before it answers
                log.warning("worker host %s: cannot reach the database to take its lease: %s", self.host, exc)
                connection.close()
            stop.wait(RENEW_SECONDS)
        else:
            return False
        self.say(f"worker host '{self.host}': lease taken by {self.owner}")
        what = f"worker host {self.host}: renewing its lease"
        self._keeper = Heartbeat(self._renew, every=RENEW_SECONDS, name="worker-host-lease", what=what).start()
        return True

    def _take_lock(self, stop: threading.Event) -> bool:
        path = lock_path(self.host)
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.lock_fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:  # the lease alone then keeps one worker per host name
            log.warning("worker host %s: no lock file at %s (%s); relying on the lease alone", self.host, path, exc)
            return True
        said = False
        while not stop.is_set():
            try:
                fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if not said:
                    self.say(
                        f"worker host '{self.host}': another worker of this name still runs on this machine (its "
                        f"processes hold {path}); waiting until none of them is left"
                    )
                    said = True
            stop.wait(0.2)
        return False

    def _holder(self) -> str:
        from apps.core.models import Lease

        lease = Lease.objects.filter(name=lease_name(self.host)).values_list("owner", "expires_at").first()
        return f"{lease[0]} until {lease[1]:%H:%M:%S} UTC" if lease else "nobody (just released)"

    # -- keeping it ------------------------------------------------------------------------------
    def _renew(self) -> None:
        if not acquire_lease(lease_name(self.host), self.owner, self.ttl):
            self._lost = (
                f"worker host '{self.host}' was taken over by {self._holder()} while this worker could not renew "
                "its lease"
            )
            raise Lost(self._lost)  # nothing left to renew: the heart-beat ends

    def lost(self) -> str:
        """Why this worker must stop (its lease went to another), or ''."""
        return self._lost

    # -- giving it back --------------------------------------------------------------------------
    def release(self) -> None:
        if self._keeper is not None:
            self._keeper.stop()
            try:
                release_lease(lease_name(self.host), self.owner)  # the next worker needs not wait
            except Exception:
                log.warning("worker host %s: could not release its lease; it expires by itself", self.host)
        if self.lock_fd is not None:
            os.close(self.lock_fd)  # the children's copies went with them
            self.lock_fd = None
