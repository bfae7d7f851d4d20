"""The notification worker's passes (R-NOTE-1), run by the tick loop (apps.notifications.apps).

Claim, commit, call, record (docs/operations.md, "Notifications"):

1. **claim** due pending deliveries in a short transaction (``skip_locked``, a lease), commit;
2. **send** each with no transaction open (mail server, webhook receiver), re-checking the
   webhook's URL against the outbound rules at that moment;
3. **record** the outcomes in one short transaction, only for the rows whose lease is still ours:
   delivered, or due again after an exponential back-off, or failed after
   ``GRIDGATE_NOTIFY_MAX_ATTEMPTS`` (or at once when retrying cannot help); each attempt is one
   row of the user's delivery log.

A worker killed between the call and the record leaves a lease that expires; the next pass sends
again (at least once): ``X-Gridgate-Delivery`` carries the delivery's id for receivers to drop
the repeat. Two workers never send one delivery at the same time.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from apps.core import leases
from apps.core.ticker import worker_identity
from apps.notifications import outbox, transports
from apps.notifications.models import Delivery, DeliveryAttempt, DeliveryStatus, Event, Subscription

log = logging.getLogger(__name__)

BATCH = 50
#: a claim's lease; a pass stops starting new calls after half of it (a webhook call ends within
#: twice GRIDGATE_NOTIFY_TIMEOUT_SECONDS, at most 120 s), so it records within its lease
LEASE_SECONDS = 300
MAX_BACKOFF_SECONDS = 3600


def backoff(attempts: int) -> timedelta:
    """After the ``attempts``-th failed attempt: the first retry's delay, doubled each time, capped."""
    base = settings.GRIDGATE_NOTIFY_RETRY_SECONDS
    return timedelta(seconds=min(base * 2 ** min(attempts - 1, 20), MAX_BACKOFF_SECONDS))


def claim(*, now: datetime, owner: str, batch: int) -> list[int]:
    """Lease up to ``batch`` due deliveries in turns: every user's first due delivery, then every
    user's second… (each user's in due order), so a batch is filled by one user only when nobody
    else has one due. A user's receivers may all answer at their deadline; one user's backlog of
    them (fifty subscriptions, a job ending every few seconds) used to fill every batch first and
    hold everybody else's notifications back for as long as it lasted. Numbering the turns reads
    the whole due backlog (docs/operations.md, "Delivery", says what that costs)."""
    due = Delivery.objects.filter(status=DeliveryStatus.PENDING, next_attempt_at__lte=now)
    free = Q(lease_until__isnull=True) | Q(lease_until__lt=now)
    # The candidates' turns, read without locks (PostgreSQL takes no FOR UPDATE beside a window
    # function); the claim below locks them, skipping any another worker took meanwhile.
    turns = (
        due.filter(free)
        .annotate(
            turn=Window(RowNumber(), partition_by=[F("user_id")], order_by=[F("next_attempt_at").asc(), F("id").asc()])
        )
        .order_by("turn", "next_attempt_at", "id")
        .values_list("pk", flat=True)[:batch]
    )
    order = {pk: position for position, pk in enumerate(turns)}
    if not order:
        return []
    rows = due.filter(pk__in=list(order)).order_by("next_attempt_at", "id")
    ids = leases.claim(rows, owner=owner, now=now, lease=timedelta(seconds=LEASE_SECONDS), batch=batch)
    return sorted(ids, key=order.__getitem__)


def deliver_due(*, now: datetime | None = None, batch: int = BATCH) -> dict:
    """One pass: send the due deliveries (at most ``batch``). A constant number of statements."""
    now = now or timezone.now()
    owner = worker_identity()[:100]
    ids = claim(now=now, owner=owner, batch=batch)
    if not ids:
        return {"claimed": 0}
    claimed = Delivery.objects.filter(id__in=ids, lease_owner=owner).select_related("subscription", "user")
    position = {pk: index for index, pk in enumerate(ids)}
    deliveries = sorted(claimed, key=lambda delivery: position[delivery.pk])  # in turns (claim)
    started = time.monotonic()
    outcomes: list[tuple[Delivery, transports.Outcome]] = []
    for delivery in deliveries:
        if time.monotonic() - started > LEASE_SECONDS / 2:
            break  # the rest is released below and taken by the next pass
        outcomes.append((delivery, transports.send(delivery)))  # no transaction open
    return record(outcomes, owner=owner, release=[d.pk for d in deliveries[len(outcomes) :]])


def record(outcomes, *, owner: str, release=()) -> dict:
    """Write the outcomes of the rows still ours (compare-and-set on the lease), in one transaction."""
    now = timezone.now()
    report = {"claimed": len(outcomes) + len(release), "delivered": 0, "retried": 0, "failed": 0, "skipped": 0}
    limit = settings.GRIDGATE_NOTIFY_MAX_ATTEMPTS
    with transaction.atomic():
        ours = set(
            Delivery.objects.select_for_update()
            .filter(id__in=[d.pk for d, _ in outcomes], lease_owner=owner, status=DeliveryStatus.PENDING)
            .values_list("id", flat=True)
        )
        changed, attempts = [], []
        for delivery, outcome in outcomes:
            if delivery.pk not in ours:
                report["skipped"] += 1  # the lease lapsed and another worker took it over
                continue
            delivery.attempts += 1
            delivery.lease_owner, delivery.lease_until = "", None
            if outcome.ok:
                delivery.status, delivery.delivered_at, delivery.next_attempt_at = DeliveryStatus.DELIVERED, now, None
                delivery.last_error = ""
                report["delivered"] += 1
            elif outcome.permanent or delivery.attempts >= limit:
                delivery.status, delivery.next_attempt_at = DeliveryStatus.FAILED, None
                delivery.last_error = outcome.error[:500]
                report["failed"] += 1
            else:
                delivery.next_attempt_at = now + backoff(delivery.attempts)
                delivery.last_error = outcome.error[:500]
                report["retried"] += 1
            changed.append(delivery)
            attempts.append(
                DeliveryAttempt(
                    delivery=delivery, at=now, ok=outcome.ok, status_code=outcome.status_code, error=outcome.error[:500]
                )
            )
        if changed:
            Delivery.objects.bulk_update(
                changed,
                ["status", "attempts", "next_attempt_at", "lease_owner", "lease_until", "last_error", "delivered_at"],
            )
            DeliveryAttempt.objects.bulk_create(attempts)
        if release:
            Delivery.objects.filter(id__in=list(release), lease_owner=owner).update(lease_owner="", lease_until=None)
    if report["failed"]:
        log.info("notifications: %d delivery(ies) given up", report["failed"])
    return report


def sessions_expiring(*, now: datetime | None = None) -> int:
    """Tell the owners of active sessions that reach their lifetime (``expires_at``) within
    ``GRIDGATE_NOTIFY_SESSION_EXPIRING_SECONDS`` (once per session: the outbox's key). Only the
    users subscribed to it are looked at (the subscriptions' index first, then their sessions);
    one statement when nobody is, three when somebody's session is due."""
    from apps.sessions.models import Session, SessionStatus

    now = now or timezone.now()
    horizon = now + timedelta(seconds=settings.GRIDGATE_NOTIFY_SESSION_EXPIRING_SECONDS)
    subscribers = Subscription.objects.filter(event=Event.SESSION_EXPIRING).values("user_id")
    due = list(
        Session.objects.filter(
            user_id__in=subscribers, status=SessionStatus.ACTIVE, expires_at__gt=now, expires_at__lte=horizon
        ).values_list("pk", "user_id", "pool__name", "expires_at")
    )
    if not due:
        return 0
    subjects = {f"session:{pk}": (pk, user_id, pool, expires) for pk, user_id, pool, expires in due}
    told = set(
        Delivery.objects.filter(event=Event.SESSION_EXPIRING, subject__in=list(subjects)).values_list(
            "subject", flat=True
        )
    )
    items = [
        (
            Event.SESSION_EXPIRING,
            user_id,
            subject,
            {
                "summary": f"Your session on {pool} ends at {expires:%Y-%m-%d %H:%M} UTC",
                "session": {"id": str(pk), "pool": pool, "expires_at": expires.isoformat()},
            },
        )
        for subject, (pk, user_id, pool, expires) in subjects.items()
        if subject not in told
    ]
    return outbox.notify_many(items, now=now)
