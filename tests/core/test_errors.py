"""One JSON error shape on /api/ and /qrmi/: anything a client sent is a 4xx with a message, a
transient database failure a 503, and never an HTML page (SPEC §10)."""

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import OperationalError
from rest_framework.test import APIClient

from apps.core.jsonlimits import MAX_JSON_DEPTH

pytestmark = pytest.mark.django_db

DEEP = "[" * 1000 + "]" * 1000


def assert_json_error(response, status):
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = response.json()
    assert isinstance(body, dict) and body
    return body


def test_deeply_nested_json_to_the_public_token_endpoint_is_400_json():
    response = APIClient().post("/api/v1/auth/token/", data=DEEP, content_type="application/json")
    assert "nested deeper than" in assert_json_error(response, 400)["detail"]


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 100_000])
def test_deeply_nested_json_body_is_400_json(api, owner, local_pool, depth):
    body = '{"resource_class": ' + "[" * depth + "]" * depth + "}"
    response = api(owner).post("/api/v1/sessions/", data=body, content_type="application/json")
    assert "nested deeper than" in assert_json_error(response, 400)["detail"]


def test_json_nested_within_the_limit_is_parsed(api, owner, local_pool):
    nested = "[" * (MAX_JSON_DEPTH - 1) + "]" * (MAX_JSON_DEPTH - 1)
    body = '{"resource_class": ' + nested + "}"
    response = api(owner).post("/api/v1/sessions/", data=body, content_type="application/json")
    assert "resource_class" in assert_json_error(response, 400)  # reached the serializer


def test_json_body_over_the_size_limit_is_413_json_naming_the_limit(api, owner, local_pool, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    response = api(owner).post(
        "/api/v1/sessions/", data='{"external_id": "' + "x" * 2000 + '"}', content_type="application/json"
    )
    body = assert_json_error(response, 413)
    assert body["limit_bytes"] == 1000 and "1000-byte limit" in body["detail"]


def test_too_many_form_fields_is_400_json(api, owner, local_pool, settings):
    settings.DATA_UPLOAD_MAX_NUMBER_FIELDS = 10
    data = {f"field{i}": "x" for i in range(20)}
    body = assert_json_error(api(owner).post("/api/v1/cases/", data, format="multipart"), 400)
    assert "Too many form fields" in body["detail"] and body["limit"] == 10


def test_too_many_files_is_400_json(api, owner, local_pool, settings, tmp_path):
    settings.GRIDGATE_CASES_ROOT = tmp_path
    settings.DATA_UPLOAD_MAX_NUMBER_FILES = 3
    files = [SimpleUploadedFile(f"in{i}.txt", b"x") for i in range(5)]
    data = {"name": "c", "command": "true", "resource_class": local_pool.classes.get().pk, "inputs": files}
    body = assert_json_error(api(owner).post("/api/v1/cases/", data, format="multipart"), 400)
    assert "Too many files" in body["detail"] and body["limit"] == 3


@pytest.mark.parametrize("path", ["/api/v1/no-such-thing/", "/api/nothing", "/qrmi/no-pool/no-route"])
def test_unknown_api_url_is_404_json(path):
    assert assert_json_error(APIClient().get(path), 404)["detail"]


def test_web_pages_keep_their_html_404(client):
    response = client.get("/no-such-page/")
    assert response.status_code == 404 and not response["Content-Type"].startswith("application/json")


def test_uncaught_server_error_on_an_api_path_is_500_json_without_internals(api, owner, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("secret internals")

    monkeypatch.setattr("apps.resources.api.views.ResourcePoolViewSet.list", boom)
    body = assert_json_error(api(owner).get("/api/v1/resource-pools/"), 500)
    assert body == {"detail": "Internal server error."}


def test_an_api_server_error_is_one_record_in_the_log_with_its_traceback(api, owner, monkeypatch, caplog):
    """The middleware logs the error with its traceback; Django's handler, seeing a 500 answer,
    logged it a second time without one (an alert counting errors counted each twice)."""

    def boom(*args, **kwargs):
        raise RuntimeError("secret internals")

    monkeypatch.setattr("apps.resources.api.views.ResourcePoolViewSet.list", boom)
    with caplog.at_level("ERROR", logger="django.request"):
        assert_json_error(api(owner).get("/api/v1/resource-pools/"), 500)
    (record,) = [r for r in caplog.records if r.name == "django.request"]
    assert record.exc_info and record.getMessage() == "Internal Server Error: /api/v1/resource-pools/"


def test_transient_database_failure_is_503_json_with_retry_after(api, owner, monkeypatch):
    def deadlock(*args, **kwargs):
        raise OperationalError("deadlock detected")

    monkeypatch.setattr("apps.resources.api.views.ResourcePoolViewSet.list", deadlock)
    response = api(owner).get("/api/v1/resource-pools/")
    assert "retry" in assert_json_error(response, 503)["detail"]
    assert response["Retry-After"] == "1"


def test_services_raise_the_projects_exceptions_and_import_nothing_from_drf():
    """STYLE.md examples 1-2: services, selectors and passes know nothing of the API layer; the
    API and the web pages each map ``apps.core.exceptions`` once."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "apps"
    layers = [*root.glob("*/services.py"), *root.glob("*/selectors.py"), *root.glob("*/passes.py")]
    layers.append(root / "cases" / "workspace.py")
    offenders = [
        str(path.relative_to(root))
        for path in layers
        if "rest_framework" in path.read_text() or "apps.core.api" in path.read_text()
    ]
    assert len(layers) > 8 and not offenders


SURROGATE = "\\ud800"  # a lone UTF-16 surrogate, written as JSON writes it


@pytest.mark.parametrize(
    "path, body, who",
    [
        ("/api/v1/resource-pools/", '{"name": "p", "kind": "SUR"}', "staff"),
        ("/api/v1/resource-pools/", '{"name": "p", "kind": "local", "strategy": "SUR"}', "staff"),
        ("/api/v1/resource-pools/", '{"name": "p", "kind": "local", "share_by": "SUR"}', "staff"),
        ("/api/v1/devices/", '{"pool": POOL, "name": "d", "driver": "SUR"}', "staff"),
        ("/api/v1/cases/", '{"name": "c", "resource_class": CLASS, "command": "true", "campaign": "SUR"}', "owner"),
        (
            "/api/v1/cases/",
            '{"name": "c", "resource_class": CLASS, "command": "true", "launch_options": {"SUR": 1}}',
            "owner",
        ),
    ],
)
def test_a_lone_surrogate_echoed_in_a_400_is_escaped_not_a_500(api, staff, owner, local_pool, path, body, who):
    """JSON may carry a lone surrogate ("\\ud800"); a 400 whose message echoes it could not be
    encoded as UTF-8 and became a 500. It is escaped in the answer instead (the same JSON)."""
    body = body.replace("SUR", SURROGATE).replace("POOL", str(local_pool.pk))
    body = body.replace("CLASS", str(local_pool.classes.get().pk))
    response = api(staff if who == "staff" else owner).post(path, data=body, content_type="application/json")
    assert_json_error(response, 400)
    assert b"\\ud800" in response.content  # escaped, and the message still says what was sent


def test_a_lone_surrogate_in_a_body_the_browsable_api_shows_again_is_not_a_500(client, staff, local_pool):
    client.force_login(staff)
    body = '{"name": "p", "kind": "SUR"}'.replace("SUR", SURROGATE)
    response = client.post("/api/v1/resource-pools/", body, content_type="application/json", HTTP_ACCEPT="text/html")
    assert_json_error(response, 400)  # an error page on an API path becomes JSON (ApiErrorMiddleware)
