from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.allocations.models import INFINITY, Allocation


class AllocationRemainingSerializer(serializers.Serializer):
    """What is left of an allocation now (R-ALLOC-1); a null figure is not limited."""

    allocation = serializers.IntegerField()
    name = serializers.CharField()
    device_seconds = serializers.FloatField(allow_null=True, help_text="Device seconds left (negative: overdrawn).")
    core_hours = serializers.FloatField(allow_null=True, help_text="Case core-hours left (negative: overdrawn).")
    period_end = serializers.DateTimeField(allow_null=True, help_text="When the period ends (null: outside it).")


class AllocationFiguresSerializer(serializers.Serializer):
    """Device seconds and case core-hours (null: not limited)."""

    device_seconds = serializers.FloatField(allow_null=True)
    core_hours = serializers.FloatField(allow_null=True)


def _finite(value):
    return None if value is None or value == INFINITY else value


class AllocationSerializer(serializers.ModelSerializer):
    """An allocation with its grant, what its project used this period, and what is left."""

    pool = serializers.SlugRelatedField(slug_field="name", read_only=True)
    user = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    group = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True)
    granted = serializers.SerializerMethodField()
    used = serializers.SerializerMethodField()
    remaining = serializers.SerializerMethodField()
    period_start = serializers.SerializerMethodField()
    period_end = serializers.SerializerMethodField()

    class Meta:
        model = Allocation
        fields = [
            "id",
            "name",
            "pool",
            "user",
            "group",
            "period",
            "starts_at",
            "ends_at",
            "window_days",
            "period_start",
            "period_end",
            "granted",
            "used",
            "remaining",
        ]
        read_only_fields = fields

    def _now(self):
        return self.context["now"]

    def _period(self, allocation):
        return allocation.period_at(self._now())

    @extend_schema_field(AllocationFiguresSerializer)
    def get_granted(self, allocation) -> dict:
        return {"device_seconds": allocation.device_seconds, "core_hours": allocation.core_hours}

    @extend_schema_field(AllocationFiguresSerializer)
    def get_used(self, allocation) -> dict:
        device, cores = allocation.used_in(self._period(allocation))
        return {"device_seconds": round(device, 3), "core_hours": round(cores, 6)}

    @extend_schema_field(AllocationFiguresSerializer)
    def get_remaining(self, allocation) -> dict:
        device, cores = allocation.remaining_at(self._now())
        return {"device_seconds": _finite(device), "core_hours": _finite(cores)}

    @extend_schema_field(OpenApiTypes.DATETIME)
    def get_period_start(self, allocation):
        period = self._period(allocation)
        return serializers.DateTimeField().to_representation(period[0]) if period else None

    @extend_schema_field(OpenApiTypes.DATETIME)
    def get_period_end(self, allocation):
        period = self._period(allocation)
        return serializers.DateTimeField().to_representation(period[1]) if period else None
