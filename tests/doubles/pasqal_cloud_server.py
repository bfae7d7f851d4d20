"""A local double of Pasqal Cloud's API, driven through the real ``pasqal-cloud`` SDK.

What the SDK (0.24) calls, with its shapes: the password grant at ``/oauth/token`` (form data,
answers ``{"access_token", "expires_in"}``), then with ``Authorization: Bearer``:
``POST /core-fast/api/v1/batches`` (gzip body) → the batch with its ``jobs``;
``GET /core-fast/api/v1/batches?tag=…`` (paginated); ``GET /core-fast/api/v2/jobs/{id}``;
``GET /core-fast/api/v1/jobs/{id}/results_link`` → a link whose document holds ``counter``;
``PATCH /core-fast/api/v2/jobs/{id}/cancel``; ``GET /core-fast/api/v1/devices/specs`` →
``{device type: specs JSON string}``. Every answer is a JSend envelope.

Jobs move one step per read: PENDING → RUNNING → DONE (``fail_next``: ERROR, ``hold``: stay
RUNNING). Cancelling a finished job answers 400. ``fault(path_part, status, times, method)``
injects errors; ``drop(path_part, …)`` carries a request out and closes the connection.
"""

from __future__ import annotations

import gzip
import itertools
import json
import logging
import socket
import threading
import uuid
from datetime import UTC, datetime

from flask import Flask, jsonify, request
from werkzeug.serving import make_server

from tests.doubles.pasqal_qpu_server import Fault, analog_device_specs

logging.getLogger("werkzeug").setLevel(logging.ERROR)


def now() -> str:
    return datetime.now(UTC).isoformat()


def jsend(data, code=200, message="OK.", **extra):
    status = "success" if code < 400 else "fail"
    return jsonify({"status": status, "code": code, "message": message, "data": data, **extra}), code


class CloudDouble:
    def __init__(self, *, username="ada@example.org", password="cloud-PASSWORD-value-7", project_id="proj-1"):  # noqa: S107
        self.username, self.password, self.project_id = username, password, project_id
        self.token = "cloud-TOKEN-" + uuid.uuid4().hex
        self.specs = {"FRESNEL": json.dumps(analog_device_specs())}
        self.batches: dict[str, dict] = {}
        self.jobs: dict[str, dict] = {}
        self.faults: list[Fault] = []
        self.calls: list[tuple[str, str]] = []
        self.fail_next = 0
        self.hold = False
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._server = None
        self.app = self._make_app()

    def start(self):
        self._server = make_server("127.0.0.1", 0, self.app, threaded=True)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self):
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    def config(self, **extra) -> dict:
        """A device ``config`` pointing the SDK at this double."""
        return {
            "project_id": self.project_id,
            "device_type": "FRESNEL",
            "username_env": "GRIDGATE_CRED_CLOUD_USER",
            "password_env": "GRIDGATE_CRED_CLOUD_PASSWORD",
            "endpoint": f"{self.url}/core-fast",
            "account_endpoint": f"{self.url}/account",
            "token_endpoint": f"{self.url}/oauth/token",
            **extra,
        }

    def fault(self, path_part, *, status=503, times=1, method=None):
        self.faults.append(Fault(path_part, method, status, times))

    def drop(self, path_part, *, times=1, method=None):
        self.faults.append(Fault(path_part, method, None, times, drop=True))

    def creations(self) -> int:
        return sum(1 for method, path in self.calls if method == "POST" and path.endswith("/batches"))

    def finish(self, job_id: str, status: str = "DONE") -> None:
        with self._lock:
            self._end(self.jobs[job_id], status)

    def _take(self, drop: bool) -> Fault | None:
        for fault in self.faults:
            if fault.times <= 0 or fault.drop != drop or fault.path_part not in request.path:
                continue
            if fault.method and fault.method != request.method:
                continue
            fault.times -= 1
            return fault
        return None

    def _end(self, job: dict, status: str) -> None:
        if status == "DONE" and self.fail_next:
            self.fail_next -= 1
            status = "ERROR"
        job["status"] = status
        job["start_timestamp"] = job["start_timestamp"] or now()
        job["end_timestamp"] = job["updated_at"] = now()
        if status == "ERROR":
            job["errors"] = ["Calibration drift: the run was aborted."]
        self.batches[job["batch_id"]]["status"] = status

    def _make_app(self) -> Flask:
        app = Flask("pasqal-cloud-double")
        double = self

        @app.before_request
        def before():
            double.calls.append((request.method, request.path))
            if request.path.startswith("/results/"):
                return None  # a presigned link: no bearer token
            if request.path != "/oauth/token" and request.headers.get("Authorization") != f"Bearer {double.token}":
                return jsend(None, 401, "Unauthorized")
            fault = double._take(drop=False)
            if fault is not None:
                return jsend(None, fault.status, f"injected fault {fault.status}")
            return None

        @app.after_request
        def after(response):
            if double._take(drop=True) is not None:
                sock = request.environ.get("werkzeug.socket")
                if sock is not None:
                    sock.shutdown(socket.SHUT_RDWR)
            return response

        @app.post("/oauth/token")
        def token():
            if (request.form.get("username"), request.form.get("password")) != (double.username, double.password):
                return jsonify({"error": "invalid_grant", "error_description": "Wrong email or password."}), 403
            return jsonify({"access_token": double.token, "expires_in": 3600, "token_type": "Bearer"})

        @app.get("/core-fast/api/v1/devices/specs")
        def specs():
            return jsend(dict(double.specs))

        @app.post("/core-fast/api/v1/batches")
        def create_batch():
            raw = request.get_data()
            if request.headers.get("Content-Encoding") == "gzip":
                raw = gzip.decompress(raw)
            body = json.loads(raw)
            if body.get("project_id") != double.project_id:
                return jsend(None, 403, "Not a member of this project.")
            with double._lock:
                batch_id = f"batch-{next(double._ids)}"
                jobs = []
                for spec in body["jobs"]:
                    job_id = f"job-{next(double._ids)}"
                    job = {
                        "id": job_id,
                        "batch_id": batch_id,
                        "project_id": double.project_id,
                        "runs": spec["runs"],
                        "status": "PENDING",
                        "created_at": now(),
                        "updated_at": now(),
                        "errors": [],
                        "start_timestamp": None,
                        "end_timestamp": None,
                        "variables": None,
                        "sequence": body["sequence_builder"],
                    }
                    double.jobs[job_id] = job
                    jobs.append(job)
                batch = {
                    "id": batch_id,
                    "open": bool(body.get("open")),
                    "complete": not body.get("open"),
                    "created_at": now(),
                    "updated_at": now(),
                    "device_type": body.get("device_type") or "FRESNEL",
                    "project_id": double.project_id,
                    "user_id": "user-1",
                    "status": "PENDING",
                    "tags": body.get("tags") or [],
                    "sequence_builder": body["sequence_builder"],
                }
                double.batches[batch_id] = batch
                return jsend({**batch, "jobs": [dict(j) for j in jobs]})

        @app.get("/core-fast/api/v1/batches")
        def list_batches():
            tag = request.args.get("tag")
            found = [
                {**b, "jobs": [dict(j) for j in double.jobs.values() if j["batch_id"] == b["id"]]}
                for b in double.batches.values()
                if tag is None or tag in b["tags"]
            ]
            return jsend(found, pagination={"total": len(found), "start": 0, "end": len(found)})

        @app.get("/core-fast/api/v2/jobs/<job_id>")
        def get_job(job_id):
            with double._lock:
                job = double.jobs.get(job_id)
                if job is None:
                    return jsend(None, 404, "Job not found.")
                if job["status"] == "PENDING":
                    job["status"] = "RUNNING"
                    job["start_timestamp"] = now()
                elif job["status"] == "RUNNING" and not double.hold:
                    double._end(job, "DONE")
                return jsend(dict(job))

        @app.get("/core-fast/api/v1/jobs/<job_id>/results_link")
        def results_link(job_id):
            job = double.jobs.get(job_id)
            if job is None:
                return jsend(None, 404, "Job not found.")
            link = f"{double.url}/results/{job_id}" if job["status"] == "DONE" else None
            return jsend({"results_link": link})

        @app.get("/results/<job_id>")
        def results(job_id):
            job = double.jobs[job_id]
            atoms = len(json.loads(job["sequence"])["register"])
            runs = job["runs"]
            counter = {"0" * atoms: runs - runs // 2, "1" * atoms: runs // 2}
            return jsonify({"counter": {k: v for k, v in counter.items() if v}, "raw": []})

        @app.patch("/core-fast/api/v2/jobs/<job_id>/cancel")
        def cancel(job_id):
            with double._lock:
                job = double.jobs.get(job_id)
                if job is None:
                    return jsend(None, 404, "Job not found.")
                if job["status"] in ("DONE", "ERROR", "CANCELED"):
                    return jsend({"description": f"Job is {job['status']}: cannot cancel."}, 400, "Bad request")
                double._end(job, "CANCELED")
                return jsend(dict(job))

        return app
