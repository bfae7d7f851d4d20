"""Read queries about sessions shared by several callers (STYLE.md: one selector per shared query)."""

from dataclasses import dataclass
from decimal import Decimal

from django.db import connection
from django.http import Http404

from apps.core.rows import insert, insert_statement, inserted
from apps.resources.models import ResourceClass
from apps.sessions.models import Session, SessionStatus, is_service_principal


@dataclass(frozen=True)
class Usage:
    """What a pool's active sessions hold: slots, and their classes' resources (quota pools)."""

    slots: int = 0
    cpu: float = 0
    memory: float = 0
    gpu: float = 0


def active_usage(pool_ids, *, inserting: Session | None = None) -> dict[int, Usage]:
    """R-SESS-1/R-SESS-6: slots and class resources held by the active sessions of each pool.

    The one definition of "a pool's usage": admission sums it under the pool lock, the slots
    endpoints, the admin and the home gauges read it. One query whatever the number of pools
    (served by the ``sessions_active_pool`` partial index); a pool without active sessions maps
    to ``Usage()``. Written by hand (STYLE.md rule 4): the ORM spent ~0.7 ms of CPU building this
    aggregate, most of the sum's cost in every admission (bench/admission.py)::

        [WITH new AS (INSERT the inserting session)]
        SELECT pool, SUM(slots), SUM(class cpu), SUM(class memory), SUM(class gpu)
          FROM active sessions JOIN their classes WHERE pool IN pool_ids GROUP BY pool

    ``inserting``: admission's new session, stored by this call, and not counted in what it
    returns. On PostgreSQL the INSERT rides in the same statement (whose snapshot, taken before
    it, does not see its own insert): one round trip fewer while admission holds the pool's
    lock, where every round trip waits for a CPU on a loaded host (bench/http_load.py: REST
    acquire+release 72-79 -> 85-115 cycles/s, interleaved runs). Elsewhere, or for a model with
    save receivers: the sum, then the insert.
    """
    pool_ids = list(pool_ids)
    usage = dict.fromkeys(pool_ids, Usage())
    if not pool_ids:
        return usage
    sql, params = usage_statement(pool_ids)
    together = None
    if inserting is not None and connection.vendor == "postgresql":
        together = insert_statement(inserting)
    if together is not None:
        sql, params = f"WITH new AS ({together[0]} RETURNING 1) {sql}", [*together[1], *params]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    if together is not None:
        inserted(inserting)
    elif inserting is not None:
        insert(inserting)
    # A group has at least one session, and slots and class resources are NOT NULL: never null.
    # SQLite sums a decimal column as a float (0.1 + 0.2 = 0.30000000000000004): back to the
    # column's precision, as the ORM's decimal converter does, since quotas compare in Decimal.
    places = Decimal(1).scaleb(-ResourceClass._meta.get_field("cpu").decimal_places)
    for pool_id, slots, cpu, memory, gpu in rows:
        usage[pool_id] = Usage(slots=slots, cpu=Decimal(str(cpu)).quantize(places), memory=memory, gpu=gpu)
    return usage


def usage_statement(pool_ids: list[int]) -> tuple[str, list]:
    """The SELECT of :func:`active_usage` and its parameters, for a statement that needs the
    sums inside it (admission's insert-if-it-fits): a row (pool_id, slots, cpu, memory, gpu) per
    pool of ``pool_ids`` with active sessions."""
    sessions, classes = Session._meta.db_table, ResourceClass._meta.db_table
    marks = ", ".join(["%s"] * len(pool_ids))
    sql = (
        f"SELECT s.pool_id, SUM(s.slots), SUM(c.cpu), SUM(c.memory), SUM(c.gpu)"  # noqa: S608 (names from _meta)
        f" FROM {sessions} s JOIN {classes} c ON c.id = s.resource_class_id"
        f" WHERE s.status = %s AND s.pool_id IN ({marks}) GROUP BY s.pool_id"
    )
    return sql, [SessionStatus.ACTIVE, *pool_ids]


def slots_usage(pool) -> dict:
    """R-SESS-6: ``{"slots_total", "slots_used", "slots_available"}`` (total may be None)."""
    used = active_usage([pool.pk])[pool.pk].slots
    total = pool.slots_total
    return {
        "slots_total": total,
        "slots_used": used,
        "slots_available": None if total is None else max(total - used, 0),
    }


def visible_or_404(queryset, user, pk) -> Session:
    """One session of ``queryset`` by id, or 404 unless ``user`` may see it (the rule of
    ``SessionQuerySet.visible_to``: the owner, staff and service principals).

    Owner first: the common path (the owner submitting a job) costs the session's own query only;
    the permission lookup (two queries on a fresh user) is asked only about someone else's session
    (issue 15: a REST submission in three statements, token lookup included)."""
    return seen_or_404(queryset.filter(pk=pk).first(), user)


def seen_or_404(session: Session | None, user) -> Session:
    """``session`` if ``user`` may see it (owner first, as ``visible_or_404``), else 404."""
    if session is None or (session.user_id != user.pk and not is_service_principal(user)):
        raise Http404("No such session.")
    return session
