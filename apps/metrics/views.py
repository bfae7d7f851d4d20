"""``GET /metrics``: Prometheus text format, for scrapers only (docs/metrics.md).

Access, never open by default:

- neither ``GRIDGATE_METRICS_TOKEN`` nor ``GRIDGATE_METRICS_NETWORKS`` set → **404**, as if the
  endpoint did not exist (nothing is said about the site to whoever probes for it);
- ``GRIDGATE_METRICS_NETWORKS`` set and the client's address outside it → **403**;
- ``GRIDGATE_METRICS_TOKEN`` set and no ``Authorization: Bearer <token>``, or another one →
  **401** with ``WWW-Authenticate: Bearer`` (compared in constant time);
- with both set, both are required.

The client's address is ``REMOTE_ADDR``, the peer of the web process. Behind a reverse proxy
that is the proxy's address for every client, so a network allow-list would let through
whoever reaches the proxy: there, scrape the web process directly (bypassing the proxy), or block
``/metrics`` at the proxy, or rely on the token. ``X-Forwarded-For`` is never trusted here (any
client can write it). When the networks are the only protection, a request that carries a
proxy's forwarding header (``X-Forwarded-For``, ``X-Forwarded-Proto``, ``Forwarded``,
``X-Real-IP``) came through a proxy, so its address says nothing: **403**. A scraper talking to
gunicorn directly sends none of them.

The view is exempt from CSRF: it changes nothing, and the CSRF middleware's 403 on a POST would
answer before the access rules (revealing a "closed" endpoint, which must be a 404).

A database that cannot be read answers 503 (the scrape fails, ``up`` is 0), never a 500.
"""

import hmac
import ipaddress
import logging
import os

from django.conf import settings
from django.db import DatabaseError
from django.http import Http404, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from apps.metrics.collector import StateCollector
from apps.metrics.middleware import REGISTRY as HTTP_REGISTRY

log = logging.getLogger(__name__)

#: Headers a reverse proxy adds (WSGI names): their presence means REMOTE_ADDR is the proxy's.
FORWARDING_HEADERS = ("HTTP_X_FORWARDED_FOR", "HTTP_X_FORWARDED_PROTO", "HTTP_FORWARDED", "HTTP_X_REAL_IP")


def refusal(request) -> HttpResponse | None:
    """The response refusing this scrape, or None when it may proceed."""
    token, networks = settings.GRIDGATE_METRICS_TOKEN, settings.GRIDGATE_METRICS_NETWORKS
    if not token and not networks:
        raise Http404("Not found.")
    if networks and not _address_allowed(request.META.get("REMOTE_ADDR", ""), networks):
        return HttpResponse(
            "Forbidden: this address may not read the metrics.\n", status=403, content_type="text/plain"
        )
    if networks and not token and any(name in request.META for name in FORWARDING_HEADERS):
        # A same-host proxy makes every internet client 127.0.0.1: the address proves nothing.
        return HttpResponse(
            "Forbidden: the metrics are not served through a proxy; scrape the web process directly.\n",
            status=403,
            content_type="text/plain",
        )
    if token and not _token_matches(request.META.get("HTTP_AUTHORIZATION", ""), token):
        response = HttpResponse(
            "Unauthorized: send Authorization: Bearer <token>.\n", status=401, content_type="text/plain"
        )
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return None


def _address_allowed(address: str, networks) -> bool:
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 zone id is not part of the address
    except ValueError:
        return False  # no address (a unix socket) or a malformed one: outside every network
    if ip.version == 6 and ip.ipv4_mapped:  # ::ffff:10.0.0.5 from a dual-stack socket
        ip = ip.ipv4_mapped
    return any(ip.version == net.version and ip in net for net in networks)


def _token_matches(header: str, token: str) -> bool:
    scheme, _, given = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    # WSGI headers are latin-1 decoded: encoding back gives the bytes the client sent. Bytes, not
    # str: compare_digest refuses non-ASCII str (a TypeError would be a 500).
    return hmac.compare_digest(given.strip().encode("latin-1", "replace"), token.encode("utf-8"))


@csrf_exempt  # read-only; the access rules above decide, not the CSRF middleware
def metrics(request):
    refused = refusal(request)
    if refused is not None:
        return refused
    if request.method not in ("GET", "HEAD"):
        response = HttpResponse("Method not allowed.\n", status=405, content_type="text/plain")
        response["Allow"] = "GET, HEAD"
        return response
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StateCollector())
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(registry)  # every process's request histograms
    else:
        registry.register(_Delegate(HTTP_REGISTRY))
    encoder, content_type = choose_encoder(request.META.get("HTTP_ACCEPT", ""))
    try:
        body = encoder(registry)
    except DatabaseError:
        log.warning("metrics: the database could not be read", exc_info=True)
        return HttpResponse(
            "Service unavailable: the database could not be read.\n", status=503, content_type="text/plain"
        )
    return HttpResponse(body, content_type=content_type)


class _Delegate:
    """Another registry's metrics, as one collector of this scrape's registry."""

    def __init__(self, registry):
        self.registry = registry

    def collect(self):
        return self.registry.collect()
