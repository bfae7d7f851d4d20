"""HTTP request latency by route: the resolved URL pattern, never the raw path."""

import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

TOKEN = "t" * 32
NAME = "gridgate_http_request_duration_seconds"
pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def metrics_on(settings):
    settings.GRIDGATE_METRICS_TOKEN = TOKEN
    settings.GRIDGATE_METRICS_NETWORKS = ()


def request_counts(client) -> dict[tuple[str, str, str], float]:
    """{(route, method, status): requests counted so far}."""
    body = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").content.decode()
    (family,) = [f for f in text_string_to_metric_families(body) if f.name == NAME]
    return {
        (s.labels["route"], s.labels["method"], s.labels["status"]): s.value
        for s in family.samples
        if s.name == f"{NAME}_count"
    }


def increase(before, after, key):
    return after.get(key, 0) - before.get(key, 0)


def test_route_label_is_the_url_pattern_not_the_path(client):
    before = request_counts(client)
    ids = [uuid.uuid4() for _ in range(3)]
    for session_id in ids:
        client.get(f"/api/v1/sessions/{session_id}/jobs/")  # anonymous: 401, but resolved
    after = request_counts(client)
    assert increase(before, after, ("/api/v1/sessions/<uuid:pk>/jobs/", "GET", "4xx")) == 3
    assert not any(str(session_id) in route for session_id in ids for route, _, _ in after)


def test_unresolved_paths_share_one_label(client):
    before = request_counts(client)
    client.get("/no/such/page/12345")
    client.get("/api/v1/nothing-here/67890/")
    after = request_counts(client)
    assert increase(before, after, ("<unmatched>", "GET", "4xx")) == 2
    assert not any("12345" in route or "67890" in route for route, _, _ in after)


def test_unknown_methods_share_one_label(client):
    before = request_counts(client)
    client.generic("BREW", "/api/v1/health/")
    after = request_counts(client)
    assert increase(before, after, ("/api/v1/health/", "other", "4xx")) == 1
    assert not any(method == "BREW" for _, method, _ in after)


def test_successful_requests_are_counted_by_status_class(client):
    before = request_counts(client)
    client.get("/api/v1/health/")
    after = request_counts(client)
    assert increase(before, after, ("/api/v1/health/", "GET", "2xx")) == 1
    # The scrape itself is a route like any other.
    assert after.get(("/metrics", "GET", "2xx"), 0) >= 1


def test_a_failing_observation_never_fails_the_request(client, monkeypatch, caplog):
    """PROMETHEUS_MULTIPROC_DIR removed under a running server (a tmp cleaner, an old gunicorn
    master's exit): every observation raises; requests are still answered, logged once."""
    from apps.metrics import middleware

    def vanished(*labels):
        raise FileNotFoundError(2, "No such file or directory", "/tmp/gridgate-metrics-x/histogram_1.db")

    monkeypatch.setattr(middleware.REQUEST_SECONDS, "labels", vanished)
    monkeypatch.setattr(middleware.RequestMetricsMiddleware, "_logged", False)
    with caplog.at_level("ERROR", logger="apps.metrics.middleware"):
        assert client.get("/api/v1/health/").status_code == 200
        assert client.get("/no/such/page/").status_code == 404
    assert [r.getMessage() for r in caplog.records if r.name == "apps.metrics.middleware"] == [
        "request metrics: the observation failed; requests are answered, not counted"
    ]
