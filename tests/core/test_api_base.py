"""The shared API base: token auth, health, schema, error handling."""

import pytest
from django.core.management import call_command
from django.utils import timezone

from apps.core.models import WorkerHeartbeat

pytestmark = pytest.mark.django_db


def test_token_login_then_token_auth(api, member, local_pool):
    response = api(None).post("/api/v1/auth/token/", {"username": "member", "password": "pw"}, format="json")
    assert response.status_code == 200
    token = response.json()["token"]
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert client.get("/api/v1/resource-pools/").status_code == 200


def test_wrong_password_is_400_without_token(api, member):
    response = api(None).post("/api/v1/auth/token/", {"username": "member", "password": "nope"}, format="json")
    assert response.status_code == 400 and "token" not in response.json()


def test_health_reports_database_and_worker(api):
    body = api(None).get("/api/v1/health/").json()
    assert body["database"] == "ok" and body["worker"]["alive"] is False
    WorkerHeartbeat.objects.create(name="w1", seen_at=timezone.now())
    body = api(None).get("/api/v1/health/").json()
    assert body["status"] == "ok" and body["worker"]["alive"] is True


def test_heartbeat_task_records_the_worker(db):
    from apps.core.tasks import heartbeat

    name = heartbeat()
    assert WorkerHeartbeat.objects.filter(name=name).exists()


def test_heartbeat_comes_from_the_ticker_not_a_minutely_schedule(db):
    """The ticker process beats every few seconds, so heartbeat age means something."""
    from django_q.models import Schedule

    assert not Schedule.objects.filter(name="gridgate.heartbeat").exists()


def test_openapi_schema_validates_without_warnings(tmp_path):
    out = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(out))
    text = out.read_text()
    assert "/api/v1/resource-pools/{id}/accessible/" in text
    assert "/api/v1/resource-classes/{id}/launch-spec/" in text


def test_swagger_ui_is_served_offline(client):
    response = client.get("/api/docs/")
    assert response.status_code == 200
    assert b"swagger-ui" in response.content.lower()
    assert b"cdn" not in response.content.lower()


@pytest.mark.parametrize("path", ["/login/", "/api/docs/", "/admin/login/", "/api/v1/health/"])
def test_every_answer_carries_a_content_security_policy_without_inline_script(client, db, path):
    """F12: no Content-Security-Policy was sent. Now every answer says scripts, styles and
    connections come from the site itself, with no inline script, no plugins and no framing."""
    policy = client.get(path)["Content-Security-Policy"]
    directives = dict(part.strip().split(" ", 1) for part in policy.split(";") if part.strip())
    assert directives["script-src"] == "'self'" and directives["style-src"] == "'self'"
    assert directives["object-src"] == "'none'" and directives["frame-ancestors"] == "'none'"
    assert "unsafe" not in policy
