"""Transactions the database aborted as a whole, run again (PATTERNS §2, "Lock order")."""

import logging
import time

from django.db import InterfaceError, OperationalError, connection

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


def once_the_database_answers(func, *, within: float, what: str):
    """Run ``func`` (short transactions of its own, with no transaction open around it); while the
    database is away (restarted, a connection terminated: ``OperationalError``/``InterfaceError``)
    close the broken connection and run it again, every second or so, for up to ``within``
    seconds, then let the error through.

    For a worker holding something only it has (an emulation's result, a device slot it is about
    to hand back): a database restart of a few seconds must cost a few seconds, not the work or
    the device until the dead-worker timeout. ``func`` must be safe to run again (a
    compare-and-set: after a commit whose answer was lost, the second run finds it done).
    """
    deadline = time.monotonic() + within
    pause = 0.25
    while True:
        try:
            return func()
        except (OperationalError, InterfaceError) as exc:
            if connection.in_atomic_block or time.monotonic() + pause > deadline:
                raise
            log.warning("%s: the database did not answer (%s); trying again in %.2g s", what, exc, pause)
        connection.close()  # a connection the outage broke: the next attempt opens a new one
        time.sleep(pause)
        pause = min(pause * 2, 2.0)
