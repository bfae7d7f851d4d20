from django.urls import path
from rest_framework.routers import SimpleRouter

from apps.scheduling.api.views import DeviceViewSet, JobViewSet, SessionJobsView

router = SimpleRouter()
router.register("devices", DeviceViewSet, basename="device")
router.register("jobs", JobViewSet, basename="job")

urlpatterns = [
    path("sessions/<uuid:pk>/jobs/", SessionJobsView.as_view(), name="session-jobs"),
    *router.urls,
]
