from rest_framework.routers import SimpleRouter

from apps.notifications.api.views import DeliveryViewSet, SubscriptionViewSet

app_name = "notifications"

router = SimpleRouter()
# Deliveries first: their prefix is longer than the subscriptions' (whose ids are digits only).
router.register("notifications/deliveries", DeliveryViewSet, basename="delivery")
router.register("notifications", SubscriptionViewSet, basename="subscription")

urlpatterns = router.urls
