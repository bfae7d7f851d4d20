from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.utils import timezone
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.core.models import WorkerHeartbeat


class HealthView(APIView):
    """Database reachability and the age of the newest worker heartbeat. 503 if the DB is down."""

    permission_classes = [AllowAny]
    authentication_classes = []

    @extend_schema(
        responses=inline_serializer(
            "Health",
            {
                "status": serializers.CharField(),
                "database": serializers.CharField(),
                "worker": inline_serializer(
                    "WorkerHealth",
                    {
                        "alive": serializers.BooleanField(),
                        "last_heartbeat": serializers.DateTimeField(allow_null=True),
                    },
                ),
            },
        )
    )
    def get(self, request):
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
            last = WorkerHeartbeat.objects.order_by("-seen_at").values_list("seen_at", flat=True).first()
        except Exception:
            return Response(
                {
                    "status": "error",
                    "database": "unreachable",
                    "worker": {"alive": False, "last_heartbeat": None},
                },
                status=503,
            )
        stale = timedelta(seconds=settings.GRIDGATE_WORKER_STALE_SECONDS)
        alive = last is not None and timezone.now() - last < stale
        return Response(
            {
                "status": "ok" if alive else "degraded",
                "database": "ok",
                "worker": {"alive": alive, "last_heartbeat": last},
            }
        )
