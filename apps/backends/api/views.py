from django.http import Http404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.generics import get_object_or_404
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.backends import registry
from apps.backends.api.serializers import (
    BackendSerializer,
    ConnectionCredentialSerializer,
    ConnectionSerializer,
    DisconnectedSerializer,
    LaunchOptionsSerializer,
)
from apps.backends.services import launch_options_for
from apps.credentials import services as credential_services
from apps.resources.selectors import visible_classes


class BackendListView(APIView):
    """Registered execution backends and the pool kinds each serves."""

    @extend_schema(responses=BackendSerializer(many=True))
    def get(self, request):
        return Response(registry.describe())


class LaunchOptionsView(APIView):
    """What a user may choose when launching a case on this class (R-BACK-2)."""

    @extend_schema(responses=LaunchOptionsSerializer)
    def get(self, request, pk: int):
        resource_class = get_object_or_404(visible_classes(request.user), pk=pk)
        return Response(launch_options_for(resource_class, request.user))


def _rows(request):
    page = credential_services.connect_page()
    return [dict(row, connect_url=page) for row in credential_services.connection_rows(request.user)]


class ConnectionListView(APIView):
    """Your connections (docs/backends.md, "Per-user credentials"): every pool you may use that runs
    cases under each user's own credentials, with your connection's state. Connecting is a browser
    flow (``connect_url``); no response ever carries a credential."""

    @extend_schema(responses=ConnectionSerializer(many=True))
    def get(self, request):
        return Response(ConnectionSerializer(_rows(request), many=True).data)


class ConnectionDetailView(APIView):
    """Your connection to one pool (by the pool's id); DELETE forgets it (your own alone)."""

    def _row(self, request, pool: int):
        for row in _rows(request):
            if row["pool"].pk == pool:
                return row
        raise Http404("No pool that takes your own credentials has this id.")

    @extend_schema(responses=ConnectionSerializer)
    def get(self, request, pool: int):
        return Response(ConnectionSerializer(self._row(request, pool)).data)

    @extend_schema(
        request=ConnectionCredentialSerializer,
        responses={
            200: ConnectionSerializer,
            400: OpenApiResponse(description="Refused by the provider, or the wrong fields for the pool's kind."),
            503: OpenApiResponse(description="The provider could not be asked."),
        },
    )
    def put(self, request, pool: int):
        """Keep your Qarnot API token or Run:AI access key for this pool, once the provider accepted it."""
        body = ConnectionCredentialSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        self._row(request, pool)  # a 404 for a pool that takes no credential of yours
        credential_services.store_pasted(user=request.user, pool_id=pool, values=body.validated_data)
        return Response(ConnectionSerializer(self._row(request, pool)).data)

    @extend_schema(
        responses={200: DisconnectedSerializer, 404: OpenApiResponse(description="No connection.")},
    )
    def delete(self, request, pool: int):
        forgotten = credential_services.disconnect(user=request.user, pool_id=pool)
        return Response(DisconnectedSerializer(forgotten).data)
