from django.contrib.auth import get_user_model
from django.utils import timezone
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.generics import get_object_or_404
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.allocations.selectors import remaining_by_id
from apps.core.api.permissions import IsStaff
from apps.core.exceptions import Forbidden
from apps.core.idempotency import idempotent
from apps.reservations.selectors import revocation_notices
from apps.resources.models import ResourcePool
from apps.resources.selectors import visible_classes
from apps.scheduling import selectors
from apps.sessions import services
from apps.sessions.api.filters import SessionFilter
from apps.sessions.api.serializers import SessionCreateSerializer, SessionSerializer, SlotsSerializer
from apps.sessions.models import Session, is_service_principal
from apps.sessions.selectors import slots_usage

CONFLICT = OpenApiResponse(description="No capacity (with slots_available) or a different session for the id.")


def allocation_remaining(sessions) -> dict:
    """R-ALLOC-1: what is left of each session's allocation (one query, none when no session
    spends one)."""
    return remaining_by_id({session.allocation_id for session in sessions}, timezone.now())


class SessionViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet
):
    """Sessions: claims on a pool's capacity. Own sessions; staff and service principals see all."""

    serializer_class = SessionSerializer
    filterset_class = SessionFilter

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation: no real user
            return Session.objects.none()
        return (
            Session.objects.visible_to(self.request.user).select_related("user", "pool").order_by("-created_at", "id")
        )

    def get_serializer(self, *args, **kwargs):
        """Lists and reads say when each waiting session's next job starts (constant queries:
        ``selectors.session_waits``), and a session past a deadline reads as ended even before
        the sweep (R-SESS-7: ``services.settle_due``)."""
        if args and self.action in ("list", "retrieve"):
            objects = services.settle_due(args[0] if isinstance(args[0], (list, tuple)) else [args[0]])
            kwargs.setdefault("context", self.get_serializer_context())
            kwargs["context"]["session_waits"] = selectors.session_waits(objects)
            kwargs["context"]["revocation_notices"] = revocation_notices(objects)
            kwargs["context"]["allocation_remaining"] = allocation_remaining(objects)
        return super().get_serializer(*args, **kwargs)

    def paginate_queryset(self, queryset):
        page = super().paginate_queryset(queryset)
        return list(page) if page is not None else None

    def get_permissions(self):
        if self.action == "revoke":
            return [IsStaff()]
        return super().get_permissions()

    @extend_schema(
        request=SessionCreateSerializer,
        responses={201: SessionSerializer, 200: SessionSerializer, 409: CONFLICT, 403: OpenApiResponse()},
    )
    def create(self, request, *args, **kwargs):
        """R-SESS-1/2: 201 new session, 200 the same active one for this external id, 409 no room."""
        return idempotent(request, lambda: self._create(request))

    def _create(self, request):
        body = SessionCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        caller = request.user
        target = caller
        if data.get("user") and data["user"] != caller.get_username():
            # Checked before the lookup, so that nobody but a principal can probe usernames.
            if not is_service_principal(caller):
                raise PermissionDenied("Only service principals (act_on_behalf) may open sessions for another user.")
            target = get_user_model().objects.filter(username=data["user"]).first()
            if target is None:
                raise ValidationError({"user": [f"No user named '{data['user']}'."]})
        # The class must be usable by the session's user: a service principal opens sessions for
        # granted users on pools it need not see itself (docs/architecture.md, "Who may do what").
        # admit() checks it in its class lookup; the reasons for a miss are looked up after.
        try:
            admission = services.admit(
                user=target,
                resource_class=services.UsableClass(pk=data["resource_class"]),
                slots=data["slots"],
                external_id=data["external_id"],
                allocation=data.get("allocation"),
            )
        except services.NoSuchClass:
            seen = visible_classes(caller).filter(pk=data["resource_class"]).first() if target != caller else None
            if seen is not None:  # the principal sees it, the user may not use it
                raise PermissionDenied(f"User '{target.username}' may not use pool '{seen.pool.name}'.") from None
            raise ValidationError(
                {"resource_class": [f"No class {data['resource_class']} that you can use."]}
            ) from None
        context = {"allocation_remaining": allocation_remaining([admission.session])}
        return Response(
            SessionSerializer(admission.session, context=context).data,
            status=status.HTTP_201_CREATED if admission.created else status.HTTP_200_OK,
        )

    def destroy(self, request, *args, **kwargs):
        """R-SESS-4: release (owner, service principal, staff). Idempotent: always 204."""
        try:
            services.release(user=request.user, session_id=kwargs["pk"])
        except Forbidden:
            raise NotFound() from None  # other users' sessions do not exist for the caller
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=None, responses=SessionSerializer)
    @action(detail=True, methods=["post"])
    def revoke(self, request, pk=None):
        """R-SESS-4: staff revocation (reason ``manual``); frees the slots at once."""
        session = self.get_object()
        services.revoke(session_ids=[session.pk])
        session.refresh_from_db()
        return Response(SessionSerializer(session).data)


class PoolSlotsView(APIView):
    """R-SESS-6: slot usage of a pool, for external load sensors and licence sync."""

    @extend_schema(responses={200: SlotsSerializer, 404: OpenApiResponse(description="No slots_total.")})
    def get(self, request, pk):
        pool = get_object_or_404(ResourcePool.objects.visible_to(request.user).select_related("usage"), pk=pk)
        if pool.slots_total is None:
            return Response(
                {"detail": f"Pool '{pool.name}' has no slot capacity (slots_total is not set)."},
                status=status.HTTP_404_NOT_FOUND,
            )
        return Response(slots_usage(pool))
