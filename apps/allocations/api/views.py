import django_filters
from django.utils import timezone
from rest_framework import mixins, viewsets

from apps.allocations import selectors
from apps.allocations.api.serializers import AllocationSerializer
from apps.allocations.models import Allocation
from apps.resources.api.filters import visible_pools


class AllocationFilter(django_filters.FilterSet):
    pool = django_filters.ModelChoiceFilter(queryset=visible_pools)

    class Meta:
        model = Allocation
        fields = ["pool"]


class AllocationViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """R-ALLOC-1: your projects' allocations (staff: all) with granted, used, remaining and the
    current period. Read-only: operators grant them in the admin."""

    serializer_class = AllocationSerializer
    filterset_class = AllocationFilter

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation: no real user
            return Allocation.objects.none()
        return selectors.visible_to(self.request.user).order_by("pool_id", "name", "id")

    def get_serializer_context(self):
        return {**super().get_serializer_context(), "now": timezone.now()}
