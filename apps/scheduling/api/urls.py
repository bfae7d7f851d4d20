from django.urls import path
from rest_framework.routers import SimpleRouter

from apps.scheduling.api.views import DeviceViewSet, JobViewSet, PoolSharesView, SessionJobsView

router = SimpleRouter()
router.register("devices", DeviceViewSet, basename="device")
router.register("jobs", JobViewSet, basename="job")

urlpatterns = [
    path("sessions/<uuid:pk>/jobs/", SessionJobsView.as_view(), name="session-jobs"),
    path("resource-pools/<int:pk>/shares/", PoolSharesView.as_view(), name="pool-shares"),
    *router.urls,
]
