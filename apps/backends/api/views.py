import logging

from django.conf import settings
from django.core.cache import cache
from drf_spectacular.utils import extend_schema
from rest_framework.generics import get_object_or_404
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.backends import registry
from apps.backends.api.serializers import BackendSerializer, LaunchOptionsSerializer
from apps.backends.base import LaunchOptions
from apps.backends.remote_common import scrub_for_pool
from apps.resources.selectors import visible_classes

logger = logging.getLogger(__name__)


class BackendListView(APIView):
    """Registered execution backends and the pool kinds each serves."""

    @extend_schema(responses=BackendSerializer(many=True))
    def get(self, request):
        return Response(registry.describe())


def launch_options_for(resource_class) -> dict:
    """R-BACK-2: ask the backend (not on every page load: healthy answers are cached 10 min).

    A degraded answer (provider unreachable) is never cached, so the next opening of the form
    asks again instead of showing stale defaults for ten minutes.
    """
    pool = resource_class.pool
    try:
        name = registry.backend_name_for_kind(pool.kind)
    except registry.NoBackend as exc:
        return {"backend": None, "options": [], "degraded": False, "message": str(exc)}
    key = f"gridgate:launch-options:{name}:{pool.pk}:{pool.updated_at.timestamp() if pool.updated_at else 0}"
    cached = cache.get(key)
    if cached is not None:
        return cached
    try:
        answer = registry.get_backend(name).launch_options(pool)
    except Exception as exc:  # whatever the provider raised, the form still opens with defaults
        text = scrub_for_pool(pool, exc)  # R-BACK-1: an SDK may echo a credential back
        logger.warning("launch options of the %s backend: %s", name, text)
        answer = LaunchOptions(degraded=True, message=f"the {name} backend could not be asked: {text}")
    answer.message = scrub_for_pool(pool, answer.message)
    body = {"backend": name, **answer.as_dict()}
    if not answer.degraded:
        cache.set(key, body, settings.GRIDGATE_LAUNCH_OPTIONS_CACHE_SECONDS)
    return body


class LaunchOptionsView(APIView):
    """What a user may choose when launching a case on this class (R-BACK-2)."""

    @extend_schema(responses=LaunchOptionsSerializer)
    def get(self, request, pk: int):
        resource_class = get_object_or_404(visible_classes(request.user), pk=pk)
        return Response(launch_options_for(resource_class))
