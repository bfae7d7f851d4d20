from django.contrib import admin, messages

from apps.core.admin_base import ModelAdmin
from apps.core.exceptions import NotFound
from apps.notifications import services
from apps.notifications.models import Delivery, DeliveryAttempt, Subscription


@admin.register(Subscription)
class SubscriptionAdmin(ModelAdmin):
    """Users' subscriptions. Users make their own (the secret is shown to them once); operators
    look and remove one (a receiver that misbehaves), never read a secret."""

    list_display = ["user", "event", "channel", "url", "created_at"]
    list_filter = ["event", "channel"]
    list_select_related = ["user"]
    search_fields = ["user__username", "url"]
    fields = ["user", "event", "channel", "url", "created_at"]
    readonly_fields = fields

    def has_add_permission(self, request):
        return False  # the API and the user page create them, with the secret shown to their owner

    def has_change_permission(self, request, obj=None):
        return False

    # Removed as the owner's own unsubscribe is (services.delete_subscription): its row locked
    # first, so a job's end enqueueing a delivery for it right now commits before the deletion
    # collects the deliveries. Django's plain delete collected them first and then waited for that
    # producer at the subscription's row: its delivery, committed meanwhile, still named the
    # deleted subscription, and the page's commit failed (a deferred foreign key: a 500).
    def delete_model(self, request, obj):
        self._unsubscribe([obj])

    def delete_queryset(self, request, queryset):
        self._unsubscribe(queryset.select_related("user").order_by("pk"))

    def _unsubscribe(self, subscriptions):
        for subscription in subscriptions:
            try:
                services.delete_subscription(user=subscription.user, subscription_id=subscription.pk)
            except NotFound:
                continue  # its owner removed it meanwhile


class DeliveryAttemptInline(admin.TabularInline):
    model = DeliveryAttempt
    fields = ["at", "ok", "status_code", "error"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Delivery)
class DeliveryAdmin(ModelAdmin):
    """The outbox and its log: what was sent, to whom, how each attempt went."""

    list_display = ["id", "user", "event", "subject", "channel", "status", "attempts", "next_attempt_at", "created_at"]
    list_filter = ["status", "event", "subscription__channel"]
    list_select_related = ["user", "subscription"]
    search_fields = ["user__username", "subject"]
    date_hierarchy = "created_at"
    fields = [
        "user",
        "subscription",
        "event",
        "subject",
        "payload",
        "status",
        "attempts",
        "next_attempt_at",
        "last_error",
        "lease_owner",
        "lease_until",
        "created_at",
        "delivered_at",
    ]
    readonly_fields = fields
    inlines = [DeliveryAttemptInline]
    actions = ["retry"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False  # the log is what happened: read-only

    def has_retry_permission(self, request):
        return request.user.has_perm("notifications.change_delivery")

    @admin.display(description="channel", ordering="subscription__channel")
    def channel(self, obj):
        return obj.subscription.channel

    @admin.action(description="Send the selected failed deliveries again", permissions=["retry"])
    def retry(self, request, queryset):
        ids = list(queryset.values_list("pk", flat=True))
        count = services.retry_deliveries(delivery_ids=ids)
        message = f"{count} delivery(ies) due again; {len(ids) - count} not failed, left as they are."
        self.message_user(request, message, messages.SUCCESS)
