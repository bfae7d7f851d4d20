from django.urls import path
from rest_framework.routers import DefaultRouter

from apps.allocations.api.usage import UsageExportView
from apps.allocations.api.views import AllocationViewSet

app_name = "allocations"

router = DefaultRouter()
router.register("allocations", AllocationViewSet, basename="allocation")

urlpatterns = [path("accounting/usage/", UsageExportView.as_view(), name="usage-export"), *router.urls]
