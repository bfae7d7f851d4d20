"""/metrics is never open by default; a bearer token and/or client networks."""

import ipaddress
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import OperationalError
from django.test import Client, override_settings
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from apps.metrics.collector import StateCollector
from config.env import env_networks

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "s3cret-metrics-token-0123456789"
pytestmark = pytest.mark.django_db


def nets(*cidrs):
    return tuple(ipaddress.ip_network(c) for c in cidrs)


@pytest.fixture
def with_token(settings):
    settings.GRIDGATE_METRICS_TOKEN = TOKEN
    settings.GRIDGATE_METRICS_NETWORKS = ()


@pytest.fixture
def with_networks(settings):
    settings.GRIDGATE_METRICS_TOKEN = ""
    settings.GRIDGATE_METRICS_NETWORKS = nets("10.1.0.0/16", "fd00::/8")


def test_metrics_is_not_found_when_neither_token_nor_networks_is_configured(client, settings):
    settings.GRIDGATE_METRICS_TOKEN = ""
    settings.GRIDGATE_METRICS_NETWORKS = ()
    assert client.get("/metrics").status_code == 404
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer anything", REMOTE_ADDR="127.0.0.1").status_code == 404


def test_scrape_without_a_token_is_refused(client, with_token):
    response = client.get("/metrics")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert b"gridgate_" not in response.content


@pytest.mark.parametrize(
    "header",
    [
        "Bearer wrong-token",
        f"Bearer {TOKEN}x",
        f"Bearer {TOKEN[:-1]}",
        f"Token {TOKEN}",  # another scheme with the right secret
        f"Basic {TOKEN}",
        TOKEN,
        "Bearer ",
        "Bearer t\u00f6ken-with-latin-1",  # non-ASCII: compared as bytes, never a TypeError
    ],
)
def test_scrape_with_a_wrong_token_is_refused(client, with_token, header):
    assert client.get("/metrics", HTTP_AUTHORIZATION=header).status_code == 401


def test_scrape_with_the_token_is_answered(client, with_token):
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    assert b"# TYPE gridgate_jobs gauge" in response.content
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"bearer  {TOKEN} ").status_code == 200  # scheme is case-blind


def test_openmetrics_is_negotiated_by_accept(client, with_token):
    response = client.get(
        "/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}", HTTP_ACCEPT="application/openmetrics-text; version=1.0.0"
    )
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/openmetrics-text")
    assert response.content.rstrip().endswith(b"# EOF")


@pytest.mark.parametrize("address", ["10.1.2.3", "fd00::5", "::ffff:10.1.9.9"])
def test_scrape_from_an_allowed_network_is_answered(client, with_networks, address):
    assert client.get("/metrics", REMOTE_ADDR=address).status_code == 200


@pytest.mark.parametrize("address", ["10.2.0.1", "127.0.0.1", "::1", "", "unix-socket", "10.1.2.3.4"])
def test_scrape_from_outside_the_networks_is_forbidden(client, with_networks, address):
    assert client.get("/metrics", REMOTE_ADDR=address).status_code == 403


def test_forwarded_for_header_never_grants_access(client, with_networks):
    """Behind a proxy REMOTE_ADDR is the proxy; a client-written X-Forwarded-For is not believed."""
    response = client.get("/metrics", REMOTE_ADDR="192.0.2.7", HTTP_X_FORWARDED_FOR="10.1.2.3")
    assert response.status_code == 403


@pytest.mark.parametrize(
    "header",
    [
        {"HTTP_X_FORWARDED_FOR": "203.0.113.9"},
        {"HTTP_X_FORWARDED_PROTO": "https"},
        {"HTTP_FORWARDED": "for=203.0.113.9;proto=https"},
        {"HTTP_X_REAL_IP": "203.0.113.9"},
    ],
)
def test_request_through_a_proxy_is_forbidden_when_networks_are_the_only_protection(client, settings, header):
    """A same-host nginx (docs/deployment.md) makes every internet client 10.1.0.1 / 127.0.0.1:
    its forwarding headers show the address proves nothing."""
    settings.GRIDGATE_METRICS_TOKEN = ""
    settings.GRIDGATE_METRICS_NETWORKS = nets("10.1.0.0/16", "127.0.0.0/8")
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 200  # a direct scrape
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1", **header).status_code == 403
    # With a token as well, the token is the protection: a proxied scrape with it is answered.
    settings.GRIDGATE_METRICS_TOKEN = TOKEN
    response = client.get("/metrics", REMOTE_ADDR="127.0.0.1", HTTP_AUTHORIZATION=f"Bearer {TOKEN}", **header)
    assert response.status_code == 200


def test_post_is_answered_by_the_access_rules_not_the_csrf_check(settings, with_token):
    """Production enforces CSRF; /metrics must still say 404 while closed and 401/405 when open."""
    strict = Client(enforce_csrf_checks=True)
    assert strict.post("/metrics").status_code == 401
    assert strict.post("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 405
    settings.GRIDGATE_METRICS_TOKEN = ""
    assert strict.post("/metrics").status_code == 404


def test_plain_http_scrape_is_answered_when_the_site_redirects_to_https(client, with_token):
    """GRIDGATE_HTTPS=true redirects http to https, but Prometheus scrapes gunicorn's plain http
    (docs/metrics.md): /metrics is exempt from the redirect (config/settings.py)."""
    https = {"SECURE_SSL_REDIRECT": True, "SESSION_COOKIE_SECURE": True, "CSRF_COOKIE_SECURE": True}
    with override_settings(**https, SECURE_HSTS_SECONDS=31_536_000):  # as GRIDGATE_HTTPS=true sets them
        response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
        assert response.status_code == 200 and b"gridgate_pool_slots_used" in response.content
        assert client.get("/api/v1/health/").status_code == 301  # the rest of the site still redirects


def test_with_token_and_networks_both_are_required(client, settings):
    settings.GRIDGATE_METRICS_TOKEN = TOKEN
    settings.GRIDGATE_METRICS_NETWORKS = nets("10.1.0.0/16")
    auth = f"Bearer {TOKEN}"
    assert client.get("/metrics", REMOTE_ADDR="10.1.0.1", HTTP_AUTHORIZATION=auth).status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="10.1.0.1").status_code == 401
    assert client.get("/metrics", REMOTE_ADDR="10.9.0.1", HTTP_AUTHORIZATION=auth).status_code == 403


def test_only_get_and_head_are_answered(client, with_token):
    assert client.post("/metrics").status_code == 401  # refused before anything else is said
    assert client.post("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 405
    assert client.head("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 200


def test_unreadable_database_answers_503_not_500(client, with_token, monkeypatch):
    def down(self):
        raise OperationalError("connection refused")
        yield  # a generator, like the real one

    monkeypatch.setattr(StateCollector, "collect", down)
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 503


@hypothesis_settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    authorization=st.one_of(st.text(max_size=80), st.text(max_size=60).map(lambda s: f"Bearer {s}")),
    # Some from inside the allowed networks, so the token check is reached too.
    address=st.one_of(st.text(max_size=45), st.ip_addresses().map(str), st.sampled_from(["10.1.2.3", "fd00::1"])),
    accept=st.text(max_size=60),
    method=st.sampled_from(["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "TRACE"]),
)
def test_hostile_unauthenticated_request_never_gets_a_500(client, settings, authorization, address, accept, method):
    settings.GRIDGATE_METRICS_TOKEN = TOKEN
    settings.GRIDGATE_METRICS_NETWORKS = nets("10.1.0.0/16", "fd00::/8")
    response = client.generic(
        method, "/metrics", HTTP_AUTHORIZATION=authorization, REMOTE_ADDR=address, HTTP_ACCEPT=accept
    )
    assert response.status_code in (401, 403)


def test_networks_setting_parses_cidrs_and_refuses_nonsense(monkeypatch):
    monkeypatch.setenv("GRIDGATE_METRICS_NETWORKS", "10.0.0.0/8, 192.0.2.1,::1/128")
    assert env_networks("GRIDGATE_METRICS_NETWORKS") == nets("10.0.0.0/8", "192.0.2.1/32", "::1/128")
    for bad in ("10.0.0.0/33", "10.0.0.1/8", "localhost"):
        monkeypatch.setenv("GRIDGATE_METRICS_NETWORKS", bad)
        with pytest.raises(ImproperlyConfigured, match="GRIDGATE_METRICS_NETWORKS"):
            env_networks("GRIDGATE_METRICS_NETWORKS")


def test_a_short_metrics_token_stops_the_process_at_start(tmp_path):
    env = dict(os.environ, GRIDGATE_METRICS_TOKEN="short", GRIDGATE_VAR_DIR=str(tmp_path))
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    assert "GRIDGATE_METRICS_TOKEN" in result.stderr
