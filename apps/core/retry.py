"""Transactions the database aborted as a whole, run again (PATTERNS §2, "Lock order")."""

import logging

from django.db import OperationalError, connection

from apps.core.exceptions import Unavailable

log = logging.getLogger(__name__)

# PostgreSQL's "deadlock detected" and "could not serialize access": the transaction was
# aborted as a whole and may simply be run again.
RETRYABLE_SQLSTATES = frozenset({"40P01", "40001"})


def is_retryable(exc: BaseException) -> bool:
    return isinstance(exc, OperationalError) and getattr(exc.__cause__, "sqlstate", None) in RETRYABLE_SQLSTATES


def retry_aborted(func, *, attempts: int = 3):
    """Run ``func`` (one whole transaction); if the database aborts it as a deadlock victim or a
    serialization failure, run it again, and past ``attempts`` answer 503 (never a 500).

    Every path takes its locks in one order (pool queue → session → job, PATTERNS §2), so this is a
    backstop. Inside a caller's transaction the aborted work cannot be re-run alone: 503.
    """
    for attempt in range(1, attempts + 1):
        try:
            return func()
        except OperationalError as exc:
            if not is_retryable(exc):
                raise
            if attempt == attempts or connection.in_atomic_block:
                log.warning("transaction aborted (%s) after %d attempt(s)", exc.__cause__.sqlstate, attempt)
                raise Unavailable("The database aborted a conflicting transaction; try again.") from exc
