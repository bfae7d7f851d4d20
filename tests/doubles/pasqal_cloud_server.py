"""A local double of Pasqal Cloud's API, driven through the real ``pasqal-cloud`` SDK.

What the SDK (0.24) calls, with its shapes: the password grant at ``/oauth/token`` (form data,
answers ``{"access_token", "expires_in"}``), then with ``Authorization: Bearer``:
``POST /core-fast/api/v1/batches`` (gzip body) → the batch with its ``jobs``;
``POST /core-fast/api/v2/batches/{id}/jobs`` (gzip) → the batch with all its jobs (409 once the
batch is closed or timed out); ``PATCH /core-fast/api/v2/batches/{id}/complete`` closes it;
``GET /core-fast/api/v2/batches/{id}`` (no jobs) and ``GET /core-fast/api/v2/jobs?batch_id=…``
(paginated); ``GET /core-fast/api/v1/batches?tag=…`` (paginated); ``GET /core-fast/api/v2/jobs/{id}``
(with its ``sequence``); ``GET /core-fast/api/v1/jobs/{id}/results_link`` → a link whose
document holds ``counter``; ``PATCH /core-fast/api/v2/jobs/{id}/cancel``;
``GET /core-fast/api/v1/devices/specs`` → ``{device type: specs JSON string}``. Every answer is a
JSend envelope.

Jobs move one step per read: PENDING → RUNNING → DONE (``fail_next``: ERROR, ``hold``: stay
RUNNING). A job's sequence is its own (``sequence`` in the job) or its batch's. Cancelling a
finished job answers 400. ``time_out(batch_id)`` ends an open batch as Pasqal Cloud does when no
job comes. ``fault(path_part, status, times, method)`` injects errors; ``drop(path_part, …)``
carries a request out and loses its answer.

``CloudApi`` is the state and the rules, without a transport; ``CloudDouble`` serves it over HTTP
on loopback (Flask), and ``tests/doubles/pasqal_cloud_mock.py`` serves the same state through the
SDK's own ``BaseMockServer`` (requests-mock, in process).
"""

from __future__ import annotations

import gzip
import itertools
import json
import logging
import threading
import uuid
from datetime import UTC, datetime

from tests.doubles.pasqal_qpu_server import Fault, analog_device_specs

logging.getLogger("werkzeug").setLevel(logging.ERROR)

ENDED = ("DONE", "ERROR", "CANCELED")


def now() -> str:
    return datetime.now(UTC).isoformat()


def jsend(data, code=200, message="OK.", **extra) -> tuple[dict, int]:
    status = "success" if code < 400 else "fail"
    return {"status": status, "code": code, "message": message, "data": data, **extra}, code


class CloudApi:
    """Pasqal Cloud's batches and jobs, as the SDK sees them. Each route method takes what the
    request carried and returns ``(JSend body, HTTP status)``."""

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

    # -- what tests use ----------------------------------------------------------------------
    def fault(self, path_part, *, status=503, times=1, method=None):
        self.faults.append(Fault(path_part, method, status, times))

    def drop(self, path_part, *, times=1, method=None):
        self.faults.append(Fault(path_part, method, None, times, drop=True))

    def creations(self) -> int:
        return sum(1 for method, path in self.calls if method == "POST" and path.endswith("/batches"))

    def additions(self) -> int:
        return sum(1 for method, path in self.calls if method == "POST" and path.endswith("/jobs"))

    def finish(self, job_id: str, status: str = "DONE") -> None:
        with self._lock:
            self._end(self.jobs[job_id], status)

    def time_out(self, batch_id: str) -> None:
        with self._lock:
            batch = self.batches[batch_id]
            batch["open"], batch["complete"], batch["status"] = False, True, "TIMED_OUT"

    def jobs_of(self, batch_id: str) -> list[dict]:
        return [j for j in self.jobs.values() if j["batch_id"] == batch_id]

    # -- the transport's part ----------------------------------------------------------------
    def take_fault(self, method: str, path: str, *, drop: bool) -> Fault | None:
        for fault in self.faults:
            if fault.times <= 0 or fault.drop != drop or fault.path_part not in path:
                continue
            if fault.method and fault.method != method:
                continue
            fault.times -= 1
            return fault
        return None

    def config(self, **extra) -> dict:
        """A device ``config`` for this project and its account (the transport adds endpoints)."""
        return {
            "project_id": self.project_id,
            "device_type": "FRESNEL",
            "username_env": "GRIDGATE_CRED_CLOUD_USER",
            "password_env": "GRIDGATE_CRED_CLOUD_PASSWORD",
            **extra,
        }

    def authorized(self, header: str | None) -> bool:
        return header == f"Bearer {self.token}"

    @staticmethod
    def body(raw: bytes, encoding: str | None):
        return json.loads(gzip.decompress(raw) if encoding == "gzip" else raw)

    # -- routes ------------------------------------------------------------------------------
    def sign_in(self, form: dict) -> tuple[dict, int]:
        if (form.get("username"), form.get("password")) != (self.username, self.password):
            return {"error": "invalid_grant", "error_description": "Wrong email or password."}, 403
        return {"access_token": self.token, "expires_in": 3600, "token_type": "Bearer"}, 200

    def device_specs(self):
        return jsend(dict(self.specs))

    def create_batch(self, body: dict):
        if body.get("project_id", self.project_id) != self.project_id:
            return jsend(None, 403, "Not a member of this project.")
        with self._lock:
            batch_id = f"batch-{next(self._ids)}"
            self.batches[batch_id] = {
                "id": batch_id,
                "open": bool(body.get("open")),
                "complete": not body.get("open"),
                "created_at": now(),
                "updated_at": now(),
                "device_type": body.get("device_type") or "FRESNEL",
                "project_id": self.project_id,
                "user_id": "user-1",
                "status": "PENDING",
                "tags": body.get("tags") or [],
                "sequence_builder": body.get("sequence_builder"),
            }
            self._add(batch_id, body["jobs"])
            return jsend(self._with_jobs(batch_id))

    def add_jobs(self, batch_id: str, jobs: list[dict]):
        with self._lock:
            batch = self.batches.get(batch_id)
            if batch is None:
                return jsend(None, 404, "Batch not found.")
            if not batch["open"]:
                return jsend({"description": f"Batch is {batch['status']} and closed."}, 409, "Conflict")
            self._add(batch_id, jobs)
            return jsend(self._with_jobs(batch_id))

    def close_batch(self, batch_id: str):
        with self._lock:
            batch = self.batches.get(batch_id)
            if batch is None:
                return jsend(None, 404, "Batch not found.")
            batch["open"], batch["complete"] = False, True
            return jsend(dict(batch))

    def get_batch(self, batch_id: str):
        batch = self.batches.get(batch_id)
        return jsend(dict(batch)) if batch else jsend(None, 404, "Batch not found.")

    def list_jobs(self, batch_id: str | None):
        found = [self._lean(j) for j in self.jobs.values() if batch_id is None or j["batch_id"] == batch_id]
        return jsend(found, pagination={"total": len(found), "start": 0, "end": len(found)})

    def list_batches(self, tag: str | None):
        found = [self._with_jobs(b["id"]) for b in self.batches.values() if tag is None or tag in b["tags"]]
        return jsend(found, pagination={"total": len(found), "start": 0, "end": len(found)})

    def get_job(self, job_id: str):
        with self._lock:
            job = self.jobs.get(job_id)
            if job is None:
                return jsend(None, 404, "Job not found.")
            if job["status"] == "PENDING":
                job["status"] = "RUNNING"
                job["start_timestamp"] = now()
            elif job["status"] == "RUNNING" and not self.hold:
                self._end(job, "DONE")
            return jsend(dict(job))

    def results_link(self, job_id: str, base: str):
        job = self.jobs.get(job_id)
        if job is None:
            return jsend(None, 404, "Job not found.")
        return jsend({"results_link": f"{base}/results/{job_id}" if job["status"] == "DONE" else None})

    def results(self, job_id: str) -> tuple[dict, int]:
        job = self.jobs[job_id]
        atoms = len(json.loads(job["sequence"])["register"])
        runs = job["runs"]
        counter = {"0" * atoms: runs - runs // 2, "1" * atoms: runs // 2}
        return {"counter": {k: v for k, v in counter.items() if v}, "raw": []}, 200

    def cancel_job(self, job_id: str):
        with self._lock:
            job = self.jobs.get(job_id)
            if job is None:
                return jsend(None, 404, "Job not found.")
            if job["status"] in ENDED:
                return jsend({"description": f"Job is {job['status']}: cannot cancel."}, 400, "Bad request")
            self._end(job, "CANCELED")
            return jsend(dict(job))

    # -- state -------------------------------------------------------------------------------
    def _add(self, batch_id: str, jobs: list[dict]) -> None:
        for spec in jobs:
            job_id = f"job-{next(self._ids)}"
            self.jobs[job_id] = {
                "id": job_id,
                "batch_id": batch_id,
                "project_id": self.project_id,
                "runs": spec["runs"],
                "status": "PENDING",
                "created_at": now(),
                "updated_at": now(),
                "errors": [],
                "start_timestamp": None,
                "end_timestamp": None,
                "variables": spec.get("variables"),
                "sequence": spec.get("sequence") or self.batches[batch_id]["sequence_builder"],
            }

    def _lean(self, job: dict) -> dict:
        return {k: v for k, v in job.items() if k != "sequence"}

    def _with_jobs(self, batch_id: str) -> dict:
        return {**self.batches[batch_id], "jobs": [self._lean(j) for j in self.jobs_of(batch_id)]}

    def _end(self, job: dict, status: str) -> None:
        if status == "DONE" and self.fail_next:
            self.fail_next -= 1
            status = "ERROR"
        job["status"] = status
        job["start_timestamp"] = job["start_timestamp"] or now()
        job["end_timestamp"] = job["updated_at"] = now()
        if status == "ERROR":
            job["errors"] = ["Calibration drift: the run was aborted."]
        batch = self.batches[job["batch_id"]]
        if not batch["open"] and all(j["status"] in ENDED for j in self.jobs_of(batch["id"])):
            batch["status"] = status


class CloudDouble(CloudApi):
    """``CloudApi`` over HTTP on loopback: the SDK's own transport end to end."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._server = None
        self.app = self._make_app()

    def start(self):
        from werkzeug.serving import make_server

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
        return super().config(
            endpoint=f"{self.url}/core-fast",
            account_endpoint=f"{self.url}/account",
            token_endpoint=f"{self.url}/oauth/token",
            **extra,
        )

    def _make_app(self):
        import socket

        from flask import Flask, jsonify, request

        app = Flask("pasqal-cloud-double")
        api = self

        def answer(reply):
            body, code = reply
            return jsonify(body), code

        def body():
            return api.body(request.get_data(), request.headers.get("Content-Encoding"))

        @app.before_request
        def before():
            api.calls.append((request.method, request.path))
            if request.path.startswith("/results/"):
                return None  # a presigned link: no bearer token
            if request.path != "/oauth/token" and not api.authorized(request.headers.get("Authorization")):
                return answer(jsend(None, 401, "Unauthorized"))
            fault = api.take_fault(request.method, request.path, drop=False)
            if fault is not None:
                return answer(jsend(None, fault.status, f"injected fault {fault.status}"))
            return None

        @app.after_request
        def after(response):
            if api.take_fault(request.method, request.path, drop=True) is not None:
                sock = request.environ.get("werkzeug.socket")
                if sock is not None:
                    sock.shutdown(socket.SHUT_RDWR)
            return response

        routes = [
            ("POST", "/oauth/token", lambda: answer(api.sign_in(request.form))),
            ("GET", "/core-fast/api/v1/devices/specs", lambda: answer(api.device_specs())),
            ("POST", "/core-fast/api/v1/batches", lambda: answer(api.create_batch(body()))),
            ("GET", "/core-fast/api/v1/batches", lambda: answer(api.list_batches(request.args.get("tag")))),
            ("GET", "/core-fast/api/v2/batches/<batch_id>", lambda batch_id: answer(api.get_batch(batch_id))),
            (
                "POST",
                "/core-fast/api/v2/batches/<batch_id>/jobs",
                lambda batch_id: answer(api.add_jobs(batch_id, body())),
            ),
            (
                "PATCH",
                "/core-fast/api/v2/batches/<batch_id>/complete",
                lambda batch_id: answer(api.close_batch(batch_id)),
            ),
            ("GET", "/core-fast/api/v2/jobs", lambda: answer(api.list_jobs(request.args.get("batch_id")))),
            ("GET", "/core-fast/api/v2/jobs/<job_id>", lambda job_id: answer(api.get_job(job_id))),
            ("PATCH", "/core-fast/api/v2/jobs/<job_id>/cancel", lambda job_id: answer(api.cancel_job(job_id))),
            (
                "GET",
                "/core-fast/api/v1/jobs/<job_id>/results_link",
                lambda job_id: answer(api.results_link(job_id, api.url)),
            ),
            ("GET", "/results/<job_id>", lambda job_id: answer(api.results(job_id))),
        ]
        for number, (method, rule, view) in enumerate(routes):
            app.add_url_rule(rule, f"route-{number}", view, methods=[method])
        return app
