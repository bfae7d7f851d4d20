from django.conf import settings
from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from apps.core.api.views import WriteFloorView
from apps.metrics.views import metrics

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # The split view serves Swagger UI's start-up script as a file: no inline script (CSP).
    path(
        "api/docs/",
        SpectacularSwaggerSplitView.as_view(url_name="schema", template_name="web/swagger_ui.html"),
        name="swagger-ui",
    ),
    path("api/v1/", include("apps.accounts.api.urls")),  # auth/token/
    path("api/v1/", include("apps.core.api.urls")),
    path("api/v1/", include("apps.resources.api.urls")),
    path("api/v1/", include("apps.sessions.api.urls")),
    path("api/v1/", include("apps.scheduling.api.urls")),
    path("api/v1/", include("apps.accounting.api.urls")),
    path("api/v1/", include("apps.backends.api.urls")),
    path("api/v1/", include("apps.cases.api.urls")),
    path("api/v1/", include("apps.reservations.api.urls")),
    path("api/v1/", include("apps.notifications.api.urls")),
    path("api/v1/", include("apps.allocations.api.urls")),
    # bench/http_load.py's write floor: no route at all unless the bench's server asks for it.
    *(
        [path("api/v1/bench/write-floor/", WriteFloorView.as_view(), name="bench-write-floor")]
        if settings.GRIDGATE_BENCH_WRITE_FLOOR
        else []
    ),
    path("metrics", metrics, name="metrics"),  # Prometheus (docs/metrics.md); not under /api/
    # Sign-in with the identity provider (apps/accounts/oidc.py; 404 while none is configured).
    path("oidc/", include("mozilla_django_oidc.urls")),
    path("qrmi/<str:pool>/", include("apps.qrmi.api.urls")),  # R-QRMI-1: a Warden per pool
    # The user pages take the rest of the site (after /admin/ and /api/).
    path("", include("apps.web.urls")),
]
