from datetime import timedelta

from django.http import HttpResponse
from django.shortcuts import get_object_or_404
from django.utils import timezone
from django.utils.http import content_disposition_header
from django_filters import rest_framework as filters
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status, viewsets
from rest_framework.exceptions import AuthenticationFailed, ValidationError
from rest_framework.renderers import BaseRenderer
from rest_framework.response import Response
from rest_framework.reverse import reverse
from rest_framework.views import APIView

from apps.core.api.params import MomentFilter, moment_text
from apps.core.api.permissions import StaffWithModelPermissionOrReadOnly
from apps.core.api.renderers import JSONRenderer
from apps.reservations import feeds, selectors, services
from apps.reservations.api.serializers import ReservationSerializer, ScheduleSerializer
from apps.reservations.models import Reservation, WindowKind
from apps.resources.models import ResourcePool

DEFAULT_DAYS = 7
MAX_DAYS = 366
FEED_PAST_DAYS, FEED_DAYS = 7, 92


class ReservationFilter(filters.FilterSet):
    """The list runs oldest first; ``ends_after`` and ``starts_before`` keep the windows that reach
    into a range (``?ends_after=<now>``: those not over yet)."""

    pool = filters.NumberFilter(field_name="pool_id")
    kind = filters.ChoiceFilter(choices=WindowKind.choices)
    cancelled = filters.BooleanFilter(field_name="cancelled_at", lookup_expr="isnull", exclude=True)
    ends_after = MomentFilter(field_name="end", lookup_expr="gt", label="Windows that end after this moment.")
    starts_before = MomentFilter(field_name="start", lookup_expr="lt", label="Windows that start before this moment.")

    class Meta:
        model = Reservation
        fields = ["pool", "kind", "cancelled", "ends_after", "starts_before"]


class ReservationViewSet(viewsets.ModelViewSet):
    """The calendar's windows (R-RES-1/2). Staff with the model's permissions create, change and
    cancel them (DELETE cancels: the window is kept with ``cancelled_at``); holders see theirs,
    staff all; anyone else's are 404. ``GET /resource-pools/{id}/schedule/`` shows everyone the
    pools' schedules without naming holders."""

    serializer_class = ReservationSerializer
    permission_classes = [StaffWithModelPermissionOrReadOnly]
    filterset_class = ReservationFilter

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation: no real user
            return Reservation.objects.none()
        windows = Reservation.objects.select_related("pool", "created_by").prefetch_related("users", "groups")
        user = self.request.user
        if not user.is_staff:
            windows = windows.filter(pk__in=Reservation.objects.held_by(user).values("pk"))
        return windows.order_by("start", "id")

    def perform_destroy(self, instance):
        services.cancel_reservation(instance)

    @extend_schema(responses={204: None})
    def destroy(self, request, *args, **kwargs):
        """Cancel the window (kept, with ``cancelled_at``); idempotent."""
        super().destroy(request, *args, **kwargs)
        return Response(status=status.HTTP_204_NO_CONTENT)


def _range(request, *, past_days: int = 0, days: int = DEFAULT_DAYS):
    now = timezone.now()
    field = serializers.DateTimeField()
    bounds = {}
    for name, default in (("from", now - timedelta(days=past_days)), ("to", None)):
        raw = request.query_params.get(name)
        if raw in (None, ""):
            bounds[name] = default
            continue
        try:
            bounds[name] = field.to_internal_value(moment_text(raw))
        except serializers.ValidationError as exc:
            raise ValidationError({name: exc.detail}) from None
    try:
        start = bounds["from"]
        end = bounds["to"] or start + timedelta(days=days)
    except OverflowError:
        raise ValidationError({"from": ["Out of range."]}) from None
    if end <= start:
        raise ValidationError({"to": ["Must be after 'from'."]})
    if end - start > timedelta(days=MAX_DAYS):
        raise ValidationError({"to": [f"At most {MAX_DAYS} days after 'from'."]})
    return start, end


RANGE = [
    OpenApiParameter("from", OpenApiTypes.DATETIME, description="Start of the range (default: now)."),
    OpenApiParameter("to", OpenApiTypes.DATETIME, description=f"End of the range (default: {DEFAULT_DAYS} days on)."),
]


def _pool(request, pk) -> ResourcePool:
    return get_object_or_404(ResourcePool.objects.visible_to(request.user), pk=pk)


class ScheduleView(APIView):
    """R-RES-4: a pool's typed slots (``reservation``, ``maintenance``, ``open``) over a range,
    each with ``slots``, ``title`` and ``mine``; for whoever may see the pool (else 404)."""

    @extend_schema(parameters=RANGE, responses=ScheduleSerializer)
    def get(self, request, pk: int):
        pool = _pool(request, pk)
        start, end = _range(request)
        slots = selectors.schedule(pool, request.user, start, end)
        url = reverse("reservations:schedule-ics", kwargs={"pk": pool.pk}, request=request)
        body = {
            "pool": pool.pk,
            "from": start,
            "to": end,
            "slots": [slot.__dict__ for slot in slots],
            "ics_url": f"{url}?token={feeds.feed_token(request.user)}",
        }
        return Response(ScheduleSerializer(body).data)


class ICalendarRenderer(BaseRenderer):
    media_type = "text/calendar"
    format = "ics"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        return data if isinstance(data, bytes) else b""


class FeedTokenAuthentication:
    """``?token=<feed token>`` (``feeds.feed_token``): reads schedules, nothing else."""

    def authenticate(self, request):
        token = request.query_params.get("token")
        if not token:
            return None
        user = feeds.user_for_feed_token(token)
        if user is None:
            raise AuthenticationFailed("Invalid or revoked feed token: copy the feed URL from the schedule again.")
        return user, None

    def authenticate_header(self, request):
        return 'Token realm="api"'


class ScheduleFeedView(APIView):
    """R-RES-4: the same schedule as an iCalendar feed (``text/calendar``), from a week ago to
    three months on by default, readable with the personal feed token of ``ics_url`` (calendar
    applications send no header) or as any API request. Errors are JSON."""

    renderer_classes = [ICalendarRenderer, JSONRenderer]

    def get_authenticators(self):
        return [FeedTokenAuthentication(), *super().get_authenticators()]

    def handle_exception(self, exc):
        response = super().handle_exception(exc)
        self.request.accepted_renderer, self.request.accepted_media_type = JSONRenderer(), "application/json"
        return response

    @extend_schema(
        parameters=[
            *RANGE,
            OpenApiParameter("token", OpenApiTypes.STR, description="Your feed token (from the schedule's ics_url)."),
        ],
        responses={(200, "text/calendar"): OpenApiResponse(OpenApiTypes.STR, description="RFC 5545 calendar")},
    )
    def get(self, request, pk: int):
        pool = _pool(request, pk)
        start, end = _range(request, past_days=FEED_PAST_DAYS, days=FEED_PAST_DAYS + FEED_DAYS)
        now = timezone.now()
        body = feeds.ics(
            pool, selectors.schedule(pool, request.user, start, end), host=request.get_host(), generated=now
        )
        # The calendar as it is, whichever renderer was negotiated (errors are JSON, above).
        response = HttpResponse(body, content_type="text/calendar; charset=utf-8")
        response["Content-Disposition"] = content_disposition_header(False, feeds.filename(pool))
        return response
