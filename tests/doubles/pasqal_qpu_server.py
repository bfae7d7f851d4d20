"""A local double of a Pasqal QPU's on-premise QPU API (what Warden drives), for the pasqal_qpu
driver and the end-to-end QRMI test.

It behaves like the facts in ``shared/reference/PROVIDERS.md`` and Warden's mock: base
``/api/v1``, JSend envelopes ``{"code", "message", "data"}``; ``GET /system`` gives the QPU's
Pulser device (AnalogDevice by default), ``GET /system/operational`` UP or DOWN (``operational``);
``POST /jobs`` creates a PENDING job and drops the job the QPU was running (one job at a time);
each ``GET /jobs/{uid}`` moves a job one step, PENDING → RUNNING → DONE (or ERROR with
``fail_next``), and a DONE job's ``result`` is the JSON string ``{"counter": {...}}`` whose counts
sum to ``nb_run``; ``PUT /jobs/{uid}/cancel`` cancels an unfinished job and answers a finished
one with 400 and code ``3003``.

Faults: ``fault(path_part, status=…, times=…, method=…)`` answers the next matching requests
with that status (a 5xx burst); with ``after=True`` it carries the request out first (a POST the
QPU created the job for, then failed to answer); ``drop(path_part, method=…, times=…)`` carries
the request out and then closes the connection without an answer (a POST whose answer is lost).
``restart()`` loses every job and gives uids again from the first (a QPU API restarted on an
empty store). ``auth`` (header, value) makes every request without that header a 401.
``client`` (id, secret) makes it an identity provider too: ``POST /token`` (client credentials)
issues bearer tokens, and every QPU API request needs one of them (401 otherwise);
``expire_tokens()`` makes those issued so far invalid; ``token_requests`` counts the grants.
``posted`` lists the ``pasqman_job_id`` tag of every job created, so a test counts the POSTs that
reached the QPU for each Gridgate job.

A slow QPU API: ``delay_creates(seconds, times=…)`` makes the next POSTs create their job only
``seconds`` after they arrived, by the double's ``clock`` (``time.monotonic`` unless a test gives
its own), and answer only then (the client has long given up: its answer is lost). With a test's
clock, ``tick()`` after moving it creates, before it returns, every job then due; with the real
one, the waiting request creates its job itself when the time comes.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from flask import Flask, jsonify, request
from werkzeug.serving import make_server

logging.getLogger("werkzeug").setLevel(logging.ERROR)


@dataclass
class Fault:
    path_part: str
    method: str | None
    status: int | None
    times: int
    drop: bool = False
    after: bool = False


def analog_device_specs() -> dict:
    import pulser.devices

    return json.loads(pulser.devices.AnalogDevice.to_abstract_repr())


FIRST_UID = 100


@dataclass
class DelayedCreate:
    due: float
    body: dict
    done: threading.Event = field(default_factory=threading.Event)
    job: dict | None = None


def envelope(data, code=200, message="OK."):
    return jsonify({"code": code, "message": message, "data": data}), code


class QpuDouble:
    def __init__(
        self,
        *,
        specs: dict | None = None,
        auth: tuple[str, str] | None = None,
        client: tuple[str, str] | None = None,
        clock=None,
    ):
        self.specs = specs if specs is not None else analog_device_specs()
        self.auth = auth
        self.client = client
        self.tokens: set[str] = set()
        self.token_requests = 0
        self.operational = "UP"
        self.jobs: dict[int, dict] = {}
        self.faults: list[Fault] = []
        self.calls: list[tuple[str, str]] = []
        self.fail_next = 0  # the next N jobs to finish end in ERROR
        self.hold = False  # jobs stay RUNNING while True (a long run)
        self._next_uid = FIRST_UID
        self.posted: list[str] = []
        self.clock = clock or time.monotonic
        self._create_delays: list[float] = []  # one per coming POST
        self._delayed: list[DelayedCreate] = []
        self._lock = threading.Lock()
        self._server = None
        self.app = self._make_app()

    # -- control ---------------------------------------------------------------------------
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

    def fault(self, path_part, *, status=503, times=1, method=None, after=False):
        self.faults.append(Fault(path_part, method, status, times, after=after))

    def expire_tokens(self) -> None:
        self.tokens.clear()

    def restart(self) -> None:
        with self._lock:
            self.jobs.clear()
            self._next_uid = FIRST_UID

    def drop(self, path_part, *, times=1, method=None):
        self.faults.append(Fault(path_part, method, None, times, drop=True))

    def delay_creates(self, seconds: float, *, times: int = 1) -> None:
        self._create_delays += [seconds] * times

    def pending_creates(self) -> int:
        """POSTs received whose job is not created yet."""
        with self._lock:
            return sum(1 for delayed in self._delayed if delayed.job is None)

    def tick(self) -> None:
        """Create every delayed job now due by ``clock`` (a test calls it after moving its clock)."""
        with self._lock:
            for delayed in self._delayed:
                if delayed.job is None and delayed.due <= self.clock():
                    delayed.job = self._create(delayed.body)
                    delayed.done.set()
            self._delayed = [delayed for delayed in self._delayed if delayed.job is None]

    def posts(self) -> int:
        return sum(1 for method, path in self.calls if method == "POST" and path.endswith("/jobs"))

    def finish(self, uid: int, status: str = "DONE") -> None:
        with self._lock:
            self._end(self.jobs[uid], status)

    # -- behaviour -------------------------------------------------------------------------
    def _take(self, drop: bool, after: bool = False) -> Fault | None:
        for fault in self.faults:
            if fault.times <= 0 or fault.drop != drop or fault.after != after or fault.path_part not in request.path:
                continue
            if fault.method and fault.method != request.method:
                continue
            fault.times -= 1
            return fault
        return None

    def _end(self, job: dict, status: str) -> None:
        now = datetime.now(UTC).isoformat()
        job["start_datetime"] = job["start_datetime"] or now
        job["end_datetime"] = now
        if status == "DONE" and self.fail_next:
            self.fail_next -= 1
            status = "ERROR"
        job["status"] = status
        if status == "DONE":
            atoms = len(json.loads(job["pulser_sequence"])["register"])
            runs = job["nb_run"]
            # Deterministic counts summing to nb_run: all-ground and all-excited halves.
            counts = {"0" * atoms: runs - runs // 2, "1" * atoms: runs // 2} if runs > 1 else {"0" * atoms: runs}
            job["result"] = json.dumps({"counter": {k: v for k, v in counts.items() if v}})
        elif status == "ERROR":
            job["error"] = "Atom loss above threshold during the run."

    def _create(self, body: dict) -> dict:
        """A new job (the caller holds the lock); one at a time: a new job drops the running one."""
        for job in self.jobs.values():
            if job["status"] in ("PENDING", "RUNNING"):
                self._end(job, "CANCELED")
        uid = self._next_uid
        self._next_uid += 1
        context = body.get("context") or {}
        self.posted.append(context.get("pasqman_job_id"))
        job = {
            "uid": uid,
            "batch_id": context.get("batch_id"),
            "status": "PENDING",
            "result": None,
            "program_id": uid,
            "nb_run": body["nb_run"],
            "pulser_sequence": body["pulser_sequence"],
            "context": context,
            "created_datetime": datetime.now(UTC).isoformat(),
            "start_datetime": None,
            "end_datetime": None,
        }
        self.jobs[uid] = job
        return job

    def _make_app(self) -> Flask:
        app = Flask("pasqal-qpu-double")
        double = self

        @app.before_request
        def before():
            double.calls.append((request.method, request.path))
            if request.path == "/token":
                return None
            if double.auth and request.headers.get(double.auth[0]) != double.auth[1]:
                return envelope(None, 401, "Unauthorized")
            if double.client and request.headers.get("Authorization", "").removeprefix("Bearer ") not in double.tokens:
                return envelope(None, 401, "Unauthorized")
            fault = double._take(drop=False)
            if fault is not None:
                return envelope(None, fault.status, f"injected fault {fault.status}")
            return None

        @app.after_request
        def after(response):
            late = double._take(drop=False, after=True)
            if late is not None:  # the work is done; the answer is an error
                failed = jsonify({"code": late.status, "message": f"injected fault {late.status}", "data": None})
                failed.status_code = late.status
                return failed
            if double._take(drop=True) is not None:
                # The QPU did the work; the client never hears back.
                sock = request.environ.get("werkzeug.socket")
                if sock is not None:
                    sock.shutdown(socket.SHUT_RDWR)
            return response

        @app.post("/token")
        def token():
            form = request.form
            if (form.get("grant_type"), form.get("client_id"), form.get("client_secret")) != (
                "client_credentials",
                *double.client,
            ):
                return jsonify({"error": "invalid_client"}), 401
            double.token_requests += 1
            issued = f"tok-{double.token_requests}"
            double.tokens.add(issued)
            return jsonify({"access_token": issued, "token_type": "Bearer", "expires_in": 300})

        @app.get("/api/v1/system")
        def system():
            return envelope({"specs": double.specs})

        @app.get("/api/v1/system/operational")
        def operational():
            return envelope({"operational_status": double.operational})

        @app.post("/api/v1/jobs")
        def create():
            body = request.get_json(force=True)
            if not isinstance(body.get("nb_run"), int) or not isinstance(body.get("pulser_sequence"), str):
                return envelope(None, 400, "Bad request")
            with double._lock:
                if not double._create_delays:
                    return envelope(dict(double._create(body)))
                delayed = DelayedCreate(due=double.clock() + double._create_delays.pop(0), body=body)
                double._delayed.append(delayed)
            while not delayed.done.wait(0.05):  # a slow QPU API: created when its time comes
                double.tick()
            return envelope(dict(delayed.job))

        @app.get("/api/v1/jobs/<int:uid>")
        def get(uid):
            with double._lock:
                job = double.jobs.get(uid)
                if job is None:
                    return envelope(None, 400, "Bad request")
                if job["status"] == "PENDING":
                    job["status"] = "RUNNING"
                    job["start_datetime"] = datetime.now(UTC).isoformat()
                elif job["status"] == "RUNNING" and not double.hold:
                    double._end(job, "DONE")
                return envelope(dict(job))

        @app.put("/api/v1/jobs/<int:uid>/cancel")
        def cancel(uid):
            with double._lock:
                job = double.jobs.get(uid)
                if job is None:
                    return envelope(None, 400, "Bad request")
                if job["status"] in ("DONE", "ERROR", "CANCELED"):
                    body = {
                        "code": "3003",
                        "message": "Not OK",
                        "data": {"status": f"Job with status {job['status']} not cancellable"},
                    }
                    return jsonify(body), 400
                double._end(job, "CANCELED")
                return envelope(dict(job))

        return app
