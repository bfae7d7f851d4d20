from rest_framework.routers import DefaultRouter

from apps.allocations.api.views import AllocationViewSet

app_name = "allocations"

router = DefaultRouter()
router.register("allocations", AllocationViewSet, basename="allocation")

urlpatterns = router.urls
