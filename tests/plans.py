"""Cost independent of history, checked on PostgreSQL's own plans (SPEC §9).

PostgreSQL prepares a statement after a few executions (psycopg's prepare threshold) and may then
plan it once for every parameter value (a generic plan): a partial index whose condition the
statement meets only through a parameter (``status = $1``) cannot serve that plan, which then
reads the whole history (a user's ended sessions, a pool's finished jobs) while a custom plan of
the same text looks fine. :func:`assert_history_free` runs each statement a request sent again,
prepared and forced to its generic plan, over a history filled by :func:`fill_history`, and fails
when a step of its plan reads rows of that history only to throw them away.
"""

import json
import re
import uuid
from datetime import timedelta
from unittest import mock

import psycopg
from django.db import connection
from django.utils import timezone
from psycopg import ClientCursor

#: rows a step may read and discard; the history below is a hundred times more
DISCARDED = 30
HISTORY_ROWS = 3000


def fill_history(user, pool) -> None:
    """``HISTORY_ROWS`` ended sessions of ``user`` on ``pool`` (each with a scheduler job id and
    a finished job), as many ended or cancelled reservations of the pool and one open now, held by
    ``user`` (admission takes its slot and gives it back), then fresh planner statistics."""
    from apps.scheduling.models import Job
    from apps.sessions.models import Session

    now = timezone.now()
    klass = pool.classes.get(default=True)
    ended = Session.objects.bulk_create(
        Session(
            user=user,
            resource_class=klass,
            pool=pool,
            external_id=str(1_000_000 + i),
            status="revoked",
            revoked_at=now,
            revocation_reason="released",
            created_at=now - timedelta(hours=1),
            expires_at=now,
            idle_expires_at=now,
        )
        for i in range(HISTORY_ROWS)
    )
    Job.objects.bulk_create(
        Job(session=session, pool=pool, user=user, payload={}, shots=1, status="completed", created_at=now)
        for session in ended
    )
    # The pool's past calendar (R-RES-1): ended and cancelled reservations, which admission's
    # lookup of the open ones must never read, and one open now that it reads and counts in.
    from apps.reservations.models import Reservation

    Reservation.objects.bulk_create(
        Reservation(
            pool=pool,
            start=now - timedelta(hours=2 + i),
            end=now - timedelta(hours=1) if i % 2 else now + timedelta(hours=1),
            cancelled_at=now if not i % 2 else None,
            started_at=now - timedelta(hours=2 + i),  # as the tick marks them
            slots=1,
            title=f"past {i}",
        )
        for i in range(HISTORY_ROWS)
    )
    Reservation.objects.create(
        pool=pool, start=now - timedelta(minutes=5), end=now + timedelta(hours=1), slots=1, title="open now"
    ).users.add(user)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def sent_statements(call) -> list[tuple[str, tuple]]:
    """The statements ``call()`` sends to PostgreSQL (counted at psycopg's cursors, so none is
    hidden), with their parameters."""
    sent = []
    execute = psycopg.Cursor.execute

    def counted(cursor, query, params=None, *args, **kwargs):
        sent.append((query, tuple(params or ())))
        return execute(cursor, query, params, *args, **kwargs)

    with mock.patch.object(psycopg.Cursor, "execute", counted):
        call()
    return sent


def generic_plan(query: str, params: tuple) -> dict:
    """``query`` prepared, forced to its generic plan and run with ``params`` under EXPLAIN
    ANALYZE, in a transaction rolled back after (it changes nothing). An INSERT of a row the
    request already stored runs with fresh ids in place of its UUIDs."""
    try:
        return _explained(query, params)
    except psycopg.errors.UniqueViolation:
        return _explained(query, tuple(uuid.uuid4() if isinstance(value, uuid.UUID) else value for value in params))


def _explained(query: str, params: tuple) -> dict:
    count = 0

    def number(_):
        nonlocal count
        count += 1
        return f"${count}"

    text = re.sub(r"(?<!%)%s", number, query).replace("%%", "%")
    db = connection.settings_dict
    conninfo = f"host={db['HOST'] or '127.0.0.1'} port={db['PORT'] or 5432} user={db['USER']} dbname={db['NAME']}"
    with psycopg.connect(conninfo) as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute(f"PREPARE hot AS {text}")
        cursor = ClientCursor(conn)
        arguments = f"({', '.join(['%s'] * len(params))})" if params else ""
        cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE hot{arguments}", params)
        plan = cursor.fetchone()[0][0]["Plan"]
        conn.rollback()
        return plan


def discarded(plan: dict) -> list[tuple[str, int]]:
    """(step, rows read and thrown away) for each step of ``plan`` that read a table."""
    found = []
    if "Relation Name" in plan:
        thrown = plan.get("Rows Removed by Filter", 0) + plan.get("Rows Removed by Index Recheck", 0)
        found.append((f"{plan['Node Type']} on {plan['Relation Name']}", thrown))
    for child in plan.get("Plans", []):
        found += discarded(child)
    return found


def assert_history_free(statements) -> None:
    assert statements
    for query, params in statements:
        wasteful = [(step, thrown) for step, thrown in discarded(generic_plan(query, params)) if thrown > DISCARDED]
        assert not wasteful, f"its generic plan reads history only to discard it {wasteful}:\n{query}"


def rows_read(sql: str, table: str) -> int:
    """The rows of ``table`` that the statement ``sql`` (as Django logged it, parameters inlined)
    reads on PostgreSQL, kept or thrown away, from its EXPLAIN ANALYZE (run in a rolled-back
    savepoint: it changes nothing)."""

    def walk(plan: dict) -> int:
        own = 0
        if plan.get("Relation Name") == table:
            kept = plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)
            own = kept * plan.get("Actual Loops", 1)
        return own + sum(walk(child) for child in plan.get("Plans", []))

    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}")
        plan = cursor.fetchone()[0]
    plan = plan if isinstance(plan, list) else json.loads(plan)
    return walk(plan[0]["Plan"])
