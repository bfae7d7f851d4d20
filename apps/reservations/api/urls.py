from django.urls import path
from rest_framework.routers import DefaultRouter

from apps.reservations.api.views import ReservationViewSet, ScheduleFeedView, ScheduleView

app_name = "reservations"

router = DefaultRouter()
router.register("reservations", ReservationViewSet, basename="reservation")

urlpatterns = [
    path("resource-pools/<int:pk>/schedule/", ScheduleView.as_view(), name="schedule"),
    path("resource-pools/<int:pk>/schedule.ics", ScheduleFeedView.as_view(), name="schedule-ics"),
    *router.urls,
]
