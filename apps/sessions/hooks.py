"""Extension points the scheduling app plugs into, so sessions do not import jobs.

- ``register_busy_condition(fn)``: ``fn()`` returns a ``Q`` (usually ``Exists(...)``) true for
  sessions that have pending or running work; such sessions are never idle-expired (R-SESS-3).
  The Q must be pure (no per-call values).
- ``sessions_revoked``: sent after sessions were revoked (released, revoked by staff, expired),
  with ``session_ids`` and ``reason``; receivers cancel pending jobs and ask running ones to stop
  (R-SESS-3, R-SESS-4).
- ``batch_capacity_changed``: sent with ``pool_ids`` once a session that holds no scheduler job
  (a REST or web session) was admitted or ended on pools with a Slurm licence: the slots a batch
  scheduler may hand out changed (the licences app syncs the licence).
"""

from collections.abc import Callable

from django.db.models import Q
from django.dispatch import Signal

sessions_revoked = Signal()
batch_capacity_changed = Signal()

_busy_conditions: list[Callable[[], Q]] = []


def register_busy_condition(condition: Callable[[], Q]) -> None:
    if condition not in _busy_conditions:
        _busy_conditions.append(condition)


def unregister_busy_condition(condition: Callable[[], Q]) -> None:
    if condition in _busy_conditions:
        _busy_conditions.remove(condition)


def busy_q() -> Q | None:
    """A Q matching sessions with unfinished work, or None when nothing is registered."""
    combined = None
    for condition in _busy_conditions:
        q = condition()
        combined = q if combined is None else combined | q
    return combined
