"""A local Run:AI control-plane double, for the real runapy client (docs/backends.md, "runai").

Listens on 127.0.0.1 at a port chosen at runtime and serves what the backend calls, as Run:AI's
published REST reference describes it:

- ``POST /api/v2/token`` (form: ``grant_type=client_credentials``, ``client_id``,
  ``client_secret``) → ``{access_token, token_type, expires_in}``; the token is a JWT whose
  claims carry ``sub``, ``email`` and ``exp``. The deprecated ``/api/v1/token`` is not served;
- ``GET /api/v1/org-unit/projects`` (``filterBy=name==…``) → ``{projects: [{id, name, clusterId,
  resources: [{nodePool: {id, name}, …}], defaultNodePools}]}``;
- ``GET /api/v1/node-pools`` → ``{nodePools: [...]}``; ``GET /api/v1/clusters`` → a list;
- ``POST /api/v1/workloads/trainings`` → 202 ``{workloadId, name, actualPhase: Creating, …}``;
  the spec is checked as Run:AI does (name a Kubernetes name unique in the project, the project
  and cluster known, node pools of the project, a GPU portion only with ``gpuRequestType:
  portion`` and 0 < portion < 1, a hostPath mount);
- ``GET /api/v1/workloads/{id}`` → ``{id, name, phase, phaseMessage, totalRunningTimeSeconds,
  allocatedResources, …}``; a deleted workload is 404 there and listed by ``GET
  /api/v1/workloads?deleted=true``; ``GET /api/v1/workloads?filterBy=name==…`` lists one's own;
- ``DELETE /api/v1/workloads/trainings/{id}`` → 202, the workload goes Deleting, then is gone.

A workload really runs: its ``hostPath`` directory stands for the mount (the container path of
``args`` and ``workingDir`` is translated to it, as a mount would), ``command args`` runs there as
a local process with the spec's environment, and phases go Creating → Pending → Initializing →
Running → Completed | Failed (``phaseMessage`` with the exit code). ``hold`` is a set of phases the
runner waits in; ``force_phase(id, phase)`` answers any phase (an unknown one included).

Tokens: ``clients`` maps client id → (secret, subject, e-mail); ``expire_tokens()`` makes every
token issued so far refused (401) before its ``exp``, as a revoked or clock-skewed one is;
``token_lifetime`` sets ``expires_in``/``exp``; ``revoke_client(id)`` deletes an access key (its
tokens refused too); ``expire_client(id)`` makes the token endpoint refuse a key whose secret
expired. Faults: ``fault(path_part, status=…, times=…, delay=…, after=…, method=…, headers=…)``
as in the other doubles (``after``: the request is carried out, then the fault answers).
``echo_credentials = n``: the next n error answers (a fault or a refusal) carry in their message
the credential the request presented (the form's ``client_secret`` at the token endpoint, the
bearer token elsewhere), as a gateway in debug mode or a careless proxy does: what reaches a user
must be scrubbed. **The owner check**: ``expect_owner(case id, subject)``: every call
naming the case's workload (by name or id) must carry a token of that subject, or it is refused
and recorded in ``violations`` (a test's finalizer asserts none).
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import re
import signal
import subprocess
import threading
import time
import uuid as uuidlib
from dataclasses import dataclass, field
from datetime import UTC, datetime

from flask import Flask, g, jsonify, request
from werkzeug.serving import make_server

from tests.doubles.firecrest_server import Fault, take_fault

NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
CLUSTER = "3f1a2b4c-5d6e-4f70-8a9b-0c1d2e3f4a5b"


@dataclass
class Workload:
    id: str
    name: str
    project: dict
    body: dict
    owner: str
    phase: str = "Creating"
    message: str = ""
    proc: subprocess.Popen | None = None
    started: float | None = None
    ended: float | None = None
    deleted: bool = False
    forced: str | None = None
    history: list = field(default_factory=lambda: ["Creating"])
    created: str = field(default_factory=lambda: datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))


def jwt(claims: dict) -> str:
    """An unsigned JWT (the API here checks its own table, not a signature). runapy reads the
    claims with ``b64decode`` (not the URL-safe alphabet): padded until no ``-``/``_`` appears,
    as real tokens happen to be often enough for runapy to work."""

    def part(data: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(data, separators=(",", ":")).encode()).decode().rstrip("=")

    body = dict(claims)
    for pad in range(64):
        encoded = part(body)
        if "-" not in encoded and "_" not in encoded:
            break
        body["p"] = "x" * (pad + 1)
    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(body)}.sig"


class RunaiDouble:
    def __init__(self, *, client_id="gridgate-svc", client_secret="runai-SVC-secret-6e5d4c", subject="svc-gridgate"):  # noqa: S107
        self.clients: dict[str, tuple[str, str, str]] = {client_id: (client_secret, subject, "gridgate@example.org")}
        self.tokens: dict[str, tuple[str, float]] = {}  # token → (subject, expiry)
        self.expired_clients: set[str] = set()
        self.token_lifetime = 3600
        self.projects = [
            {
                "id": "4",
                "name": "team-a",
                "clusterId": CLUSTER,
                "resources": [{"nodePool": {"id": 1, "name": "default"}}, {"nodePool": {"id": 2, "name": "a100"}}],
                "defaultNodePools": ["default"],
            },
            {
                "id": "7",
                "name": "team-b",
                "clusterId": CLUSTER,
                "resources": [{"nodePool": {"id": 1, "name": "default"}}],
                "defaultNodePools": ["default"],
            },
        ]
        self.node_pools = [
            {"id": 1, "name": "default", "clusterId": CLUSTER},
            {"id": 2, "name": "a100", "clusterId": CLUSTER},
        ]
        self.clusters = [{"uuid": CLUSTER, "name": "lab", "status": {"state": "Connected"}}]
        self.workloads: dict[str, Workload] = {}
        self.case_owners: dict[str, str] = {}
        self.violations: list[str] = []
        self.faults: list[Fault] = []
        self.calls: list[tuple[str, str]] = []
        self.token_requests = 0
        #: the next n error answers carry the raw request body (a form-encoded token request
        #: echoed, its secret percent-encoded), as a gateway in debug mode does
        self.echo_request_body = 0
        self.echo_credentials = 0
        self.tick = 0.05
        self.hold: set[str] = set()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.app = self._build_app()
        self._server = None

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self):
        self._server = make_server("127.0.0.1", 0, self.app, threaded=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def reap(self):
        for workload in list(self.workloads.values()):
            self._kill(workload)

    def stop(self):
        self.reap()
        self._server.shutdown()
        self._thread.join(5)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    def reset(self):
        self.reap()
        self.workloads.clear()
        self.faults.clear()
        self.calls.clear()
        self.case_owners.clear()
        self.violations.clear()
        self.hold = set()
        self.token_lifetime = 3600
        self.token_requests = 0
        self.echo_credentials = 0
        self.echo_request_body = 0
        self.expired_clients.clear()

    def add_client(self, client_id: str, secret: str, subject: str, email: str) -> None:
        self.clients[client_id] = (secret, subject, email)

    def revoke_client(self, client_id: str) -> None:
        """The access key was deleted in Run:AI's settings: no new token, and its tokens refused."""
        subject = self.clients.pop(client_id, ("", "", ""))[1]
        with self._lock:
            for token, (who, _expiry) in list(self.tokens.items()):
                if who == subject:
                    self.tokens.pop(token)

    def expire_client(self, client_id: str) -> None:
        """The access key's secret passed its expiry date: the token endpoint refuses it (401)
        while the key is still listed (the user renews it, or makes a new one)."""
        self.expired_clients.add(client_id)

    def expire_tokens(self) -> None:
        """Every token issued so far is refused from now on (before its ``exp``)."""
        with self._lock:
            self.tokens.clear()

    def expect_owner(self, case_id, subject: str) -> None:
        self.case_owners[str(case_id)] = subject

    def fault(self, path_part, *, status=None, times=1, delay=0.0, after=False, method=None, headers=None):
        self.faults.append(Fault(path_part, method, status, times, delay, after, headers=headers))

    def force_phase(self, workload_id: str, phase: str | None) -> None:
        self.workloads[workload_id].forced = phase

    def by_case(self, case_id) -> Workload:
        return next(w for w in self.workloads.values() if w.name == f"gg-{case_id}")

    def wait_phase(self, workload_id: str, phases, timeout: float = 60.0) -> None:
        from tests.backends.conftest import wait_until

        wait_until(
            lambda: self.workloads[workload_id].phase in phases, timeout=timeout, what=f"{workload_id} in {phases}"
        )

    # -- the runner ----------------------------------------------------------------------------
    def _enter(self, workload: Workload, phase: str) -> bool:
        with self._lock:
            if workload.phase in ("Deleting", "Stopped") or workload.deleted:
                return False
            workload.phase = phase
            workload.history.append(phase)
        while phase in self.hold and workload.phase == phase:
            time.sleep(0.02)
        return workload.phase == phase

    def _mounted(self, workload: Workload, path: str) -> str:
        """A container path as the process sees it: the hostPath mount translated."""
        for mount in (workload.body["spec"].get("storage") or {}).get("hostPath") or []:
            prefix = mount["mountPath"].rstrip("/")
            if path == prefix or path.startswith(prefix + "/"):
                return mount["path"] + path[len(prefix) :]
        return path

    def _run(self, workload: Workload):
        spec = workload.body["spec"]
        for phase in ("Pending", "Initializing"):
            time.sleep(self.tick)
            if not self._enter(workload, phase):
                return
        argv = [spec.get("command") or "/bin/sh"] + [
            self._mounted(workload, a) for a in (spec.get("args") or "").split()
        ]
        env = {"PATH": "/usr/bin:/bin"} | {e["name"]: e["value"] for e in spec.get("environmentVariables") or []}
        cwd = self._mounted(workload, spec.get("workingDir") or "/")
        with self._lock:
            if workload.phase != "Initializing":
                return
            try:
                workload.proc = subprocess.Popen(argv, cwd=cwd, env=env, start_new_session=True)  # noqa: S603
            except OSError as exc:
                workload.phase, workload.message = "Failed", f"container failed to start: {exc}"
                workload.history.append("Failed")
                return
            workload.started = time.time()
        if not self._enter(workload, "Running"):
            return
        code = workload.proc.wait()
        while "Running" in self.hold and workload.phase == "Running":
            time.sleep(0.02)
        with self._lock:
            workload.ended = time.time()
            if workload.phase != "Running":
                return  # deleted meanwhile
            if code == 0:
                workload.phase, workload.message = "Completed", ""
            else:
                workload.phase = "Failed"
                workload.message = f"Pod {workload.name}-0-0 failed: container exited with code {code}"
            workload.history.append(workload.phase)

    def _kill(self, workload: Workload):
        if workload.proc is not None and workload.proc.poll() is None:
            try:
                os.killpg(workload.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            workload.proc.wait(timeout=10)

    def _json(self, workload: Workload) -> dict:
        end = workload.ended or time.time()
        compute = workload.body["spec"].get("compute") or {}
        running = workload.phase == "Running"
        return {
            "id": workload.id,
            "name": workload.name,
            "type": "Training",
            "projectId": workload.project["id"],
            "projectName": workload.project["name"],
            "clusterId": workload.project["clusterId"],
            "phase": workload.forced or workload.phase,
            "phaseMessage": workload.message,
            "k8sPhase": "Running" if running else "",
            "runningPods": 1 if running else 0,
            "createdAt": workload.created,
            "submittedBy": workload.owner,
            "totalRunningTimeSeconds": int(end - workload.started) if workload.started else 0,
            "allocatedResources": {"cpu": compute.get("cpuCoreRequest"), "gpu": compute.get("gpuDevicesRequest")}
            if running
            else {},
            "requestedNodePools": workload.body["spec"].get("nodePools") or [],
        }

    # -- the application ------------------------------------------------------------------------
    def _build_app(self) -> Flask:  # noqa: C901 - one route table, read top to bottom
        app = Flask("runai-double")
        double = self

        def fault(after: bool):
            item = take_fault(double.faults, after)
            if item is None or not item.status:
                return None
            response = jsonify({"code": item.status, "message": f"injected fault {item.status}"})
            response.status_code = item.status
            for name, value in (item.headers or {}).items():
                response.headers[name] = value
            return response

        def error(status: int, message: str):
            return jsonify({"code": status, "message": message}), status

        def owner_problem(case_id: str | None) -> str | None:
            expected = double.case_owners.get(case_id or "")
            if expected is None or g.subject == expected:
                return None
            problem = (
                f"{request.method} {request.path}: case {case_id} belongs to {expected}, the call came from {g.subject}"
            )
            double.violations.append(problem)
            return problem

        def case_of(name: str) -> str | None:
            return name[3:] if name.startswith("gg-") else None

        @app.before_request
        def before():
            with double._lock:
                double.calls.append((request.method, request.path))
            answer = fault(after=False)
            if answer is not None:
                return answer
            if request.path == "/api/v2/token":
                return None
            header = request.headers.get("Authorization", "")
            entry = double.tokens.get(header[7:]) if header.startswith("Bearer ") else None
            if entry is None or entry[1] < time.time():
                return error(401, "Unauthorized: invalid or expired token")
            g.subject = entry[0]
            return None

        def echoed(response):
            """The error answer with the request's credential in its message."""
            if request.path == "/api/v2/token":
                credential = request.form.get("client_secret", "")
            else:
                credential = request.headers.get("Authorization", "").removeprefix("Bearer ")
            body = response.get_json(silent=True)
            body = body if isinstance(body, dict) else {}
            key = next((k for k in ("message", "error_description") if k in body), "message")
            body[key] = f"{body.get(key, '')} (request credential: {credential})".strip()
            response.set_data(json.dumps(body))
            response.mimetype = "application/json"
            return response

        @app.after_request
        def after(response):
            delayed = fault(after=True)
            response = delayed if delayed is not None else response
            if response.status_code >= 400 and double.echo_credentials > 0:
                with double._lock:
                    double.echo_credentials -= 1
                response = echoed(response)
            if response.status_code >= 400 and double.echo_request_body > 0:
                with double._lock:
                    double.echo_request_body -= 1
                body = response.get_json(silent=True)
                body = body if isinstance(body, dict) else {}
                body["message"] = f"{body.get('message', '')} (request: {request.get_data(as_text=True)})".strip()
                response.set_data(json.dumps(body))
                response.mimetype = "application/json"
            return response

        @app.post("/api/v2/token")
        def token():
            form = request.form
            double.token_requests += 1
            if form.get("grant_type") != "client_credentials":
                return jsonify({"error": "unsupported_grant_type"}), 400
            entry = double.clients.get(form.get("client_id", ""))
            if entry is None or entry[0] != form.get("client_secret"):
                return jsonify({"error": "invalid_client", "error_description": "Invalid client credentials"}), 401
            if form.get("client_id") in double.expired_clients:
                return jsonify({"error": "invalid_client", "error_description": "Client secret has expired"}), 401
            _secret, subject, email = entry
            expiry = time.time() + double.token_lifetime
            value = jwt({"sub": subject, "email": email, "exp": int(expiry), "jti": uuidlib.uuid4().hex})
            with double._lock:
                double.tokens[value] = (subject, expiry)
            return jsonify({"access_token": value, "token_type": "Bearer", "expires_in": double.token_lifetime})

        @app.get("/api/v1/org-unit/projects")
        def projects():
            wanted = [f[len("name==") :] for f in request.args.get("filterBy", "").split(",") if f.startswith("name==")]
            found = [p for p in double.projects if not wanted or p["name"] in wanted]
            return jsonify({"projects": found, "next": 0})

        @app.get("/api/v1/node-pools")
        def node_pools():
            return jsonify({"nodePools": double.node_pools})

        @app.get("/api/v1/clusters")
        def clusters():
            return jsonify(double.clusters)

        @app.post("/api/v1/workloads/trainings")
        def create():
            body = request.get_json(silent=True) or {}
            name = str(body.get("name") or "")
            if owner_problem(case_of(name)):
                return error(403, "Forbidden: not your project")
            spec = body.get("spec") or {}
            if not NAME.fullmatch(name) or len(name) > 63:
                return error(400, f"name {name!r} must be a lowercase Kubernetes name")
            project = next((p for p in double.projects if p["id"] == str(body.get("projectId"))), None)
            if project is None:
                return error(400, f"project {body.get('projectId')} not found")
            if body.get("clusterId") != project["clusterId"]:
                return error(400, "the project is not in that cluster")
            pools = [r["nodePool"]["name"] for r in project["resources"]]
            for pool in spec.get("nodePools") or []:
                if pool not in pools:
                    return error(400, f"node pool {pool} is not assigned to project {project['name']}")
            compute = spec.get("compute") or {}
            if compute.get("gpuPortionRequest") is not None:  # null: not asked (runapy sends nulls)
                portion = compute["gpuPortionRequest"]
                if compute.get("gpuRequestType") != "portion" or not 0 < portion < 1:
                    return error(400, "gpuPortionRequest needs gpuRequestType 'portion' and 0 < value < 1")
            mounts = (spec.get("storage") or {}).get("hostPath") or []
            if not mounts or not all(m.get("path", "").startswith("/") and m.get("mountPath") for m in mounts):
                return error(400, "this double runs workloads from a hostPath mount only")
            if not spec.get("image"):
                return error(400, "spec.image is required")
            with double._lock:
                if any(w.name == name and w.project is project and not w.deleted for w in double.workloads.values()):
                    return error(409, f"a workload named {name} already exists in project {project['name']}")
                workload = Workload(str(uuidlib.uuid4()), name, project, body, g.subject)
                double.workloads[workload.id] = workload
            threading.Thread(target=double._run, args=(workload,), daemon=True).start()
            answer = {
                "workloadId": workload.id,
                "name": name,
                "requestedName": name,
                "projectId": project["id"],
                "clusterId": project["clusterId"],
                "createdBy": g.subject,
                "createdAt": workload.created,
                "desiredPhase": "Running",
                "actualPhase": "Creating",
                "spec": spec,
            }
            return jsonify(answer), 202

        def visible(workload: Workload, deleted: bool) -> bool:
            return workload.owner == g.subject and workload.deleted == deleted

        @app.get("/api/v1/workloads")
        def listing():
            deleted = request.args.get("deleted") == "true"
            wanted = [f[len("name==") :] for f in request.args.get("filterBy", "").split(",") if f.startswith("name==")]
            for name in wanted:
                if owner_problem(case_of(name)):
                    return error(403, "Forbidden")
            found = [
                double._json(w)
                for w in list(double.workloads.values())
                if visible(w, deleted) and (not wanted or w.name in wanted)
            ]
            return jsonify({"workloads": found, "next": 0})

        @app.get("/api/v1/workloads/<workload_id>")
        def one(workload_id):
            workload = double.workloads.get(workload_id)
            if workload is not None and owner_problem(case_of(workload.name)):
                return error(404, "workload not found")
            if workload is None or not visible(workload, False):
                return error(404, f"workload {workload_id} not found")
            return jsonify(double._json(workload))

        @app.delete("/api/v1/workloads/trainings/<workload_id>")
        def delete(workload_id):
            workload = double.workloads.get(workload_id)
            if workload is not None and owner_problem(case_of(workload.name)):
                return error(404, "workload not found")
            if workload is None or not visible(workload, False):
                return error(404, f"workload {workload_id} not found")
            with double._lock:
                workload.phase = "Deleting"
                workload.history.append("Deleting")
            double._kill(workload)

            def gone():
                time.sleep(double.tick)
                with double._lock:
                    workload.deleted = True
                    workload.ended = workload.ended or time.time()

            threading.Thread(target=gone, daemon=True).start()
            return jsonify({"code": 202, "message": "Request to delete the workload was accepted"}), 202

        return app
