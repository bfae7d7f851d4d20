from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.utils import timezone
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.core import cases_root
from apps.core.models import WorkerHeartbeat


class HealthView(APIView):
    """Database reachability, the age of the newest worker heartbeat and the cases root's free
    space. 503 if the DB is down; "degraded" while no worker beats or the cases root has less
    than GRIDGATE_CASES_MIN_FREE_MB free (new cases are refused then)."""

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
                "cases_root": inline_serializer(
                    "CasesRootHealth",
                    {
                        "free_bytes": serializers.IntegerField(allow_null=True),
                        "min_free_bytes": serializers.IntegerField(),
                        "low": serializers.BooleanField(),
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
        free = cases_root.free_bytes()
        low = free is None or cases_root.low_on_space(free)
        return Response(
            {
                "status": "ok" if alive and not low else "degraded",
                "database": "ok",
                "worker": {"alive": alive, "last_heartbeat": last},
                "cases_root": {"free_bytes": free, "min_free_bytes": cases_root.min_free_bytes(), "low": low},
            }
        )


#: The write floor's table: bench/http_load.py creates it in its own database and drops it after,
#: so that the product carries no model and no migration for it.
WRITE_FLOOR_TABLE = "bench_write_floor"
WRITE_FLOOR_TABLE_SQL = (
    f"CREATE TABLE IF NOT EXISTS {WRITE_FLOOR_TABLE} (id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())"
)


class WriteFloorView(APIView):
    """bench/http_load.py's write floor (SPEC §9): an authenticated request through the API's own
    authentication and permission that inserts one small row and commits, and does nothing else.

    Every write path's commit waits for PostgreSQL's WAL flush, so write figures are judged
    against a request that pays that flush and nothing more. Mounted only with
    GRIDGATE_BENCH_WRITE_FLOOR (config/urls.py), on a database holding WRITE_FLOOR_TABLE.
    """

    @extend_schema(exclude=True)
    def post(self, request):
        # Autocommit (no ATOMIC_REQUESTS): the INSERT is its own transaction, committed as
        # durably as an acquire's or a submission's (the server's synchronous_commit).
        with connection.cursor() as cursor:
            cursor.execute(f"INSERT INTO {WRITE_FLOOR_TABLE} DEFAULT VALUES")
        return Response(status=status.HTTP_204_NO_CONTENT)


class LoginMethodsView(APIView):
    """How a terminal or a script logs in here (``gridgate login``): by password for a personal
    token, and/or through the centre's provider with the device authorization grant (RFC 8628).
    Names no secret: the CLI client is a public client, and the client finds the provider's
    device endpoint in the issuer's own discovery document."""

    permission_classes = [AllowAny]
    authentication_classes = []

    @extend_schema(
        auth=[],
        responses=inline_serializer(
            "LoginMethods",
            {
                "password": serializers.BooleanField(help_text="`POST /auth/token/` takes a username and password."),
                "device": inline_serializer(
                    "DeviceLogin",
                    {
                        "issuer": serializers.CharField(),
                        "client_id": serializers.CharField(),
                        "scopes": serializers.CharField(),
                        "name": serializers.CharField(),
                    },
                    allow_null=True,
                    help_text="The provider and public client to run the device grant with; null: not offered.",
                ),
            },
        ),
    )
    def get(self, request):
        device = None
        if settings.GRIDGATE_OIDC_ISSUER and settings.GRIDGATE_OIDC_CLI_CLIENT_ID:
            device = {
                "issuer": settings.GRIDGATE_OIDC_ISSUER,
                "client_id": settings.GRIDGATE_OIDC_CLI_CLIENT_ID,
                "scopes": settings.OIDC_RP_SCOPES,
                "name": settings.GRIDGATE_OIDC_NAME,
            }
        passwords = settings.GRIDGATE_PASSWORD_LOGIN in ("on", "staff")
        return Response({"password": passwords, "device": device})
