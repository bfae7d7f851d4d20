"""HTTP request latency by route: a prometheus-client Histogram fed by a middleware.

Labels are bounded whatever clients send: ``route`` is the URL *pattern* Django resolved
(``/api/v1/sessions/<uuid:pk>/jobs/``), never the path with its ids; a request that resolved to
no view is ``<unmatched>`` (an unknown URL's 404, a redirect of the security middleware) or
``<static>`` (whitenoise); ``method`` is one of the standard methods or ``other``; ``status`` is
the class (``2xx`` … ``5xx``).

Several gunicorn worker processes each observe their own requests. With
``PROMETHEUS_MULTIPROC_DIR`` set before the application is imported (``config/gunicorn.conf.py``
does it), prometheus-client keeps the values in memory-mapped files there and ``/metrics`` sums
the files of every process of this server, so a scrape answered by any worker sees them all.

Observing never fails a request: if it raises (the directory vanished under a tmp cleaner, a full
disk), the request is answered as if nothing happened and the error is logged once per process.
"""

import logging
import time

from django.conf import settings
from prometheus_client import CollectorRegistry, Histogram, disable_created_metrics

log = logging.getLogger(__name__)
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

# No "_created" series: multiprocess mode has none, so a single-process server would export a
# series the others lack.
disable_created_metrics()
# A private registry: /metrics adds it (or, in multiprocess mode, the files it writes) to the
# state collector's output.
REGISTRY = CollectorRegistry(auto_describe=True)
REQUEST_SECONDS = Histogram(
    "gridgate_http_request_duration_seconds",
    "Time the web process took to answer, by route pattern, method and status class.",
    ["route", "method", "status"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
    registry=REGISTRY,
)


def route_of(request) -> str:
    match = getattr(request, "resolver_match", None)
    if match is not None:
        return "/" + match.route
    static = "/" + settings.STATIC_URL.lstrip("/")
    return "<static>" if request.path_info.startswith(static) else "<unmatched>"


class RequestMetricsMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        started = time.perf_counter()
        response = self.get_response(request)  # Django turns inner exceptions into responses
        try:
            method = request.method if request.method in METHODS else "other"
            REQUEST_SECONDS.labels(route_of(request), method, f"{response.status_code // 100}xx").observe(
                time.perf_counter() - started
            )
        except Exception:  # noqa: BLE001 - a metric is never worth a failed request
            self._log_once()
        return response

    _logged = False

    @classmethod
    def _log_once(cls):
        # Once per process: a vanished directory would otherwise log a traceback per request.
        if not cls._logged:
            cls._logged = True
            log.exception("request metrics: the observation failed; requests are answered, not counted")
