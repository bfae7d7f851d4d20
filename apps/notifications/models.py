"""Notifications (R-NOTE-1): what each user asked to hear about, and the outbox of what to tell them.

A :class:`Subscription` is one user's choice for one event: e-mail (to the address of their own
account) or a signed webhook (to a URL they set, checked by the outbound rules). Each event
occurrence becomes one :class:`Delivery` row per matching subscription, inserted by the producer in
the transaction of the state change it reports (``apps.notifications.outbox``); its unique key
(subscription, event, subject) makes a second insert of the same occurrence a no-op. The delivery
pass (``apps.notifications.passes``) sends them, retries with back-off, and writes each attempt
to :class:`DeliveryAttempt`, the log the user sees.
"""

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _


class Event(models.TextChoices):
    JOB_FINISHED = "job.finished", "Job finished"
    JOB_FAILED = "job.failed", "Job failed"
    CASE_FINISHED = "case.finished", "Case finished"
    CASE_FAILED = "case.failed", "Case failed"
    SESSION_EXPIRING = "session.expiring", "Session expiring soon"
    #: emitted by the allocations (R-ALLOC-1) once they land, through ``services.notify``
    ALLOCATION_80 = "allocation.80", "Allocation at 80 %"
    ALLOCATION_100 = "allocation.100", "Allocation at 100 %"
    RESERVATION_STARTING = "reservation.starting", "Reservation starting"


class Channel(models.TextChoices):
    EMAIL = "email", "E-mail"
    WEBHOOK = "webhook", "Webhook"


#: the refusal of a second identical subscription: the constraint's (a form, full_clean) and the
#: service's when a concurrent request won the race (IntegrityError)
ALREADY_SUBSCRIBED = _("You already have this subscription.")


class Subscription(models.Model):
    """One user's choice: tell me about ``event`` by ``channel``. A webhook's secret is kept sealed
    (``apps.credentials.sealing``) and shown once, when the subscription is created."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notification_subscriptions", db_index=False
    )  # no index of its own: notifications_subscription_once leads with it
    event = models.CharField(max_length=32, choices=Event.choices)
    channel = models.CharField(max_length=8, choices=Channel.choices)
    url = models.CharField(
        max_length=2000, blank=True, default="", help_text="The webhook's URL (https; empty for e-mail)."
    )
    secret_sealed = models.TextField(blank=True, default="", editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["event", "channel", "id"]
        constraints = [
            # Also the index of the outbox's INSERT … SELECT (user, event).
            models.UniqueConstraint(
                fields=["user", "event", "channel", "url"],
                name="notifications_subscription_once",
                violation_error_message=ALREADY_SUBSCRIBED,
            ),
            models.CheckConstraint(
                condition=(Q(channel="email") & Q(url="")) | (Q(channel="webhook") & ~Q(url="")),
                name="notifications_subscription_url_iff_webhook",
                violation_error_message=_("A webhook needs a URL; e-mail takes none."),
            ),
        ]

    def __str__(self):
        return f"{self.user} · {self.event} · {self.url or self.channel}"

    def clean(self):
        from apps.core import outbound

        if self.channel == Channel.EMAIL:
            if self.url:
                raise ValidationError({"url": _("E-mail goes to your account's address: leave the URL empty.")})
            if self.user_id and not self.user.email:
                raise ValidationError({"channel": _("Your account has no e-mail address to send to.")})
        elif self.channel == Channel.WEBHOOK:
            if not self.url:
                raise ValidationError({"url": _("A webhook needs a URL.")})
            try:
                outbound.resolve(self.url)  # R-NOTE-1: the outbound rules, at subscription time too
            except outbound.OutboundRefused as exc:
                raise ValidationError({"url": str(exc)}) from None


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    DELIVERED = "delivered", "Delivered"
    FAILED = "failed", "Failed"


class Delivery(models.Model):
    """The outbox: one event occurrence for one subscription, sent by the delivery pass.

    ``subject`` names the occurrence (``job:42``, ``session:<uuid>``, an allocation's period):
    with the subscription and the event it is the key that makes a producer running twice insert
    it once. ``id`` reaches receivers as ``X-Gridgate-Delivery``, for them to drop a repeat (a
    worker killed between the call and its record sends it again)."""

    subscription = models.ForeignKey(Subscription, on_delete=models.CASCADE, related_name="deliveries")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notification_deliveries", db_index=False
    )  # notifications_delivery_user_created leads with it
    event = models.CharField(max_length=32, choices=Event.choices)
    subject = models.CharField(max_length=100)
    payload = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    lease_owner = models.CharField(max_length=100, blank=True, default="")
    lease_until = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField()
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "deliveries"
        constraints = [
            models.UniqueConstraint(fields=["subscription", "event", "subject"], name="notifications_delivery_once"),
        ]
        indexes = [
            # The delivery pass's claim: pending rows by due time (only pending rows are indexed).
            models.Index(
                fields=["next_attempt_at", "id"], condition=Q(status="pending"), name="notifications_delivery_due"
            ),
            # A user's delivery log, newest first.
            models.Index(fields=["user", "-created_at", "-id"], name="notifications_delivery_user"),
            # The admin's log of everyone's deliveries in Meta.ordering (and the date hierarchy's
            # first and last): a page read from the index, not the whole log sorted at each view.
            models.Index(fields=["-created_at", "-id"], name="notifications_delivery_list"),
        ]

    def __str__(self):
        return f"{self.event} {self.subject} → {self.subscription_id} ({self.status})"


class DeliveryAttempt(models.Model):
    """One try at a delivery: what the receiver (or the mail server) answered."""

    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="log")
    at = models.DateTimeField()
    ok = models.BooleanField(default=False)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.CharField(max_length=500, blank=True, default="")

    class Meta:
        ordering = ["delivery", "at", "id"]

    def __str__(self):
        outcome = "ok" if self.ok else self.error or self.status_code
        return f"{self.delivery_id} at {self.at:%Y-%m-%d %H:%M:%S}: {outcome}"
