"""The sessions this web process has submitted jobs into (PostgreSQL only).

Clients submit many jobs into one session (Pulser's QRMI connection: one per entry of a job's
parameters). Each process remembers, for a session a job was submitted into, its owner and pool,
and for each pool its row and its devices' rows as last read with their version (``xmin``), so
that the next submission into that session skips the lookup (``statements.target``). Those rows
hold configuration only (the pool's usage counters have their own row): sessions admitted and
released beside it leave what is remembered valid (R-SESS-7).

Nothing remembered is trusted: the submission's statement stores the job only if the session is
still its owner's, active, on that pool, and the pool's and devices' rows are still the versions
the payload was checked against (``statements.renew_and_insert``); anything else forgets the
session and the submission starts over from the database. Only targets read outside any
transaction block are remembered: their rows were committed, and the transactions that wrote
them write no more, so an equal version means the same rows.
"""

import threading
import uuid
from collections import OrderedDict

from apps.scheduling.statements import Target
from apps.sessions.models import SessionStatus

KNOWN_SESSIONS = 10_000  # per process, the least recently used forgotten first: ~150 bytes each
_lock = threading.Lock()
_sessions: OrderedDict = OrderedDict()  # session id -> (user id, pool id)
_pools: dict = {}  # pool id -> Target of the latest read (its pool, devices and version)


def recall(session_id: uuid.UUID, user_id: int, pool_name: str | None) -> Target | None:
    """The remembered target of ``user_id``'s session (on the pool named ``pool_name``), or None."""
    with _lock:
        known = _sessions.get(session_id)
        if known is None or known[0] != user_id:
            return None
        latest = _pools[known[1]]
        if pool_name is not None and latest.pool.name != pool_name:
            return None
        _sessions.move_to_end(session_id)
    # Active when its job was stored; the submission's statement checks that it still is, and
    # that it is not due (its deadlines are the statement's to compare, not this memory's).
    return Target(
        session_id,
        user_id,
        SessionStatus.ACTIVE,
        "",
        None,
        None,
        latest.pool,
        latest.devices,
        latest.version,
        allocation_id=known[2],
    )


def remember(target: Target) -> None:
    """After a submission into ``target``, read from the database outside a transaction block."""
    if target.version is None:
        return
    with _lock:
        _pools[target.pool.pk] = target
        _sessions[target.session_id] = (target.user_id, target.pool.pk, target.allocation_id)
        _sessions.move_to_end(target.session_id)
        if len(_sessions) > KNOWN_SESSIONS:
            _sessions.popitem(last=False)


def forget(session_id: uuid.UUID) -> None:
    with _lock:
        _sessions.pop(session_id, None)


def clear() -> None:
    """Forget everything (tests)."""
    with _lock:
        _sessions.clear()
        _pools.clear()
