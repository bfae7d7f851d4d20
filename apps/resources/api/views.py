from decimal import Decimal, InvalidOperation

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import APIException, NotFound, ValidationError
from rest_framework.generics import get_object_or_404
from rest_framework.permissions import AllowAny
from rest_framework.response import Response

from apps.accounts.lockout import client_ip
from apps.backends.readiness import user_readiness
from apps.core.api.permissions import WRITE_ACTIONS, StaffWithModelPermissionOrReadOnly, model_permission
from apps.resources import selectors, services
from apps.resources.api.filters import ResourceClassFilter, ResourcePoolFilter
from apps.resources.api.serializers import (
    AccessibilitySerializer,
    LaunchSpecSerializer,
    ResourceClassSerializer,
    ResourcePoolSerializer,
)
from apps.resources.models import ResourceClass, ResourcePool

MATCH_PARAMS = [
    OpenApiParameter(dim, OpenApiTypes.NUMBER, description=f"Mark classes whose {dim} is at least this.")
    for dim in ("cpu", "memory", "gpu")
]


def wanted_resources(request) -> dict:
    wanted = {}
    for dim in ("cpu", "memory", "gpu"):
        raw = request.query_params.get(dim)
        if raw in (None, ""):
            continue
        try:
            value = Decimal(raw)
        except InvalidOperation:
            raise ValidationError({dim: [f"'{raw}' is not a number."]}) from None
        if not value.is_finite() or value < 0:
            raise ValidationError({dim: ["Must be a number of at least 0."]})
        wanted[dim] = value
    return wanted


@extend_schema_view(list=extend_schema(parameters=MATCH_PARAMS), retrieve=extend_schema(parameters=MATCH_PARAMS))
class ResourcePoolViewSet(viewsets.ModelViewSet):
    """Resource pools with their classes. Reads: pools you may use (R-POOL-8). Writes: staff."""

    serializer_class = ResourcePoolSerializer
    permission_classes = [StaffWithModelPermissionOrReadOnly]
    filterset_class = ResourcePoolFilter

    def get_queryset(self):
        return selectors.visible_pools(self.request.user)

    def get_serializer_context(self):
        context = super().get_serializer_context()
        if self.request is not None and self.request.method == "GET":
            context["wanted"] = wanted_resources(self.request)
        return context

    def get_serializer(self, *args, **kwargs):
        """Pools read with the requesting user's readiness (``usable``), computed once for the
        page (:func:`apps.backends.readiness.user_readiness`: constant queries per list)."""
        if args and "data" not in kwargs and self.request is not None and self.request.user.is_authenticated:
            objects = list(args[0]) if kwargs.get("many") else [args[0]]
            kwargs.setdefault("context", self.get_serializer_context())
            kwargs["context"]["readiness"] = user_readiness(self.request.user, objects)
        return super().get_serializer(*args, **kwargs)

    def get_permissions(self):
        if self.action == "accessible" and self.request.method == "GET":
            return [AllowAny()]
        return super().get_permissions()

    def perform_authentication(self, request):
        # R-SESS-5: external schedulers read accessibility without credentials; a stale or
        # foreign token header must not turn that into a 401 (the action reads the caller lazily).
        if self.action == "accessible" and request.method == "GET":
            return
        super().perform_authentication(request)

    def write_permissions(self, request) -> list[str]:
        """A class created under a pool is a class write; a pool write that edits classes inline
        needs the class permissions too (the admin's inline asks the same); accessibility is a
        pool change."""
        if self.action == "classes":
            return [model_permission(ResourceClass, "add")]
        wanted = [model_permission(ResourcePool, WRITE_ACTIONS.get(request.method, "change"))]
        if isinstance(request.data, dict) and request.data.get("classes"):
            wanted += [model_permission(ResourceClass, "add"), model_permission(ResourceClass, "change")]
        return wanted

    @extend_schema(request=AccessibilitySerializer, responses=AccessibilitySerializer, auth=[])
    @action(detail=True, methods=["get", "put"], url_path="accessible")
    def accessible(self, request, pk=None):
        """R-SESS-5: ``{"is_accessible", "message"}`` for external schedulers (GET needs no login)."""
        # External schedulers read it without credentials; a private pool's only its users and
        # the load sensors' networks may (R-POOL-8, ``may_read_status``): others get a 404.
        pool = get_object_or_404(ResourcePool.objects.all(), pk=pk)
        if request.method == "GET" and not selectors.may_read_status(
            pool, user=optional_user(request), address=client_ip(request)
        ):
            raise NotFound(f"No pool {pk}.")
        if request.method == "PUT":
            body = AccessibilitySerializer(data=request.data)
            body.is_valid(raise_exception=True)
            pool.is_accessible = body.validated_data["is_accessible"]
            pool.accessibility_message = body.validated_data.get("message", "")
            pool.save(update_fields=["is_accessible", "accessibility_message", "updated_at"])
        return Response({"is_accessible": pool.is_accessible, "message": pool.accessibility_message})

    @extend_schema(methods=["GET"], responses=ResourceClassSerializer(many=True), parameters=MATCH_PARAMS)
    @extend_schema(methods=["POST"], request=ResourceClassSerializer, responses={201: ResourceClassSerializer})
    @action(detail=True, methods=["get", "post"], url_path="classes", filterset_class=None, pagination_class=None)
    def classes(self, request, pk=None):
        pool = self.get_object()
        if request.method == "POST":
            serializer = ResourceClassSerializer(data=request.data, context={"pool": pool, "request": request})
            serializer.is_valid(raise_exception=True)
            serializer.save()
            return Response(serializer.data, status=status.HTTP_201_CREATED)
        context = {"request": request, "wanted": wanted_resources(request)}
        return Response(ResourceClassSerializer(pool.classes.all(), many=True, context=context).data)


@extend_schema_view(list=extend_schema(parameters=MATCH_PARAMS))
class ResourceClassViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.UpdateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Classes of the pools you may use; create them under ``/resource-pools/{id}/classes/``."""

    serializer_class = ResourceClassSerializer
    permission_classes = [StaffWithModelPermissionOrReadOnly]
    filterset_class = ResourceClassFilter

    def get_queryset(self):
        return selectors.visible_classes(self.request.user).order_by("pool__name", "name", "id")

    def get_serializer_context(self):
        context = super().get_serializer_context()
        if self.request is not None and self.request.method == "GET":
            context["wanted"] = wanted_resources(self.request)
        return context

    def perform_destroy(self, instance):
        services.delete_class(instance)

    @extend_schema(responses=LaunchSpecSerializer)
    @action(detail=True, methods=["get"], url_path="launch-spec")
    def launch_spec(self, request, pk=None):
        """R-LAUNCH: resources, environment and batch directives a launch of this class uses."""
        return Response(LaunchSpecSerializer.for_class(self.get_object()).data)


def optional_user(request):
    """The caller when its credentials hold; a stale or foreign header is anonymous here, never a
    401 (R-SESS-5: schedulers read accessibility without logging in)."""
    try:
        return request.user
    except APIException:  # an authenticator's refusal (AuthenticationFailed, MUNGE unavailable)
        return None
