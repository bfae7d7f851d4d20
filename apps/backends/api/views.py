from drf_spectacular.utils import extend_schema
from rest_framework.generics import get_object_or_404
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.backends import registry
from apps.backends.api.serializers import BackendSerializer, LaunchOptionsSerializer
from apps.backends.services import launch_options_for
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
        return Response(launch_options_for(resource_class))
