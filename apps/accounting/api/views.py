from datetime import UTC, timedelta

from django.utils import timezone
from django.utils.dateparse import parse_datetime
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounting.selectors import EARLIEST, LATEST, usage
from apps.core.api.params import moment_text
from apps.core.api.permissions import IsStaff


class UsageRowSerializer(serializers.Serializer):
    user = serializers.CharField()
    pool = serializers.CharField()
    sessions = serializers.IntegerField()
    session_slot_hours = serializers.FloatField()
    jobs = serializers.DictField(child=serializers.IntegerField(), help_text="Jobs created in the period, by status.")
    device_seconds = serializers.FloatField()
    wait_mean_seconds = serializers.FloatField(allow_null=True)
    wait_p95_seconds = serializers.FloatField(allow_null=True)
    cases = serializers.DictField(child=serializers.IntegerField(), help_text="Cases created in the period, by status.")
    case_execution_seconds = serializers.FloatField()


class AccountingSerializer(serializers.Serializer):
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()
    rows = UsageRowSerializer(many=True)


def _moment(request, name, default):
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return default
    try:
        value = parse_datetime(moment_text(raw))  # also accepts a bare date; raises on impossible dates
    except ValueError:
        value = None
    if value is None:
        raise ValidationError({name: ["Use an ISO 8601 date-time, e.g. 2026-11-01T00:00:00Z."]})
    try:
        value = value if timezone.is_aware(value) else value.replace(tzinfo=UTC)
        in_range = EARLIEST <= value <= LATEST
    except OverflowError:  # an offset that pushes the moment past datetime's range
        in_range = False
    if not in_range:
        raise ValidationError({name: [f"Must be between {EARLIEST:%Y-%m-%d} and {LATEST:%Y-%m-%d}."]})
    return value


class AccountingView(APIView):
    """Usage per user and pool over a period (staff): session slot-hours, jobs by status, device
    time, mean and p95 wait before dispatch, cases by status and their execution time."""

    permission_classes = [IsStaff]

    @extend_schema(
        parameters=[
            OpenApiParameter("since", OpenApiTypes.DATETIME, description="Start (default: 30 days ago)."),
            OpenApiParameter("until", OpenApiTypes.DATETIME, description="End (default: now)."),
            OpenApiParameter("pool", OpenApiTypes.INT),
            OpenApiParameter("user", OpenApiTypes.STR, description="Username."),
        ],
        responses=AccountingSerializer,
    )
    def get(self, request):
        until = _moment(request, "until", timezone.now())
        since = _moment(request, "since", until - timedelta(days=30))
        if since >= until:
            raise ValidationError({"since": ["Must be before until."]})
        pool = request.query_params.get("pool")
        if pool not in (None, "") and not (pool.isascii() and pool.isdigit()):  # "²".isdigit(); int("²") raises
            raise ValidationError({"pool": ["A pool id."]})
        rows = usage(since, until, pool_id=int(pool) if pool else None, username=request.query_params.get("user"))
        return Response(AccountingSerializer({"since": since, "until": until, "rows": rows}).data)
