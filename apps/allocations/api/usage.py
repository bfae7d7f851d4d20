from datetime import UTC, datetime

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounting.api.views import _moment
from apps.allocations.usage import GROUP_BY, PERIODS, as_csv, month_bounds, usage
from apps.core.api.permissions import IsStaff
from apps.core.csvfiles import write_csv


class UsageCsvRenderer(BaseRenderer):
    """``text/csv`` for the usage export (``?format=csv`` or ``Accept: text/csv``): the JSON's rows."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        if isinstance(data, dict) and "rows" in data:
            return as_csv(data["rows"]).encode(self.charset)
        # An error (400, 403): its detail as a one-column CSV.
        return as_csv_error(data).encode(self.charset)


def as_csv_error(data) -> str:
    return write_csv(["error"], [[str(data)]], for_spreadsheets=True)


class UsageExportRowSerializer(serializers.Serializer):
    period = serializers.CharField(help_text="2026-11 (month), or the first day of the week or the day.")
    group_by = serializers.CharField()
    key = serializers.CharField(help_text="The username, group name, project name or pool name ('' for none).")
    project_id = serializers.IntegerField(allow_null=True, help_text="group_by=project: the allocation's id.")
    device_seconds = serializers.FloatField()
    core_hours = serializers.FloatField()
    jobs = serializers.IntegerField()
    cases = serializers.IntegerField()


class UsageExportSerializer(serializers.Serializer):
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()
    group_by = serializers.CharField()
    period = serializers.CharField()
    rows = UsageExportRowSerializer(many=True)


class UsageExportView(APIView):
    """R-ACCT-1: usage per user, group, project or pool per period (staff), from the charge
    ledger: device seconds, core-hours, jobs and cases charged. JSON, or CSV with
    ``?format=csv`` or ``Accept: text/csv`` (the same rows)."""

    permission_classes = [IsStaff]
    renderer_classes = [JSONRenderer, UsageCsvRenderer]

    @extend_schema(
        parameters=[
            OpenApiParameter("group_by", OpenApiTypes.STR, enum=list(GROUP_BY), description="Default: user."),
            OpenApiParameter("period", OpenApiTypes.STR, enum=list(PERIODS), description="Default: month."),
            OpenApiParameter("month", OpenApiTypes.STR, description="One month, e.g. 2026-11 (else since/until)."),
            OpenApiParameter("since", OpenApiTypes.DATETIME, description="Start (default: this month's start)."),
            OpenApiParameter("until", OpenApiTypes.DATETIME, description="End, excluded (default: now)."),
        ],
        responses={(200, "application/json"): UsageExportSerializer, (200, "text/csv"): OpenApiTypes.STR},
    )
    def get(self, request):
        group_by = request.query_params.get("group_by") or "user"
        if group_by not in GROUP_BY:
            raise ValidationError({"group_by": [f"One of {', '.join(GROUP_BY)}."]})
        period = request.query_params.get("period") or "month"
        if period not in PERIODS:
            raise ValidationError({"period": [f"One of {', '.join(PERIODS)}."]})
        month = request.query_params.get("month")
        if month:
            try:
                since, until = month_bounds(month)
            except (ValueError, OverflowError):
                raise ValidationError({"month": ["A month as YYYY-MM, e.g. 2026-11."]}) from None
        else:
            now = timezone.now()
            until = _moment(request, "until", now)
            since = _moment(request, "since", datetime(now.year, now.month, 1, tzinfo=UTC))
            if since >= until:
                raise ValidationError({"since": ["Must be before until."]})
        rows = usage(since=since, until=until, group_by=group_by, period=period)
        data = {"since": since, "until": until, "group_by": group_by, "period": period, "rows": rows}
        response = Response(UsageExportSerializer(data).data)
        if request.accepted_renderer.format == "csv":
            response["Content-Disposition"] = f'attachment; filename="usage-{group_by}-{since:%Y-%m-%d}.csv"'
        return response
