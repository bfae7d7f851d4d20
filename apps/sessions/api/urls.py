from django.urls import path
from rest_framework.routers import SimpleRouter

from apps.sessions.api.views import PoolSlotsView, SessionViewSet

router = SimpleRouter()
router.register("sessions", SessionViewSet, basename="session")

urlpatterns = [
    path("resource-pools/<int:pk>/slots/", PoolSlotsView.as_view(), name="resourcepool-slots"),
    *router.urls,
]
