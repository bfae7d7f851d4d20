"""scripts/ocs-load-sensor.py, Open Cluster Scheduler's load sensor protocol against a local HTTP
server answering as a pool's QRMI routes: a report per empty line, ``quit`` ends it, and it
fails closed (0 slots, not ready) when Gridgate does not answer or the pool is not accessible."""

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

SENSOR = Path(__file__).resolve().parents[2] / "scripts" / "ocs-load-sensor.py"


class Answers(dict):
    """Path → (status, JSON body), and ``seen``: (path, X-Munge-Cred or None) of each request."""

    def __init__(self, *args):
        super().__init__(*args)
        self.seen = []


@pytest.fixture
def gridgate():
    """``answers`` maps a path to (status, JSON body) and may be changed between reports."""
    answers = Answers(
        {
            "/qrmi/fresnel/qpu-slots": (200, {"qpu_slots_total": 4, "qpu_slots_used": 1, "qpu_slots_available": 3}),
            "/qrmi/fresnel/accessible": (200, {"is_accessible": True, "message": ""}),
        }
    )

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            answers.seen.append((self.path, self.headers.get("X-Munge-Cred")))
            status, body = answers.get(self.path, (404, {"detail": "Not found."}))
            payload = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/qrmi/fresnel", answers
    server.shutdown()


def sense(base: str, lines: str, *options: str, env=None) -> tuple[list[str], str]:
    done = subprocess.run(
        [sys.executable, str(SENSOR), base, "--timeout", "3", *options],
        input=lines,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines(), done.stderr


def test_each_request_gets_a_report_of_free_slots_and_readiness_and_quit_ends_it(gridgate):
    base, _ = gridgate
    out, _ = sense(base, "\n\nquit\n\n")
    assert out == ["begin", "global:qpu_slots:3", "global:qpu_ready:1", "end"] * 2


def test_an_inaccessible_pool_reports_no_slots_and_not_ready(gridgate):
    base, answers = gridgate
    answers["/qrmi/fresnel/accessible"] = (200, {"is_accessible": False, "message": "calibration"})
    out, err = sense(base, "\nquit\n")
    assert out == ["begin", "global:qpu_slots:0", "global:qpu_ready:0", "end"]
    assert "calibration" in err


@pytest.mark.parametrize(
    "broken",
    [
        (500, {"detail": "boom"}),
        (200, {"qpu_slots_available": "3"}),
        (200, {"qpu_slots_available": -1}),
        (404, {"detail": "Pool 'fresnel' has no slot capacity."}),
    ],
)
def test_an_answer_it_cannot_trust_fails_closed(gridgate, broken):
    base, answers = gridgate
    answers["/qrmi/fresnel/qpu-slots"] = broken
    out, err = sense(base, "\nquit\n")
    assert out == ["begin", "global:qpu_slots:0", "global:qpu_ready:0", "end"] and "closed" in err


def test_gridgate_not_answering_fails_closed():
    out, err = sense("http://127.0.0.1:9/qrmi/fresnel", "\nquit\n")
    assert out == ["begin", "global:qpu_slots:0", "global:qpu_ready:0", "end"] and "closed" in err


def test_with_munge_both_requests_carry_a_credential_of_their_own(gridgate, tmp_path):
    """A private pool's qpu-slots and accessible both answer only its users (or the load-sensor
    networks): with --munge an unsigned accessible read 404, so the sensor reported the pool
    never ready. Each request gets its own credential (munged refuses a replay)."""
    base, answers = gridgate
    counter = tmp_path / "count"
    munge = tmp_path / "munge"
    munge.write_text(f'#!/bin/sh\necho x >> {counter}\necho "CRED$(wc -l < {counter} | tr -d " ")"\n')
    munge.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    out, _ = sense(base, "\nquit\n", "--munge", env=env)
    assert out == ["begin", "global:qpu_slots:3", "global:qpu_ready:1", "end"]
    assert sorted(answers.seen) == [("/qrmi/fresnel/accessible", "CRED2"), ("/qrmi/fresnel/qpu-slots", "CRED1")]
