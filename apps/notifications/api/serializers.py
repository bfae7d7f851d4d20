from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.notifications.models import Channel, Delivery, DeliveryAttempt, Event, Subscription


class SubscriptionSerializer(serializers.ModelSerializer):
    """One of your subscriptions; a webhook's secret is never in it (only in the creation's answer)."""

    class Meta:
        model = Subscription
        fields = ["id", "event", "channel", "url", "created_at"]
        read_only_fields = fields


class SubscriptionCreateSerializer(serializers.Serializer):
    event = serializers.ChoiceField(choices=Event.choices)
    channel = serializers.ChoiceField(choices=Channel.choices)
    url = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=2000,
        help_text="The webhook's URL (https, a public address); leave empty for e-mail.",
    )


class SubscriptionCreatedSerializer(SubscriptionSerializer):
    """A subscription just made, with its webhook's signing secret (``context["secret"]``): the
    only answer that ever holds it."""

    secret = serializers.SerializerMethodField()

    class Meta(SubscriptionSerializer.Meta):
        fields = [*SubscriptionSerializer.Meta.fields, "secret"]
        read_only_fields = fields

    @extend_schema_field(
        serializers.CharField(
            allow_null=True,
            help_text="The webhook's signing secret, shown this once: verify "
            "`X-Gridgate-Signature: sha256=<hex HMAC-SHA256 of the body>` with it. Null for e-mail, "
            "and for a URL you already subscribed (it keeps the secret shown then).",
        )
    )
    def get_secret(self, obj):
        return self.context.get("secret") or None


class DeliveryAttemptSerializer(serializers.ModelSerializer):
    class Meta:
        model = DeliveryAttempt
        fields = ["at", "ok", "status_code", "error"]
        read_only_fields = fields


class DeliverySerializer(serializers.ModelSerializer):
    """One notification sent (or being sent) to one of your subscriptions, with each attempt."""

    channel = serializers.CharField(source="subscription.channel", read_only=True)
    log = DeliveryAttemptSerializer(many=True, read_only=True)

    class Meta:
        model = Delivery
        fields = [
            "id",
            "subscription",
            "channel",
            "event",
            "subject",
            "payload",
            "status",
            "attempts",
            "next_attempt_at",
            "last_error",
            "created_at",
            "delivered_at",
            "log",
        ]
        read_only_fields = fields
