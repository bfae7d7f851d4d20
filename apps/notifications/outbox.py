"""The producers' side of notifications (R-NOTE-1): put event occurrences into the outbox.

Producers call :func:`notify` (one user) or :func:`notify_many` (a pass's batch) **inside the
transaction of the state change they report**: the delivery rows commit with it or not at all,
so an event is never lost to a crash between the two and never reported for a change that rolled
back. One statement per call, whatever the number of users and subscriptions (an INSERT … SELECT
over the subscriptions), none for an empty batch; a row that exists already (the producer ran
twice) is left alone by the unique key (subscription, event, subject).

Producers: job finished/failed (``apps.scheduling.passes._finish``), case finished/failed
(``apps.cases.passes``), session expiring (``apps.notifications.passes.sessions_expiring``),
reservation starting (``apps.sessions.services.start_reservations``, the calendar's tick). The
allocation events (``allocation.80``, ``allocation.100``) are emitted by the allocations once
they land, through :func:`notify`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection
from django.utils import timezone

from apps.notifications.models import Delivery, DeliveryStatus, Event, Subscription

#: VALUES rows per statement (4 parameters each, far below PostgreSQL's 65 535)
ROWS_PER_STATEMENT = 5000


def notify(*, user, event: Event | str, subject: str, payload: dict, now: datetime | None = None) -> int:
    """Tell ``user`` (a user or a user id) about ``event`` on ``subject`` (the occurrence's key:
    ``job:42``, ``allocation:7:2026-12``) by every channel they chose for it. Returns the number
    of deliveries enqueued (0 when they chose none, or when this occurrence was enqueued before)."""
    user_id = getattr(user, "pk", user)
    return notify_many([(event, user_id, subject, payload)], now=now)


def notify_many(items: Iterable[tuple[str, int, str, dict]], *, now: datetime | None = None) -> int:
    """:func:`notify` for a batch of ``(event, user id, subject, payload)``."""
    rows = [
        (str(event), int(user_id), str(subject)[:100], json.dumps(payload, cls=DjangoJSONEncoder, sort_keys=True))
        for event, user_id, subject, payload in items
    ]
    if not rows:
        return 0
    now = now or timezone.now()
    inserted = 0
    for start in range(0, len(rows), ROWS_PER_STATEMENT):
        inserted += _insert(rows[start : start + ROWS_PER_STATEMENT], now)
    return inserted


#: PostgreSQL: the subscriptions a producer enqueues for stay until its transaction ends (an
#: unsubscribe, which locks its row first, waits and then deletes the new delivery with it), and
#: one deleted meanwhile is skipped: never a delivery naming a deleted subscription, which would
#: fail the producer's transaction (a job's or a case's end) at its commit. KEY SHARE: producers
#: never wait for each other, nor for a change of a subscription's other columns.
_KEEP_SUBSCRIPTIONS = "FOR KEY SHARE OF s "


def _insert(rows: list[tuple[str, int, str, str]], now: datetime) -> int:
    """For each row, one pending delivery per subscription of that user to that event:

        for (event, user, subject, payload) in rows:
            for s in subscriptions where s.user = user and s.event = event:
                insert delivery(s, user, event, subject, payload, pending, due now)
                    unless one exists for (s, event, subject)

    Served by the subscriptions' unique index (user, event, …)."""
    q = connection.ops.quote_name
    subscription, delivery = q(Subscription._meta.db_table), q(Delivery._meta.db_table)
    if connection.vendor == "postgresql":
        row = "(CAST(%s AS varchar), CAST(%s AS bigint), CAST(%s AS varchar), CAST(%s AS jsonb))"
    else:
        row = "(%s, %s, %s, %s)"
    params: list = []
    for values in rows:
        params += values
    stamp = Delivery._meta.get_field("created_at").get_db_prep_value(now, connection)
    columns = ", ".join(
        q(Delivery._meta.get_field(name).column)
        for name in (
            "subscription",
            "user",
            "event",
            "subject",
            "payload",
            "status",
            "attempts",
            "next_attempt_at",
            "lease_owner",
            "last_error",
            "created_at",
        )
    )
    # Only model metadata (quoted names) is interpolated; every value is a parameter.
    sql = (
        f"WITH v(event, user_id, subject, payload) AS (VALUES {', '.join([row] * len(rows))}) "  # noqa: S608
        f"INSERT INTO {delivery} ({columns}) "
        f"SELECT s.id, s.user_id, s.event, v.subject, v.payload, %s, 0, %s, '', '', %s "
        f"FROM {subscription} s JOIN v ON s.user_id = v.user_id AND s.event = v.event "
        "WHERE s.id IS NOT NULL "  # SQLite: an INSERT … SELECT … ON CONFLICT needs a WHERE to parse
        f"{_KEEP_SUBSCRIPTIONS if connection.vendor == 'postgresql' else ''}"
        "ON CONFLICT DO NOTHING"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, DeliveryStatus.PENDING, stamp, stamp])
        return max(cursor.rowcount, 0)
