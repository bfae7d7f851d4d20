from django.db.models import Prefetch
from django_filters import rest_framework as filters
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.response import Response

from apps.core.api.schema import ErrorSerializer
from apps.notifications import services
from apps.notifications.api.serializers import (
    DeliverySerializer,
    SubscriptionCreatedSerializer,
    SubscriptionCreateSerializer,
    SubscriptionSerializer,
)
from apps.notifications.models import Delivery, DeliveryAttempt, DeliveryStatus, Event, Subscription

ID = OpenApiParameter("id", int, OpenApiParameter.PATH, description="The subscription's `id` in the list.")


@extend_schema_view(
    list=extend_schema(summary="Your notification subscriptions", responses=SubscriptionSerializer),
    retrieve=extend_schema(summary="One of your subscriptions", parameters=[ID]),
    create=extend_schema(
        summary="Subscribe to an event by e-mail or webhook",
        request=SubscriptionCreateSerializer,
        responses={
            201: SubscriptionCreatedSerializer,
            400: OpenApiResponse(
                ErrorSerializer,
                description="A URL the outbound rules refuse (not https, a private or loopback address, "
                "unresolvable), a URL for e-mail, or e-mail without an address on your account.",
            ),
            409: OpenApiResponse(
                ErrorSerializer, description="You already have this subscription, or as many as the site allows."
            ),
            503: OpenApiResponse(ErrorSerializer, description="Webhooks: no key to seal the secret is configured."),
        },
    ),
    destroy=extend_schema(
        summary="Unsubscribe (its pending deliveries are dropped)",
        parameters=[ID],
        responses={204: None, 404: OpenApiResponse(ErrorSerializer, description="No subscription of yours.")},
    ),
)
class SubscriptionViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet
):
    """R-NOTE-1: your own subscriptions, one per event and destination (staff see everyone's in the
    admin). A webhook's signing secret is in the creation's answer only."""

    serializer_class = SubscriptionSerializer
    lookup_value_regex = "[0-9]+"  # /notifications/deliveries/ is not a subscription's id

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation: no real user
            return Subscription.objects.none()
        return Subscription.objects.filter(user=self.request.user).order_by("event", "channel", "id")

    def create(self, request):
        body = SubscriptionCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        subscription, secret = services.create_subscription(
            user=request.user, event=data["event"], channel=data["channel"], url=data.get("url", "")
        )
        answer = SubscriptionCreatedSerializer(subscription, context={"secret": secret})
        return Response(answer.data, status=status.HTTP_201_CREATED)

    def destroy(self, request, pk=None):
        services.delete_subscription(user=request.user, subscription_id=int(pk))
        return Response(status=status.HTTP_204_NO_CONTENT)


class DeliveryFilter(filters.FilterSet):
    status = filters.ChoiceFilter(choices=DeliveryStatus.choices)
    event = filters.ChoiceFilter(choices=Event.choices)
    subscription = filters.NumberFilter(field_name="subscription_id")

    class Meta:
        model = Delivery
        fields = ["status", "event", "subscription"]


@extend_schema_view(
    list=extend_schema(summary="Your notifications' delivery log, newest first"),
    retrieve=extend_schema(
        summary="One delivery and its attempts",
        parameters=[OpenApiParameter("id", int, OpenApiParameter.PATH, description="The delivery's `id`.")],
    ),
)
class DeliveryViewSet(viewsets.ReadOnlyModelViewSet):
    """R-NOTE-1: what was sent to your subscriptions, each attempt with the receiver's answer."""

    serializer_class = DeliverySerializer
    filterset_class = DeliveryFilter
    lookup_value_regex = "[0-9]+"

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation: no real user
            return Delivery.objects.none()
        return (
            Delivery.objects.filter(user=self.request.user)
            .select_related("subscription")
            .prefetch_related(Prefetch("log", queryset=DeliveryAttempt.objects.order_by("at", "id")))
            .order_by("-created_at", "-id")
        )
