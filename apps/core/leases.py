"""Leases: how a worker claims rows and keeps them while it works, and how one holder of a named
lease is chosen across clusters (PATTERNS.md §3, §4). A killed worker's rows go to another once
their leases expire; a slow one keeps them.

- :func:`claim`: ``SELECT … FOR UPDATE SKIP LOCKED`` of due rows no live lease holds, then one
  ``UPDATE`` writing the owner and the expiry (``lease_owner``, ``lease_until`` unless named);
- :func:`renew`: a compare-and-set on the owner; releasing is each pass's own write-back;
- :class:`Heartbeat`: the one thread that renews while a slow call runs (:func:`kept`);
- :func:`acquire_lease`, :func:`release_lease`: named leases (``core.Lease``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime, timedelta

from django.db import IntegrityError, connection, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from apps.core.models import Lease

log = logging.getLogger(__name__)

OWNER, UNTIL = "lease_owner", "lease_until"


def claim(
    rows: QuerySet, *, owner: str, now: datetime, lease: timedelta, batch: int, owner_field=OWNER, until_field=UNTIL
) -> list:
    """Lease to ``owner`` until ``now + lease`` up to ``batch`` of ``rows`` (filtered and ordered
    by the caller) that no live lease holds; returns their primary keys, in ``rows``' order."""
    free = Q(**{f"{until_field}__isnull": True}) | Q(**{f"{until_field}__lt": now})  # none, or expired
    with transaction.atomic():
        # skip_locked: rows another worker is claiming right now are left to it, never shared and
        # never waited for; they stay locked until this transaction commits their new owner.
        ids = list(rows.filter(free).select_for_update(skip_locked=True).values_list("pk", flat=True)[:batch])
        if ids:
            rows.model.objects.filter(pk__in=ids).update(**{owner_field: owner, until_field: now + lease})
    return ids


def renew(rows: QuerySet, *, owner: str, until: datetime, owner_field=OWNER, until_field=UNTIL) -> int:
    """Extend to ``until`` the leases ``owner`` still holds among ``rows``; returns how many.
    Compare-and-set on the owner: a worker whose lease expired and was taken over loses here,
    and a row whose outcome was recorded (its lease cleared) stays as it is."""
    return rows.filter(**{owner_field: owner}).update(**{until_field: until})


class Lost(Exception):
    """Raised by a heart-beat's beat whose lease went to another holder: the heart-beat ends."""


class Heartbeat:
    """One thread calling ``beat`` every ``every`` seconds (or ``every()``, read before each wait)
    from :meth:`start` until :meth:`stop` joins it, or while a ``with`` body runs; ``immediately``:
    a first beat at once; ``stop``: the caller's own stop signal, which ends it too. A beat that
    raises is logged (``what`` failed) and its connection closed, so the next beat opens a new one
    (the lease may lapse meanwhile: every write-back checks its owner); one that raises
    :class:`Lost` ends the thread. What a beat returns is ignored."""

    def __init__(self, beat: Callable[[], object], *, every, name: str, what="", immediately=False, stop=None):
        self.beat, self.every, self.immediately = beat, every, immediately
        self.what = what or f"the heart-beat {name}"
        self._stop = stop or threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join()

    @property
    def beating(self) -> bool:
        return self._thread.is_alive()

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def _run(self) -> None:
        first = self.immediately
        try:
            while first or not self._stop.wait(self.every() if callable(self.every) else self.every):
                first = False
                try:
                    self.beat()
                except Lost:
                    return
                except Exception:
                    log.warning("%s failed", self.what, exc_info=True)
                    connection.close()  # broken by the outage: the next beat opens a new one
        finally:
            connection.close()  # the thread's own connection, if it opened one


def kept(rows: QuerySet, *, owner: str, lease: Callable[[], timedelta], name: str, what="", **columns) -> Heartbeat:
    """The heart-beat renewing, every quarter of ``lease()``, the leases ``owner`` still holds
    among ``rows`` to now + ``lease()``: one UPDATE per beat whatever the number of rows, and
    none unless the body outlasts a quarter of the lease. ``columns``: as :func:`renew`'s."""
    return Heartbeat(
        lambda: renew(rows, owner=owner, until=timezone.now() + lease(), **columns),
        every=lambda: lease().total_seconds() / 4,
        name=name,
        what=what,
    )


# -- named leases ---------------------------------------------------------------------------------
def acquire_lease(name: str, owner: str, ttl: timedelta) -> bool:
    """Take or renew the lease ``name`` for ``owner`` (compare-and-set: ours, or expired);
    False while someone else holds it."""
    now = timezone.now()
    ours_or_expired = Lease.objects.filter(Q(owner=owner) | Q(expires_at__lt=now), name=name)
    if ours_or_expired.update(owner=owner, expires_at=now + ttl):
        return True
    try:
        with transaction.atomic():
            Lease.objects.create(name=name, owner=owner, expires_at=now + ttl)
        return True
    except IntegrityError:
        return False


def release_lease(name: str, owner: str) -> None:
    """Give the lease ``name`` back if ``owner`` still holds it (the next holder needs not wait)."""
    Lease.objects.filter(name=name, owner=owner).delete()
