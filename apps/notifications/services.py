"""Notification subscriptions (R-NOTE-1): the one code path for the API, the user page and the admin.

``notify`` is the producers' entry point (``apps.notifications.outbox``): other apps call
``notifications.services.notify(user=…, event=…, subject=…, payload=…)`` in the transaction of the
change they report.
"""

from __future__ import annotations

import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction

from apps.core.exceptions import Conflict, NotFound
from apps.credentials import sealing
from apps.notifications.models import ALREADY_SUBSCRIBED, Channel, Subscription
from apps.notifications.outbox import notify, notify_many

__all__ = ["create_subscription", "delete_subscription", "notify", "notify_many"]

SECRET_BYTES = 32


def create_subscription(*, user, event: str, channel: str, url: str = "") -> tuple[Subscription, str]:
    """Subscribe ``user`` to ``event`` by ``channel``. Returns the subscription and, for a webhook
    to a URL new to ``user``, its signing secret: the only time it is ever shown (it is kept
    sealed); a webhook to a URL they already use shares that URL's secret ("" here). Raises Django's
    ``ValidationError`` (a URL the outbound rules refuse, e-mail without an address),
    :class:`~apps.credentials.sealing.SealingUnavailable` (503: no key to seal the secret) or
    :class:`~apps.core.exceptions.Conflict` (the same subscription exists)."""
    subscription = Subscription(user=user, event=event, channel=channel, url=(url or "").strip())
    secret = ""
    subscription.full_clean(validate_constraints=False)  # what the caller can fix (400) before 503
    limit = settings.GRIDGATE_NOTIFY_MAX_SUBSCRIPTIONS
    try:
        with transaction.atomic():
            # The user's row serializes their own creations: the cap holds under concurrent
            # requests, and two subscriptions to a URL new to them at once share one secret.
            get_user_model().objects.select_for_update().filter(pk=user.pk).values_list("pk").first()
            if Subscription.objects.filter(user=user).count() >= limit:
                # Each event fans out to every subscription: a cap keeps one user's job ends from
                # becoming a flood of requests (to the receivers, and for the delivery pass).
                raise Conflict(f"You have {limit} subscriptions, the most this site allows: delete one first.")
            if channel == Channel.WEBHOOK:
                # One secret per receiver: another event to a URL the user already has keeps its
                # secret (shown when that URL was first subscribed), so a receiver checks one key.
                same_url = (
                    Subscription.objects.filter(user=user, channel=Channel.WEBHOOK, url=subscription.url)
                    .values_list("secret_sealed", flat=True)
                    .first()
                )
                if same_url:
                    subscription.secret_sealed = same_url
                else:
                    secret = secrets.token_urlsafe(SECRET_BYTES)
                    subscription.secret_sealed = sealing.seal(secret)
            subscription.save()
    except IntegrityError:
        raise Conflict(str(ALREADY_SUBSCRIBED)) from None
    return subscription, secret


def delete_subscription(*, user, subscription_id) -> None:
    """Unsubscribe: its pending deliveries go with it (nothing more is sent to that destination).
    The row is locked first: a producer enqueueing for it right now (``outbox``, which holds it
    until its transaction ends) commits its delivery before the deletion collects them, and one
    that comes after skips the deleted subscription."""
    with transaction.atomic():
        subscription = Subscription.objects.select_for_update().filter(pk=subscription_id, user=user).first()
        if subscription is None:
            raise NotFound()
        subscription.delete()


def retry_deliveries(*, delivery_ids) -> int:
    """Operators (the admin): make failed deliveries due again now, with a fresh count of attempts.
    Returns how many were failed and are pending again."""
    from django.utils import timezone

    from apps.notifications.models import Delivery, DeliveryStatus

    return Delivery.objects.filter(pk__in=list(delivery_ids), status=DeliveryStatus.FAILED).update(
        status=DeliveryStatus.PENDING, attempts=0, next_attempt_at=timezone.now(), lease_owner="", lease_until=None
    )
