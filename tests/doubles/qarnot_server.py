"""A local Qarnot API double plus moto's S3 server as its storage, for the real qarnot SDK.

Both listen on 127.0.0.1 at ports chosen at runtime. A submitted task really runs: its resource
buckets are copied into a scratch directory, ``DOCKER_CMD`` runs there as a local process with
the constants as environment, files matching the periodic snapshot whitelist are pushed to the
results bucket while it runs, and everything it created or changed (minus the results blacklist)
is uploaded when it ends (the whole working directory minus the results blacklist, unchanged
inputs included, with boto3's multipart uploads above 8 MB).

Faults: ``fault(path_part, status=…, times=…, delay=…, after=…)`` as in the FirecREST double
(5xx, 429, timeouts, a submission carried out whose answer is delayed); ``user`` holds what
``/info`` reports (bucket count limit, storage quota) for quota tests.

What Qarnot does (PROVIDERS.md, "Qarnot as the SDK … describe it") and this double reproduces,
each pinned by a test in ``tests/backends/test_qarnot_double.py``:

- states Submitted → PartiallyDispatched → FullyDispatched → PartiallyExecuting → FullyExecuting
  → UploadingResults → Success | Failure; an abort goes through PendingCancel to Cancelled and is
  never undone (an abort while Submitted or UploadingResults ends Cancelled, not Success);
  ``hold`` is a set of states the runner waits in (for tests of those windows);
- failures are per instance in ``completedInstances[*].state/error``: no invented ``errors``;
- ``abort`` of a finished task answers 403 "Invalid operation on non-running task";
- tag filters are exact (``Equal`` on ``Tags``), task pages are truncated at ``page_size`` with
  ``isTruncated``/``nextToken``;
- the storage quota (``user["quotaBytesBucket"]``) is enforced by the S3 storage itself: an upload
  past it answers ``QuotaExceeded`` in the middle of the upload;
- ``max_tasks``: a submission past it answers 403 "Maximum number of tasks reached";
  ``credits = False``: 402 "not enough credits".

Accounts (per-user tokens, docs/backends.md "Per-user credentials"): ``accounts`` maps each API
token to its account (an e-mail, what ``/info`` answers and S3's access key id); ``add_account``
and ``revoke(token)`` (401 from then on, as a token deleted in the console). A task belongs to the
account that submitted it: another account's calls about it are answered 404, and listings show
only one's own. **The owner check**: ``expect_owner(case id, e-mail)``: every API call naming the
case's task (by name or uuid) and every storage request on its buckets must come from that
account, or it is refused and recorded in ``violations`` (a test's finalizer asserts none).
"""

from __future__ import annotations

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
from flask import Flask, g, jsonify, request
from moto.core.models import DEFAULT_ACCOUNT_ID
from moto.s3.models import s3_backends
from moto.server import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import make_server
from werkzeug.wrappers import Request as WsgiRequest
from werkzeug.wrappers import Response as WsgiResponse

from tests.doubles.firecrest_server import Fault, take_fault


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
    completed: list = field(default_factory=list)
    previous_state: str | None = None
    history: list = field(default_factory=lambda: ["Submitted"])
    runner: threading.Thread | None = None
    owner: str | None = None  # the account whose token submitted it


class QarnotDouble:
    def __init__(self, *, token: str = "qarnot-TOKEN-value-9f8e7d", profiles=("docker-batch",), catalogue=None):  # noqa: S107, E501
        self.token = token
        self.accounts: dict[str, str] = {token: "gridgate@example.org"}  # API token → account
        self.case_owners: dict[str, str] = {}  # case id → the account every call about it must come from
        self.violations: list[str] = []
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
        self.hold: set[str] = set()
        self.page_size = 2
        self.max_tasks: int | None = None
        self.credits = True
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.app = self._build_app()
        self._server = None
        self._thread = None
        self._scratch = Path(tempfile.mkdtemp(prefix="qarnot-double-"))

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self):
        self._s3_server = make_server("127.0.0.1", 0, self._storage_app(), threaded=True)
        self._s3_thread = threading.Thread(target=self._s3_server.serve_forever, daemon=True)
        self._s3_thread.start()
        self.storage_url = f"http://127.0.0.1:{self._s3_server.server_port}"
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
                task.proc.wait(timeout=10)  # reaped: no zombie left in the test process

    def stop(self):
        for task in self.tasks.values():
            if task.proc is not None and task.proc.poll() is None:
                os.killpg(task.proc.pid, signal.SIGKILL)
                task.proc.wait(timeout=10)
        self._server.shutdown()
        self._thread.join(5)
        self._s3_server.shutdown()
        self._s3_thread.join(5)
        shutil.rmtree(self._scratch, ignore_errors=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    def add_account(self, token: str, email: str) -> None:
        self.accounts[token] = email

    def revoke(self, token: str) -> None:
        """The token no longer works (deleted in Qarnot's console): 401 from now on."""
        self.accounts.pop(token, None)

    def expect_owner(self, case_id, email: str) -> None:
        self.case_owners[str(case_id)] = email

    def _owner_problem(self, where: str, case_id: str | None, account: str | None) -> str | None:
        expected = self.case_owners.get(case_id or "")
        if expected is None or account == expected:
            return None
        problem = f"{where}: case {case_id} belongs to {expected}, the call came from {account}"
        self.violations.append(problem)
        return problem

    def fault(self, path_part, *, status=None, times=1, delay=0.0, after=False, method=None, body=None):
        self.faults.append(Fault(path_part, method, status, times, delay, after, body))

    def buckets(self) -> list[str]:
        return sorted(b["Name"] for b in self.s3.list_buckets().get("Buckets", []))

    def _storage_app(self):
        """moto's S3, behind the account's storage quota as Qarnot's storage enforces it: an
        object (or part) that would pass ``user["quotaBytesBucket"]`` is refused mid-upload."""
        moto = DomainDispatcherApplication(create_backend_app)
        double = self

        def app(environ, start_response):
            request = WsgiRequest(environ)
            # The owner check on storage: the SDK signs with the account's e-mail as access key id.
            credential = re.search(r"Credential=([^/]+)/", request.headers.get("Authorization", ""))
            bucket = request.path.strip("/").split("/")[0]
            case = re.fullmatch(r"gg-(.+)-(in|out)", bucket)
            if credential and credential.group(1) == "double":
                case = None  # the double's own task runner (Qarnot's side), not a client
            problem = double._owner_problem(
                f"S3 {request.method} {request.path}", case.group(1) if case else None,
                credential.group(1) if credential else None,
            )  # fmt: skip
            if problem:
                body = f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>AccessDenied</Code><Message>{problem}</Message></Error>"  # noqa: E501
                return WsgiResponse(body, status=403, mimetype="application/xml")(environ, start_response)
            quota = double.user.get("quotaBytesBucket")
            is_object = request.method == "PUT" and len(request.path.strip("/").split("/")) > 1
            if is_object and quota is not None and quota >= 0:
                used = double.used_bytes()
                if used + (request.content_length or 0) > quota:
                    body = (
                        "<?xml version='1.0' encoding='UTF-8'?><Error><Code>QuotaExceeded</Code>"
                        "<Message>Storage quota exceeded</Message></Error>"
                    )
                    return WsgiResponse(body, status=403, mimetype="application/xml")(environ, start_response)
            return moto(environ, start_response)

        return app

    def used_bytes(self) -> int:
        """Bytes stored (latest versions), read from moto's in-memory backend, not over HTTP: the
        storage server's own request threads ask this inside every object PUT, and two nested
        requests to the same server per PUT (through the boto3 client the task threads share)
        were the suspect of a PUT left unanswered past botocore's retries under CPU contention.
        ``dict(bucket.keys)`` copies moto's versioned store (key -> versions) as moto does itself
        to iterate it while other threads write."""
        backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
        return sum(
            versions[-1].size
            for bucket in list(backend.buckets.values())
            for versions in dict(bucket.keys).values()
            if versions
        )

    def keys(self, bucket: str) -> list[str]:
        return sorted(o["Key"] for o in self.s3.list_objects_v2(Bucket=bucket).get("Contents", []))

    def wait_state(self, uuid: str, states, timeout: float = 90.0):
        from tests.backends.conftest import wait_until

        wait_until(lambda: self.tasks[uuid].state in states, timeout=timeout, what=f"task {uuid} in {states}")

    # -- the task runner ------------------------------------------------------------------------
    def _enter(self, task: Task, state: str) -> bool:
        """Move to ``state`` unless an abort came first (never undone); wait while it is held.
        An abort during the wait is the caller's to honour (as an abort during an upload is)."""
        with self._lock:
            if task.state in ("PendingCancel", "Cancelled"):
                return False
            task.previous_state, task.state = task.state, state
            task.history.append(state)
        while state in self.hold and task.state == state:
            time.sleep(0.02)
        return True

    def _cancelled(self, task: Task) -> None:
        with self._lock:
            task.previous_state, task.state = task.state, "Cancelled"
            task.history.append("Cancelled")
            task.ended = time.time()

    def _run(self, task: Task):
        """The task's thread. Anything the double itself fails at (an upload to its storage, a
        download) ends the task in Failure naming the error (code FT999: the double's, not a
        task's), instead of ending the thread and leaving the task running forever for a test to
        wait on; an abort that came first still ends it Cancelled (never undone)."""
        try:
            self._execute(task)
        except Exception as exc:
            instance = {
                "instanceId": 0,
                "state": "Failure",
                "wallTimeSec": 0.0,
                "error": {"code": "FT999", "message": f"The Qarnot double failed: {exc!r}", "debug": ""},
            }
            with self._lock:
                aborted = task.state in ("PendingCancel", "Cancelled")
                if not aborted:
                    task.completed = [instance]
                task.previous_state, task.state = task.state, "Cancelled" if aborted else "Failure"
                task.history.append(task.state)
                task.ended = time.time()

    def _execute(self, task: Task):
        body = task.body
        work = self._scratch / task.uuid
        work.mkdir(parents=True)
        while "Submitted" in self.hold and task.state == "Submitted":
            time.sleep(0.02)
        for state in ("PartiallyDispatched", "FullyDispatched"):
            if not self._enter(task, state):
                return self._cancelled(task)
        for resource in body.get("advancedResourceBuckets") or []:
            name = resource["bucketName"]
            for key in self.keys(name):
                target = work / key
                target.parent.mkdir(parents=True, exist_ok=True)
                self.s3.download_file(name, key, str(target))
        constants = {c["key"]: c["value"] for c in body.get("constants") or []}
        env = {**os.environ, **{k: v for k, v in constants.items() if not k.startswith("DOCKER_")}}
        if not self._enter(task, "PartiallyExecuting"):
            return self._cancelled(task)
        task.started = time.time()
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
        self._enter(task, "FullyExecuting")
        while task.proc.poll() is None:
            if task.snapshot_interval and task.snapshot_whitelist and task.state == "FullyExecuting":
                self._upload(task, work, whitelist=task.snapshot_whitelist)
            time.sleep(self.snapshot_tick)
        for reader in readers:
            reader.join(5)
        if not self._enter(task, "UploadingResults"):
            return self._cancelled(task)
        self._upload(task, work, blacklist=body.get("resultsBlacklist"))
        code = task.proc.returncode
        instance = {"instanceId": 0, "state": "Success" if code == 0 else "Failure", "wallTimeSec": 1.0}
        if code != 0:
            instance["error"] = {
                "code": "FT000",
                "message": f"The process exited with code {code}",
                "debug": "docker run failed",
            }
        with self._lock:
            if task.state != "UploadingResults":  # aborted during the upload: stays cancelled
                task.previous_state, task.state = task.state, "Cancelled"
            else:
                task.completed = [instance]
                task.previous_state, task.state = task.state, instance["state"]
            task.history.append(task.state)
            task.ended = time.time()

    def _pump(self, task: Task, stream, name: str):
        for line in iter(stream.readline, b""):
            with self._lock:
                setattr(task, name, getattr(task, name) + line.decode("utf-8", "replace"))

    def _upload(self, task: Task, work: Path, whitelist=None, blacklist=None):
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
            # The whole working directory, unchanged inputs included; boto3 uploads files over
            # 8 MB in parts, so their ETags are not MD5s.
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
            "errors": [],  # task-level errors only: an instance's failure is in completedInstances
            "completedInstances": task.completed,
            "previousState": task.previous_state,
            "status": {"executionTime": f"00:00:{elapsed:02d}"},
            "runningCoreCount": 4 if task.state == "FullyExecuting" else 0,
            "executionTime": f"00:00:{elapsed:02d}",
            "snapshotInterval": task.snapshot_interval,
            "resourceBuckets": [],
        }

    def _build_app(self) -> Flask:  # noqa: C901 - one route table, read top to bottom
        app = Flask("qarnot-double")
        double = self

        def fault(after: bool):
            item = take_fault(double.faults, after)
            if item is not None and item.status:
                return jsonify(item.body or {"message": f"injected fault {item.status}"}), item.status
            return None

        @app.before_request
        def before():
            with double._lock:
                double.calls.append((request.method, request.path))
            answer = fault(after=False)
            if answer is not None:
                return answer
            g.account = double.accounts.get(request.headers.get("Authorization", ""))
            if g.account is None:
                return jsonify({"message": "Unauthorized"}), 401
            return None

        @app.after_request
        def after(response):
            delayed = fault(after=True)
            return app.make_response(delayed) if delayed is not None else response

        def task_or_404(uuid):
            task = double.tasks.get(uuid)
            where = f"{request.method} {request.path}"
            if task is not None and double._owner_problem(where, task.body.get("name"), g.account):
                return None, (jsonify({"message": "No such task"}), 404)
            if task is None or task.owner != g.account:
                return None, (jsonify({"message": "No such task"}), 404)
            return task, None

        @app.get("/settings")
        def settings():
            return jsonify({"storage": double.storage_url})

        @app.get("/info")
        def info():
            names = double.buckets()
            used = double.used_bytes()
            return jsonify({"bucketCount": len(names), "usedQuotaBytesBucket": used, **double.user, "email": g.account})

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
            problem = double._owner_problem("POST /tasks", body.get("name"), g.account)
            if problem:
                return jsonify({"message": problem}), 403
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
            if not double.credits:
                return jsonify({"message": "Not enough credits to run the task"}), 402
            active = [t for t in double.tasks.values() if t.state not in ("Success", "Failure", "Cancelled")]
            if double.max_tasks is not None and len(active) >= double.max_tasks:
                return jsonify({"message": "Maximum number of tasks reached"}), 403
            task = Task(uuid=str(uuidlib.uuid4()), body=body, owner=g.account)
            double.tasks[task.uuid] = task
            task.runner = threading.Thread(target=double._run, args=(task,), daemon=True)
            task.runner.start()
            return jsonify({"uuid": task.uuid}), 201

        @app.post("/tasks/paginate")
        def paginate():
            query = request.get_json() or {}
            wanted = _tags_of(query.get("filter"))
            matching = [
                t
                for t in double.tasks.values()
                if t.owner == g.account and (wanted is None or wanted & set(t.body.get("tags") or []))
            ]
            start = int(query.get("token") or 0)
            size = int(query.get("maximumResults") or double.page_size)
            size = min(size, double.page_size)
            page = matching[start : start + size]
            more = start + size < len(matching)
            return jsonify(
                {
                    "data": [double._task_json(t) for t in page],
                    "isTruncated": more,
                    "nextToken": str(start + size) if more else None,
                    "token": query.get("token"),
                }
            )

        @app.get("/tasks/<uuid>")
        def retrieve(uuid):
            task, missing = task_or_404(uuid)
            return missing or jsonify(double._task_json(task))

        @app.delete("/tasks/<uuid>")
        def delete(uuid):
            if uuid in double.tasks:  # deleting what is gone already is no error
                _task, missing = task_or_404(uuid)
                if missing:
                    return missing
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
            with double._lock:
                if task.state in ("Success", "Failure", "Cancelled", "PendingCancel"):
                    return jsonify({"message": "Invalid operation on non-running task"}), 403
                task.previous_state, task.state = task.state, "PendingCancel"
                task.history.append("PendingCancel")
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


def _tags_of(filter_) -> set[str] | None:
    """The tags an advanced filter asks for: exact ``Equal`` on ``Tags``, possibly under ``Or``
    (None: no filter). Anything else matches nothing, as an unknown filter would."""
    if not filter_:
        return None
    if filter_.get("operator") == "Equal" and filter_.get("field") == "Tags":
        return {str(filter_.get("value"))}
    if filter_.get("operator") == "Or":
        out = set()
        for sub in filter_.get("filters") or []:
            out |= _tags_of(sub) or set()
        return out
    return set()
