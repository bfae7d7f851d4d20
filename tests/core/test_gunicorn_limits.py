"""What gunicorn refuses before the application (a request line or a header over its limits)
is answered as the API's JSON error, with the limit and the variable that sets it, not gunicorn's
HTML page (SPEC §10: every error is JSON with a message). The real server, small limits set
through the documented variables so that a whole refused request fits in gunicorn's first read."""

import http.client
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.core.test_process_stop import free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gunicorn-limits")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    env.update(
        PORT=str(port),
        DEBUG="true",
        GRIDGATE_VAR_DIR=str(tmp),
        GRIDGATE_WEB_WORKERS="1",
        GRIDGATE_WEB_THREADS="2",
        GRIDGATE_STOP_GRACE="5",
        GRIDGATE_WEB_LIMIT_REQUEST_LINE="1024",
        GRIDGATE_WEB_LIMIT_REQUEST_FIELD_SIZE="1024",
        GRIDGATE_WEB_LIMIT_REQUEST_FIELDS="20",
        TMPDIR=str(tmp),
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", "config/gunicorn.conf.py", "config.wsgi:application"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_until(lambda: status(port, "/api/v1/") is not None, 120), "gunicorn never answered"
        yield port
    finally:
        process.terminate()
        process.wait(timeout=60)


def request(port, path, headers=None):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", path, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.getheader("Content-Type"), response.read()
    finally:
        connection.close()


def status(port, path):
    try:
        return request(port, path)[0]
    except OSError:
        return None


def test_a_request_line_over_the_limit_is_a_json_414_naming_the_limit(server):
    code, content_type, body = request(server, "/api/v1/jobs/?q=" + "x" * 2000)
    assert code == 414 and content_type == "application/json"
    detail = json.loads(body)["detail"]
    assert "1024 bytes" in detail and "GRIDGATE_WEB_LIMIT_REQUEST_LINE" in detail


def test_a_header_over_the_limit_is_a_json_431_naming_the_limits(server):
    code, content_type, body = request(server, "/api/v1/jobs/", headers={"X-Big": "y" * 2000})
    assert code == 431 and content_type == "application/json"
    assert "GRIDGATE_WEB_LIMIT_REQUEST_FIELD_SIZE" in json.loads(body)["detail"]


def test_too_many_headers_is_a_json_431(server):
    code, content_type, body = request(server, "/api/v1/jobs/", headers={f"X-H{i}": "1" for i in range(40)})
    assert code == 431 and content_type == "application/json" and json.loads(body)["detail"]


def test_a_request_within_the_limits_reaches_the_application(server):
    code, content_type, _ = request(server, "/api/v1/jobs/?q=" + "x" * 500)
    assert code == 401 and content_type.startswith("application/json")  # the API's own answer
