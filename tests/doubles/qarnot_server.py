"""A local Qarnot API double plus moto's S3 server as its storage, for the real qarnot SDK.

Both listen on 127.0.0.1 at ports chosen at runtime. A submitted task really runs: its resource
buckets are copied into a scratch directory, ``DOCKER_CMD`` runs there as a local process with
the constants as environment, files matching the periodic snapshot whitelist are pushed to the
results bucket while it runs, and everything it created or changed (minus the results blacklist)
is uploaded when it ends. States follow Qarnot's: Submitted → FullyExecuting → UploadingResults
→ Success/Failure, Cancelled on abort.

Faults: ``fault(path_part, status=…, times=…, delay=…, after=…)`` as in the FirecREST double
(5xx, 429, timeouts, a submission carried out whose answer is delayed); ``user`` holds what
``/info`` reports (bucket count limit, storage quota) for quota tests; ``abort`` of a finished
task answers 403 "Invalid operation on non-running task" as the real API does.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid as uuidlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import boto3
from flask import Flask, jsonify, request
from moto.server import ThreadedMotoServer
from werkzeug.serving import make_server

from tests.doubles.firecrest_server import Fault, _matches


@dataclass
class Task:
    uuid: str
    body: dict
    state: str = "Submitted"
    stdout: str = ""
    stderr: str = ""
    stdout_sent: int = 0
    stderr_sent: int = 0
    snapshot_interval: int | None = None
    snapshot_whitelist: str | None = None
    proc: subprocess.Popen | None = None
    created: datetime = field(default_factory=lambda: datetime.now(UTC))
    started: float | None = None
    ended: float | None = None
    errors: list = field(default_factory=list)


class QarnotDouble:
    def __init__(self, *, token: str = "qarnot-TOKEN-value-9f8e7d", profiles=("docker-batch",), catalogue=None):  # noqa: S107, E501
        self.token = token
        self.profiles = list(profiles)
        self.catalogue = (
            catalogue
            if catalogue is not None
            else [
                {"discriminator": "MinimumCoreHardwareConstraint", "coreCount": 1},
                {"discriminator": "MinimumCoreHardwareConstraint", "coreCount": 4},
                {"discriminator": "SpecificHardwareConstraint", "specificationKey": "8c-32g-amd-rome"},
                {"discriminator": "SpecificHardwareConstraint", "specificationKey": "16c-64g-intel"},
            ]
        )
        self.user = {"email": "gridgate@example.org", "maxBucket": 50, "quotaBytesBucket": 10 << 30}
        self.tasks: dict[str, Task] = {}
        self.faults: list[Fault] = []
        self.calls: list[tuple[str, str]] = []
        self.snapshot_tick = 0.2
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.s3_server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.app = self._build_app()
        self._server = None
        self._thread = None
        self._scratch = Path(tempfile.mkdtemp(prefix="qarnot-double-"))

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self):
        self.s3_server.start()
        host, port = self.s3_server.get_host_and_port()
        self.storage_url = f"http://{host}:{port}"
        self.s3 = boto3.client(
            "s3",
            endpoint_url=self.storage_url,
            aws_access_key_id="double",
            aws_secret_access_key="double",  # noqa: S106 - moto accepts anything
            region_name="us-east-1",
        )
        self._server = make_server("127.0.0.1", 0, self.app, threaded=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def reap(self):
        """Kill every task process still running (a test's finalizer: nothing outlives its test)."""
        for task in list(self.tasks.values()):
            if task.proc is not None and task.proc.poll() is None:
                try:
                    os.killpg(task.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def stop(self):
        for task in self.tasks.values():
            if task.proc is not None and task.proc.poll() is None:
                os.killpg(task.proc.pid, signal.SIGKILL)
        self._server.shutdown()
        self._thread.join(5)
        self.s3_server.stop()
        shutil.rmtree(self._scratch, ignore_errors=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    def fault(self, path_part, *, status=None, times=1, delay=0.0, after=False, method=None, body=None):
        self.faults.append(Fault(path_part, method, status, times, delay, after, body))

    def buckets(self) -> list[str]:
        return sorted(b["Name"] for b in self.s3.list_buckets().get("Buckets", []))

    def keys(self, bucket: str) -> list[str]:
        return sorted(o["Key"] for o in self.s3.list_objects_v2(Bucket=bucket).get("Contents", []))

    def wait_state(self, uuid: str, states, timeout: float = 20.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.tasks[uuid].state in states:
                return
            time.sleep(0.05)
        raise AssertionError(f"task {uuid} still {self.tasks[uuid].state}")

    # -- the task runner ------------------------------------------------------------------------
    def _run(self, task: Task):
        body = task.body
        work = self._scratch / task.uuid
        work.mkdir(parents=True)
        for resource in body.get("advancedResourceBuckets") or []:
            name = resource["bucketName"]
            for key in self.keys(name):
                target = work / key
                target.parent.mkdir(parents=True, exist_ok=True)
                self.s3.download_file(name, key, str(target))
        inputs = {p.relative_to(work).as_posix(): _md5(p) for p in work.rglob("*") if p.is_file()}
        constants = {c["key"]: c["value"] for c in body.get("constants") or []}
        env = {**os.environ, **{k: v for k, v in constants.items() if not k.startswith("DOCKER_")}}
        task.started = time.time()
        task.state = "FullyExecuting"
        task.proc = subprocess.Popen(
            shlex.split(constants.get("DOCKER_CMD", "true")),
            cwd=work,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        readers = [
            threading.Thread(target=self._pump, args=(task, task.proc.stdout, "stdout"), daemon=True),
            threading.Thread(target=self._pump, args=(task, task.proc.stderr, "stderr"), daemon=True),
        ]
        for reader in readers:
            reader.start()
        while task.proc.poll() is None:
            if task.snapshot_interval and task.snapshot_whitelist:
                self._upload(task, work, inputs, whitelist=task.snapshot_whitelist)
            time.sleep(self.snapshot_tick)
        for reader in readers:
            reader.join(5)
        if task.state == "Cancelled":
            task.ended = time.time()
            return
        task.state = "UploadingResults"
        self._upload(task, work, inputs, blacklist=body.get("resultsBlacklist"))
        task.ended = time.time()
        if task.proc.returncode == 0:
            task.state = "Success"
        else:
            task.errors = [{"code": "TaskFailed", "message": f"exit code {task.proc.returncode}"}]
            task.state = "Failure"

    def _pump(self, task: Task, stream, name: str):
        for line in iter(stream.readline, b""):
            with self._lock:
                setattr(task, name, getattr(task, name) + line.decode("utf-8", "replace"))

    def _upload(self, task: Task, work: Path, inputs: dict, whitelist=None, blacklist=None):
        bucket = task.body.get("resultBucket")
        if not bucket:
            return
        for path in sorted(work.rglob("*")):
            if not path.is_file() or path.is_symlink():
                continue
            rel = path.relative_to(work).as_posix()
            if whitelist and not re.search(whitelist, rel):
                continue
            if blacklist and re.search(blacklist, rel):
                continue
            if inputs.get(rel) == _md5(path):
                continue  # Qarnot sends back what the task created or changed
            self.s3.upload_file(str(path), bucket, rel)

    # -- the application ------------------------------------------------------------------------
    def _task_json(self, task: Task) -> dict:
        body = task.body
        end = task.ended or time.time()
        elapsed = int(end - task.started) if task.started else 0
        return {
            **body,
            "uuid": task.uuid,
            "state": task.state,
            "creationDate": task.created.strftime("%Y-%m-%dT%H:%M:%SZ"),  # the SDK needs this format
            "errors": task.errors,
            "runningCoreCount": 4 if task.state == "FullyExecuting" else 0,
            "executionTime": f"00:00:{elapsed:02d}",
            "snapshotInterval": task.snapshot_interval,
            "resourceBuckets": [],
        }

    def _build_app(self) -> Flask:  # noqa: C901 - one route table, read top to bottom
        app = Flask("qarnot-double")
        double = self

        def fault(after: bool):
            for item in double.faults:
                if item.times <= 0 or item.after != after or not _matches(item.path_part, request.path):
                    continue
                if item.method and item.method != request.method:
                    continue
                item.times -= 1
                if item.delay:
                    time.sleep(item.delay)
                if item.status:
                    return jsonify(item.body or {"message": f"injected fault {item.status}"}), item.status
                return None
            return None

        @app.before_request
        def before():
            with double._lock:
                double.calls.append((request.method, request.path))
            answer = fault(after=False)
            if answer is not None:
                return answer
            if request.headers.get("Authorization") != double.token:
                return jsonify({"message": "Unauthorized"}), 401
            return None

        @app.after_request
        def after(response):
            delayed = fault(after=True)
            return app.make_response(delayed) if delayed is not None else response

        def task_or_404(uuid):
            task = double.tasks.get(uuid)
            if task is None:
                return None, (jsonify({"message": "No such task"}), 404)
            return task, None

        @app.get("/settings")
        def settings():
            return jsonify({"storage": double.storage_url})

        @app.get("/info")
        def info():
            used = 0
            names = double.buckets()
            for name in names:
                used += sum(o["Size"] for o in double.s3.list_objects_v2(Bucket=name).get("Contents", []))
            return jsonify({"bucketCount": len(names), "usedQuotaBytesBucket": used, **double.user})

        @app.get("/profiles")
        def profiles():
            return jsonify(double.profiles)

        @app.get("/hardware-constraints")
        def constraints():
            limit = int(request.args.get("limit", 50))
            offset = int(request.args.get("offset", 0))
            data = double.catalogue[offset : offset + limit]
            return jsonify({"total": len(double.catalogue), "limit": limit, "offset": offset, "data": data})

        @app.post("/tasks")
        def submit():
            body = request.get_json()
            if body.get("profile") not in double.profiles:
                return jsonify({"message": f"Profile {body.get('profile')} not found"}), 400
            for constraint in body.get("hardwareConstraints") or []:
                if constraint not in double.catalogue:
                    return jsonify({"message": "Some constraints don't exist"}), 400
            for name in [b["bucketName"] for b in body.get("advancedResourceBuckets") or []] + [
                body.get("resultBucket")
            ]:
                if name and name not in double.buckets():
                    return jsonify({"message": f"bucket {name} not found"}), 404
            task = Task(uuid=str(uuidlib.uuid4()), body=body)
            double.tasks[task.uuid] = task
            threading.Thread(target=double._run, args=(task,), daemon=True).start()
            return jsonify({"uuid": task.uuid}), 201

        @app.post("/tasks/paginate")
        def paginate():
            text = str(request.get_json().get("filter"))
            data = [double._task_json(t) for t in double.tasks.values() if any(tag in text for tag in t.body["tags"])]
            return jsonify({"data": data, "isTruncated": False, "nextToken": None})

        @app.get("/tasks/<uuid>")
        def retrieve(uuid):
            task, missing = task_or_404(uuid)
            return missing or jsonify(double._task_json(task))

        @app.delete("/tasks/<uuid>")
        def delete(uuid):
            double.tasks.pop(uuid, None)
            return "", 204

        @app.route("/tasks/<uuid>/<stream>", methods=["GET", "POST"])
        def output(uuid, stream):
            task, missing = task_or_404(uuid)
            if missing or stream not in ("stdout", "stderr"):
                return missing or (jsonify({"message": "not found"}), 404)
            with double._lock:
                text = getattr(task, stream)
                if request.method == "GET":
                    return text
                sent = getattr(task, f"{stream}_sent")
                setattr(task, f"{stream}_sent", len(text))
                return text[sent:]  # fresh_*: what was written since the previous call

        @app.post("/tasks/<uuid>/abort")
        def abort(uuid):
            task, missing = task_or_404(uuid)
            if missing:
                return missing
            if task.state in ("Success", "Failure", "Cancelled"):
                return jsonify({"message": "Invalid operation on non-running task"}), 403
            task.state = "Cancelled"
            if task.proc is not None and task.proc.poll() is None:
                os.killpg(task.proc.pid, signal.SIGTERM)
            return "", 200

        @app.post("/tasks/<uuid>/snapshot/periodic")
        def snapshot(uuid):
            task, missing = task_or_404(uuid)
            if missing:
                return missing
            body = request.get_json() or {}
            task.snapshot_interval = int(body.get("interval") or 0)
            task.snapshot_whitelist = body.get("whitelist")
            return "", 200

        return app


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes(), usedforsecurity=False).hexdigest()
