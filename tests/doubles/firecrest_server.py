"""A local FirecREST v2 double: the endpoints pyfirecrest calls, plus an OIDC token endpoint.

It serves on 127.0.0.1 at a port chosen at runtime. The "remote" filesystem is a directory of
this machine (every path must stay under ``fs_root``), so a pool's ``working_root`` is a local
path. Jobs run either as local processes (``runner="local"``: fast, deterministic, for fault
tests) or on the local Slurm cluster through ``sbatch`` (``runner="slurm"``: a real batch job).

Faults (all counted per request): ``fault(path_part, status=…, times=…, delay=…, after=…)``
answers ``status`` (5xx, 429, 404…) or sleeps ``delay`` seconds before answering (a client
timeout); with ``after=True`` the request is carried out first and the answer is delayed (a
submission that reached Slurm but whose answer timed out); with ``drop=True`` (and ``after=True``)
the request is carried out and the connection is closed without an answer. ``hide_new_jobs = N``
hides each new job from the next N lookups (FirecREST's transient 404 right after submit).
``force_state(id, state, exit_code)`` overrides what a job reports (OUT_OF_MEMORY, NODE_FAIL…).

What the real FirecREST v2 server does (PROVIDERS.md, "observed") and this double reproduces,
each pinned by a test in ``tests/backends/test_firecrest_double.py``:

- ``ops/tail`` is ``tail --bytes=+N``: 1-based start; ``bytes=0`` means no option (last 10 lines);
- tokens live ``token_ttl`` seconds and are refused with less than 30 s left (401 "expires too
  soon"); ``expire_tokens_in(s)`` ages the tokens already issued;
- ``allocation_records = N``: a running job shows as its allocation record (name "allocation",
  PENDING) in the next N lookups; ``missing_after_end = N``: a finished job is missing from the
  next N listings and lookups;
- cancel of a finished or unknown job answers 500 with scancel's message;
- listings carry sizes as strings and one-second ``lastModified``; ``jobId`` is a string and
  ``exitCode`` is 0 while running;
- ``servicesHealth`` is a list (scheduler, ssh, filesystem); ``unhealthy[name] = message``;
- files over 1 MiB go through the staging endpoints; ``staging = False`` answers them 500.

Per-user tokens (docs/backends.md, "Per-user credentials"), as Keycloak issues them to a public
client with PKCE: ``add_user(name)`` creates an account (its subject a UUID); ``login_as = name``
is the browser's session at the provider, so ``GET /auth/authorize`` sends the browser back to
the redirect URI with a code; ``POST /auth/token`` takes ``authorization_code`` (the verifier
must hash to the challenge; ``verifiers`` keeps what was sent), ``refresh_token`` (rotated: each
refresh token works once, a reuse revokes the session's tokens, as "Revoke Refresh Token" with
reuse 0 does) and ``client_credentials`` (the service account, subject
``service-account-<client id>``). ``revoke_user(name)`` ends a user's sessions (their refresh and
access tokens stop working). ``POST /auth/revoke`` is RFC 7009 as Keycloak answers it: the public
client's ``token`` (a refresh token) ends its session's refresh tokens, access tokens already
issued stay valid until they expire; 200 for a token it does not know as well; 401
``invalid_client`` for another client; ``revocations`` keeps the ``token_type_hint`` of each.
Access tokens are JWTs with ``sub``, ``preferred_username``, ``iss``.

**The owner check**: ``case_owners[case id] = user name`` declares whose case it is; every call
that names the case (its job, by name or id; a path under its run directory) must carry that
user's token, or it is refused (403) and recorded in ``violations``: a test's finalizer asserts
there are none, so a call under the service account, or under another user, on a per-user pool
fails the test. Job listings show only the caller's jobs, as FirecREST's do.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import json
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode

from flask import Flask, Response, g, jsonify, redirect, request
from werkzeug.serving import make_server

API_VERSION = "2.6.0"


@dataclass
class Fault:
    path_part: str
    method: str | None
    status: int | None
    times: int
    delay: float
    after: bool
    body: dict | None = None
    drop: bool = False
    headers: dict | None = None


@dataclass
class Job:
    job_id: int
    name: str
    workdir: str
    account: str | None = None
    proc: subprocess.Popen | None = None
    slurm_id: str | None = None
    started: float = field(default_factory=time.time)
    ended: float | None = None
    cancelled: bool = False
    hidden_lookups: int = 0
    forced: tuple[str, int] | None = None
    transfer: bool = False
    log: str = ""
    allocation_lookups: int = 0
    missing_lookups: int = 0
    owner: str | None = None  # the subject whose token submitted it


class FirecrestDouble:
    def __init__(
        self,
        fs_root: Path,
        *,
        runner: str = "local",
        system: str = "cluster",
        partitions=("debug",),
        client_id: str = "gridgate-client",
        client_secret: str = "s3cr3t-client-VALUE-42",  # noqa: S107 - the double's test credential
    ):
        self.fs_root = Path(fs_root).resolve()
        self.fs_root.mkdir(parents=True, exist_ok=True)
        self.runner = runner
        self.system = system
        self.partitions = list(partitions)
        self.client_id = client_id
        self.client_secret = client_secret
        self.tokens: dict[str, float] = {}  # token → expiry (epoch seconds)
        self.token_subjects: dict[str, str] = {}  # access token → subject
        self.token_ttl = 300
        # -- per-user tokens (the identity provider's side) --
        self.public_client_id = "gridgate-firecrest"
        self.users: dict[str, str] = {}  # user name → subject
        self.login_as: str | None = None
        self.codes: dict[str, dict] = {}
        self.revocations: list[str] = []  # token_type_hint of each POST /auth/revoke
        self.refresh_tokens: dict[str, dict] = {}  # refresh token → {sub, name, session, state}
        self.verifiers: list[str] = []
        self.grants: list[str] = []  # grant types asked for, in order
        self.case_owners: dict[str, str] = {}  # case id → user name whose token every call must carry
        self.violations: list[str] = []
        self._signing_key = secrets.token_bytes(32)
        self.allocation_records = 0
        self.missing_after_end = 0
        self.unhealthy: dict[str, str] = {}
        self.staging = True
        self.answered: list[tuple[str, str, int]] = []
        self.jobs: dict[int, Job] = {}
        self.faults: list[Fault] = []
        self.calls: list[tuple[str, str]] = []
        self.hide_new_jobs = 0
        self.transfers: dict[str, dict] = {}
        self._ids = itertools.count(1000)
        self._lock = threading.Lock()
        self.app = self._build_app()
        self._server = None
        self._thread = None

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self):
        self._server = make_server("127.0.0.1", 0, self.app, threaded=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def reap(self):
        """Kill every job process still running (a test's finalizer: nothing outlives its test)."""
        for job in list(self.jobs.values()):
            if job.proc is not None and job.proc.poll() is None:
                try:
                    os.killpg(job.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                job.proc.wait(timeout=10)  # reaped: no zombie left in the test process

    def stop(self):
        for job in self.jobs.values():
            if job.proc is not None and job.proc.poll() is None:
                os.killpg(job.proc.pid, signal.SIGKILL)
                job.proc.wait(timeout=10)
            if job.slurm_id and job.ended is None:
                subprocess.run(["scancel", job.slurm_id], capture_output=True, check=False)
        if self._server is not None:
            self._server.shutdown()
            self._thread.join(5)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    @property
    def token_uri(self) -> str:
        return f"{self.url}/auth/token"

    @property
    def authorization_uri(self) -> str:
        return f"{self.url}/auth/authorize"

    @property
    def issuer(self) -> str:
        return f"{self.url}/realms/hpc"

    # -- the identity provider's accounts --------------------------------------------------------
    def add_user(self, name: str) -> str:
        """An account at the provider; returns its subject (a UUID, as Keycloak's user ids)."""
        self.users[name] = str(uuid.uuid5(uuid.NAMESPACE_URL, f"firecrest-double:{name}"))
        return self.users[name]

    def subject_of(self, name: str) -> str:
        return self.users[name]

    def revoke_user(self, name: str) -> None:
        """End every session of ``name``: refresh tokens refused (invalid_grant), access tokens too."""
        subject = self.users[name]
        for record in self.refresh_tokens.values():
            if record["sub"] == subject:
                record["state"] = "revoked"
        for token, owner in list(self.token_subjects.items()):
            if owner == subject:
                self.tokens.pop(token, None)

    def live_refresh_tokens(self, name: str) -> list[str]:
        subject = self.users[name]
        return [t for t, r in self.refresh_tokens.items() if r["sub"] == subject and r["state"] == "active"]

    def expect_owner(self, case_id, name: str) -> None:
        """Every call about case ``case_id`` must carry ``name``'s token (see the module's docstring)."""
        self.case_owners[str(case_id)] = name

    def _jwt(self, claims: dict) -> str:
        def part(data: dict) -> str:
            return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()

        head = part({"alg": "HS256", "typ": "JWT"}) + "." + part(claims)
        signature = hmac.new(self._signing_key, head.encode(), hashlib.sha256).digest()
        return head + "." + base64.urlsafe_b64encode(signature).rstrip(b"=").decode()

    def _issue(self, subject: str, name: str, client: str, *, session: str | None = None, refresh: bool = False):
        now = time.time()
        claims = {
            "iss": self.issuer,
            "sub": subject,
            "preferred_username": name,
            "azp": client,
            "iat": int(now),
            "exp": int(now + self.token_ttl),
            "jti": secrets.token_hex(8),
        }
        access = self._jwt(claims)
        self.tokens[access] = now + self.token_ttl
        self.token_subjects[access] = subject
        body = {"access_token": access, "expires_in": self.token_ttl, "token_type": "Bearer"}
        if refresh:
            value = secrets.token_urlsafe(32)
            self.refresh_tokens[value] = {"sub": subject, "name": name, "session": session, "state": "active"}
            body.update(refresh_token=value, refresh_expires_in=0, id_token=self._jwt({**claims, "aud": client}))
        return body

    # -- the owner check ----------------------------------------------------------------------------
    def _case_named(self) -> str | None:
        """The registered case this request is about, if any: named by its job (id in the path,
        name in the query or the submitted script) or by a path under its run directory."""
        texts = [request.path, *request.args.values()]
        body = request.get_json(silent=True) if request.is_json else None
        stack = [body]
        while stack:
            item = stack.pop()
            if isinstance(item, dict):
                stack.extend(item.values())
            elif isinstance(item, list):
                stack.extend(item)
            elif isinstance(item, str):
                texts.append(item)
        match = re.search(r"/compute/[^/]+/jobs/(\d+)", request.path)
        if match and int(match.group(1)) in self.jobs:
            texts.append(self.jobs[int(match.group(1))].name)
        for case_id in self.case_owners:
            if any(case_id in text for text in texts):
                return case_id
        return None

    def _check_owner(self, subject: str | None):
        case_id = self._case_named()
        if case_id is None:
            return None
        expected = self.users.get(self.case_owners[case_id])
        if subject != expected:
            who = next((name for name, sub in self.users.items() if sub == subject), subject)
            self.violations.append(
                f"{request.method} {request.path}: case {case_id} belongs to {self.case_owners[case_id]}, "
                f"the token is {who}'s"
            )
            return jsonify({"message": f"token subject {subject} is not the owner of case {case_id}"}), 403
        return None

    # -- test controls ------------------------------------------------------------------------
    def fault(self, path_part, *, status=None, times=1, delay=0.0, after=False, method=None, body=None, drop=False):
        self.faults.append(Fault(path_part, method, status, times, delay, after, body, drop))

    def expire_tokens_in(self, seconds: float) -> None:
        """Age every token issued so far: each has ``seconds`` left (the client does not know)."""
        for token in self.tokens:
            self.tokens[token] = time.time() + seconds

    def refusals(self, status: int = 401) -> list[tuple[str, str]]:
        return [(method, path) for method, path, code in self.answered if code == status]

    def status_calls(self) -> list[str]:
        """Job-status requests (listing or one job) as they reached the double."""
        return [path for method, path in self.calls if method == "GET" and "/compute/" in path]

    def force_state(self, job_id, state, exit_code=0):
        self.jobs[int(job_id)].forced = (state, exit_code)

    def user_jobs(self) -> list[Job]:
        return [job for job in self.jobs.values() if not job.transfer]

    # -- helpers ------------------------------------------------------------------------------
    def _path(self, raw: str | None) -> Path:
        if not raw:
            raise _Error(400, "path is required")
        path = Path(os.path.normpath(raw))
        if not path.is_absolute() or not (path == self.fs_root or path.is_relative_to(self.fs_root)):
            raise _Error(403, f"Permission denied: {raw}")
        return path

    def _fault(self, after: bool):
        fault = take_fault(self.faults, after)
        if fault is not None:
            if fault.drop:
                # The request was carried out; the answer never leaves: close the connection.
                sock = request.environ.get("werkzeug.socket")
                if sock is not None:
                    sock.shutdown(socket.SHUT_RDWR)
                return jsonify({}), 500
            if fault.status:
                headers = {"Retry-After": "0"} if fault.status == 429 else {}
                body = fault.body or {"message": f"injected fault {fault.status}"}
                return jsonify(body), fault.status, headers
        return None

    def _job_state(self, job: Job) -> tuple[str, int | None]:
        if job.forced:
            return job.forced
        if job.transfer:
            return "COMPLETED", 0
        if job.proc is not None:
            code = job.proc.poll()
            if code is None:
                return "RUNNING", None
            job.ended = job.ended or time.time()
            if job.cancelled:
                return f"CANCELLED by {os.getuid()}", code
            return ("COMPLETED", 0) if code == 0 else ("FAILED", code)
        if job.slurm_id:
            return self._slurm_state(job)
        return "PENDING", None

    def _slurm_state(self, job: Job) -> tuple[str, int | None]:
        live = subprocess.run(
            ["squeue", "-h", "-t", "all", "-j", job.slurm_id, "-o", "%T"], capture_output=True, text=True, check=False
        ).stdout.strip()
        if live and live not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            return live, None
        done = subprocess.run(
            ["sacct", "-c", "-j", job.slurm_id, "-n", "-P", "-o", "state,exitcode"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        if done:
            state, _, code = done.splitlines()[-1].partition("|")
            job.ended = job.ended or time.time()
            return state, int(code.split(":")[0] or 0)
        if live:
            job.ended = job.ended or time.time()
            return live, 0 if live == "COMPLETED" else 1
        return "PENDING", None

    def _visible_json(self, job: Job) -> dict | None:
        """The record a lookup sees: None while a just-finished job is missing, the allocation
        record while it shows, else the job."""
        state, _code = self._job_state(job)
        if job.ended is not None and job.missing_lookups > 0:
            job.missing_lookups -= 1
            return None
        if job.ended is None and job.allocation_lookups > 0 and state == "RUNNING":
            job.allocation_lookups -= 1
            record = self._job_json(job)
            record.update(name="allocation", status={"state": "PENDING", "stateReason": "None", "exitCode": 0})
            return record
        return self._job_json(job)

    def _job_json(self, job: Job) -> dict:
        state, code = self._job_state(job)
        end = job.ended or time.time()
        return {
            "jobId": str(job.job_id),
            "name": job.name,
            "status": {"state": state, "stateReason": "None", "exitCode": code or 0},
            "time": {"elapsed": int(end - job.started), "start": int(job.started), "end": None, "limit": 3600},
            "workingDirectory": job.workdir,
            "account": job.account,
        }

    def _start_job(self, body: dict) -> Job:
        script = body.get("script") or ""
        workdir = str(self._path(body.get("working_directory")))
        name = (re.search(r"^#SBATCH --job-name=(\S+)", script, re.M) or [None, "job"])[1]
        job = Job(job_id=next(self._ids), name=name, workdir=workdir, account=body.get("account"))
        job.owner = g.get("subject")
        job.hidden_lookups = self.hide_new_jobs
        job.allocation_lookups = self.allocation_records
        job.missing_lookups = self.missing_after_end
        script_path = Path(workdir).parent / f"job-{job.job_id}.sh"
        script_path.write_text(script)
        if self.runner == "slurm":
            out = subprocess.run(
                ["sbatch", "--parsable", str(script_path)], capture_output=True, text=True, check=False, cwd=workdir
            )
            if out.returncode != 0:
                raise _Error(400, f"sbatch: {out.stderr.strip()}")
            job.slurm_id = out.stdout.strip().split(";")[0]
        else:

            def directive(flag, default):
                match = re.search(rf"^#SBATCH {flag}=(\S+)", script, re.M)
                return match.group(1) if match else default

            chdir = directive("--chdir", workdir)
            stdout = open(directive("--output", f"{workdir}/slurm-{job.job_id}.out"), "ab")  # noqa: SIM115
            stderr = open(directive("--error", f"{workdir}/slurm-{job.job_id}.out"), "ab")  # noqa: SIM115
            job.proc = subprocess.Popen(
                ["bash", str(script_path)], cwd=chdir, stdout=stdout, stderr=stderr, start_new_session=True
            )
            stdout.close()
            stderr.close()
        return job

    def _transfer_job(self, system: str, message: str) -> dict:
        job = Job(job_id=next(self._ids), name="transfer", workdir=str(self.fs_root), transfer=True)
        job.owner = g.get("subject")
        log = self.fs_root / ".transfer" / f"{job.job_id}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(message + "\n")
        self.jobs[job.job_id] = job
        return {"jobId": job.job_id, "system": system, "logs": {"outputLog": str(log), "errorLog": str(log)}}

    # -- the application ------------------------------------------------------------------------
    def _build_app(self) -> Flask:  # noqa: C901 - one route table, read top to bottom
        app = Flask("firecrest-double")
        double = self

        @app.errorhandler(_Error)
        def error(exc):
            return jsonify({"message": exc.message}), exc.status

        @app.before_request
        def before():
            with double._lock:
                double.calls.append((request.method, request.path))
            answer = double._fault(after=False)
            if answer is not None:
                return answer
            if request.path.startswith(("/auth/", "/_stage/")):
                return None
            header = request.headers.get("Authorization", "")
            expiry = double.tokens.get(header[7:]) if header.startswith("Bearer ") else None
            if expiry is None or expiry <= time.time():
                return jsonify({"message": "Invalid token"}), 401
            if expiry - time.time() < 30:
                return jsonify({"message": "Access token expires too soon (less than 30s remaining)"}), 401
            g.subject = double.token_subjects.get(header[7:])
            return double._check_owner(g.subject)

        @app.after_request
        def after(response):
            with double._lock:
                double.answered.append((request.method, request.path, response.status_code))
            delayed = double._fault(after=True)
            if delayed is not None:
                return app.make_response(delayed)
            response.headers["f7t-appversion"] = API_VERSION
            return response

        @app.get("/auth/authorize")
        def authorize():
            args = request.args
            if args.get("client_id") != double.public_client_id:
                return jsonify({"error": "invalid_client"}), 400
            if args.get("response_type") != "code" or args.get("code_challenge_method") != "S256":
                return jsonify({"error": "invalid_request", "error_description": "PKCE S256 is required"}), 400
            target = args.get("redirect_uri", "")
            if double.login_as is None:
                return redirect(f"{target}?{urlencode({'error': 'login_required', 'state': args.get('state', '')})}")
            code = secrets.token_urlsafe(16)
            double.codes[code] = {
                "sub": double.users[double.login_as],
                "name": double.login_as,
                "challenge": args.get("code_challenge"),
                "redirect_uri": target,
                "offline": "offline_access" in (args.get("scope") or "").split(),
            }
            return redirect(f"{target}?{urlencode({'code': code, 'state': args.get('state', '')})}")

        @app.post("/auth/token")
        def token():
            form = request.form
            grant = form.get("grant_type")
            double.grants.append(grant or "")

            def refused(error, description, status=400):
                return jsonify({"error": error, "error_description": description}), status

            if grant == "client_credentials":
                if form.get("client_id") != double.client_id or form.get("client_secret") != double.client_secret:
                    return refused("invalid_client", "Invalid client credentials", 401)
                return jsonify(double._issue(f"service-account-{double.client_id}", "", double.client_id))
            if form.get("client_id") != double.public_client_id:
                return refused("invalid_client", "Invalid client or Invalid client credentials", 401)
            if grant == "authorization_code":
                record = double.codes.pop(form.get("code", ""), None)
                verifier = form.get("code_verifier", "")
                double.verifiers.append(verifier)
                if record is None:
                    return refused("invalid_grant", "Code not valid")
                if form.get("redirect_uri") != record["redirect_uri"]:
                    return refused("invalid_grant", "Incorrect redirect_uri")
                digest = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
                if not verifier or digest != record["challenge"]:
                    return refused("invalid_grant", "PKCE verification failed: Code mismatch")
                session = secrets.token_hex(8)
                body = double._issue(
                    record["sub"], record["name"], double.public_client_id, session=session, refresh=record["offline"]
                )
                return jsonify(body)
            if grant == "refresh_token":
                record = double.refresh_tokens.get(form.get("refresh_token", ""))
                if record is None or record["state"] == "revoked":
                    return refused("invalid_grant", "Token is not active")
                if record["state"] == "used":
                    # Reuse of a rotated refresh token: Keycloak revokes the whole session.
                    for other in double.refresh_tokens.values():
                        if other["session"] == record["session"]:
                            other["state"] = "revoked"
                    return refused("invalid_grant", "Maximum allowed refresh token reuse exceeded")
                record["state"] = "used"
                body = double._issue(
                    record["sub"], record["name"], double.public_client_id, session=record["session"], refresh=True
                )
                return jsonify(body)
            return refused("unsupported_grant_type", f"Unsupported grant_type {grant}")

        @app.post("/auth/revoke")
        def revoke():
            form = request.form
            if form.get("client_id") != double.public_client_id:
                return jsonify({"error": "invalid_client", "error_description": "Invalid client"}), 401
            double.revocations.append(form.get("token_type_hint", ""))
            record = double.refresh_tokens.get(form.get("token", ""))
            if record is not None:
                for other in double.refresh_tokens.values():
                    if other["session"] == record["session"]:
                        other["state"] = "revoked"
            return "", 200

        @app.get("/status/systems")
        def systems():
            health = [
                {
                    "serviceType": name,
                    "healthy": name not in double.unhealthy,
                    "message": double.unhealthy.get(name),
                    "lastChecked": "2026-11-30T17:46:01",
                }
                for name in ("scheduler", "ssh", "filesystem")
            ]
            return jsonify({"systems": [{"name": double.system, "servicesHealth": health}]})

        @app.get("/status/<system>/partitions")
        def partitions(system):
            double._system(system)
            return jsonify({"partitions": [{"name": p, "state": "UP"} for p in double.partitions]})

        # -- filesystem ------------------------------------------------------------------------
        @app.get("/filesystem/<system>/ops/ls")
        def ls(system):
            double._system(system)
            path = double._path(request.args.get("path"))
            if not path.is_dir():
                raise _Error(404, f"ls: cannot access '{path}': No such file or directory")
            out = []
            for child in sorted(path.iterdir()):
                st = child.lstat()
                kind = "l" if child.is_symlink() else ("d" if child.is_dir() else "-")
                out.append(
                    {
                        "name": child.name,
                        "type": kind,
                        "linkTarget": os.readlink(child) if kind == "l" else None,
                        "size": str(st.st_size),  # a string, as the real server sends it
                        # one-second resolution, as the real server sends it
                        "lastModified": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(st.st_mtime)),
                        "permissions": "rw-r--r--",
                    }
                )
            return jsonify({"output": out})

        @app.post("/filesystem/<system>/ops/mkdir")
        def mkdir(system):
            double._system(system)
            body = request.get_json()
            path = double._path(body.get("sourcePath"))
            path.mkdir(parents=bool(body.get("parent")), exist_ok=bool(body.get("parent")))
            return jsonify({"output": {"name": path.name, "type": "d"}}), 201

        @app.post("/filesystem/<system>/ops/symlink")
        def symlink(system):
            double._system(system)
            body = request.get_json()
            link = double._path(body.get("linkPath"))
            if link.exists() or link.is_symlink():
                raise _Error(400, f"ln: failed to create symbolic link '{link}': File exists")
            link.symlink_to(double._path(body.get("sourcePath")))
            return jsonify({}), 201

        @app.post("/filesystem/<system>/ops/upload")
        def upload(system):
            double._system(system)
            directory = double._path(request.args.get("path"))
            handle = request.files["file"]
            target = double._path(str(directory / handle.filename))
            target.write_bytes(handle.read())
            return Response(status=204)

        @app.get("/filesystem/<system>/ops/download")
        def download(system):
            double._system(system)
            path = double._existing(request.args.get("path"))
            return Response(path.read_bytes(), mimetype="application/octet-stream")

        @app.get("/filesystem/<system>/ops/stat")
        def stat(system):
            double._system(system)
            path = double._path(request.args.get("path"))
            if not path.exists():
                raise _Error(404, f"stat: cannot statx '{path}': No such file or directory")
            st = path.stat()
            return jsonify({"output": {"size": st.st_size, "mtime": int(st.st_mtime), "mode": st.st_mode}})

        @app.get("/filesystem/<system>/ops/checksum")
        def checksum(system):
            double._system(system)
            path = double._existing(request.args.get("path"))
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            return jsonify({"output": {"algorithm": "SHA256", "checksum": digest}})

        @app.get("/filesystem/<system>/ops/view")
        def view(system):
            double._system(system)
            return jsonify({"output": double._existing(request.args.get("path")).read_text()})

        @app.get("/filesystem/<system>/ops/tail")
        def tail(system):
            double._system(system)
            data = double._existing(request.args.get("path")).read_bytes()
            count = int(request.args.get("bytes") or 0)
            if not count:
                # bytes=0 drops the option: plain `tail`, the last 10 lines
                data = b"".join(data.splitlines(keepends=True)[-10:])
            elif request.args.get("skipHeading") in ("true", "True"):
                data = data[count - 1 :]  # `tail --bytes=+N`: starts at the N-th byte (1-based)
            else:
                data = data[-count:]
            return jsonify({"output": data.decode("utf-8", "replace")})

        @app.delete("/filesystem/<system>/ops/rm")
        def rm(system):
            double._system(system)
            path = double._path(request.args.get("path"))
            if not path.exists() and not path.is_symlink():
                raise _Error(404, f"rm: cannot remove '{path}': No such file or directory")
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
            return Response(status=204)

        # -- transfers (files over MAX_DIRECT_UPLOAD_SIZE) ----------------------------------------
        @app.post("/filesystem/<system>/transfer/upload")
        def transfer_upload(system):
            double._system(system)
            if not double.staging:
                raise _Error(500, "S3 staging is not configured on this server")
            body = request.get_json()
            target = double._path(body.get("path"))
            size = int((body.get("transfer_directives") or {}).get("file_size") or 0)
            part = 512 * 1024
            key = secrets.token_hex(8)
            double.transfers[key] = {"target": target, "parts": {}}
            urls = [f"{double.url}/_stage/{key}/{i}" for i in range(max(1, -(-size // part)))]
            return jsonify(
                {
                    "transferJob": double._transfer_job(system, "File was successfully uploaded"),
                    "transferDirectives": {
                        "transfer_method": "s3",
                        "parts_upload_urls": urls,
                        "max_part_size": part,
                        "complete_upload_url": f"{double.url}/_stage/{key}/complete",
                    },
                }
            ), 201

        @app.put("/_stage/<key>/<int:index>")
        def stage_part(key, index):
            data = request.get_data()
            double.transfers[key]["parts"][index] = data
            return Response(status=200, headers={"ETag": f'"{hashlib.md5(data).hexdigest()}"'})  # noqa: S324

        @app.post("/_stage/<key>/complete")
        def stage_complete(key):
            transfer = double.transfers[key]
            parts = transfer["parts"]
            transfer["target"].write_bytes(b"".join(parts[i] for i in sorted(parts)))
            return Response(status=200)

        @app.post("/filesystem/<system>/transfer/download")
        def transfer_download(system):
            double._system(system)
            source = double._existing(request.get_json().get("source_path"))
            key = secrets.token_hex(8)
            double.transfers[key] = {"source": source}
            return jsonify(
                {
                    "transferJob": double._transfer_job(system, "File was successfully downloaded"),
                    "transferDirectives": {"transfer_method": "s3", "download_url": f"{double.url}/_stage/{key}"},
                }
            ), 201

        @app.get("/_stage/<key>")
        def stage_download(key):
            return Response(double.transfers[key]["source"].read_bytes(), mimetype="application/octet-stream")

        # -- compute ------------------------------------------------------------------------------
        @app.post("/compute/<system>/jobs")
        def submit(system):
            double._system(system)
            body = (request.get_json() or {}).get("job") or {}
            job = double._start_job(body)
            with double._lock:
                double.jobs[job.job_id] = job
            return jsonify({"jobId": str(job.job_id)}), 201

        @app.get("/compute/<system>/jobs")
        def jobs(system):
            double._system(system)
            name = request.args.get("name")
            out = []
            for job in list(double.jobs.values()):
                if job.transfer or (name and job.name != name):
                    continue
                if job.owner != g.get("subject"):
                    continue  # FirecREST lists the caller's own jobs
                if job.hidden_lookups > 0:
                    job.hidden_lookups -= 1
                    continue
                record = double._visible_json(job)
                if record is not None:
                    out.append(record)
            return jsonify({"jobs": out})

        @app.get("/compute/<system>/jobs/<int:job_id>")
        def job(system, job_id):
            double._system(system)
            found = double.jobs.get(job_id)
            if found is None or found.owner != g.get("subject"):
                raise _Error(404, "Job not found")
            if found.hidden_lookups > 0:
                found.hidden_lookups -= 1
                raise _Error(404, "Job not found")
            record = double._visible_json(found)
            return jsonify({"jobs": [record] if record is not None else []})

        @app.delete("/compute/<system>/jobs/<int:job_id>")
        def cancel(system, job_id):
            double._system(system)
            found = double.jobs.get(job_id)
            if found is None or found.owner != g.get("subject"):
                # The real server passes scancel's refusal on as a 500, not a 404.
                raise _Error(500, f"scancel: error: Kill job error on job id {job_id}: Invalid job id specified")
            state, _code = double._job_state(found)
            if state.split(" ")[0] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"):
                raise _Error(
                    500, f"scancel: error: Kill job error on job id {job_id}: Job/step already completing or complete"
                )
            found.cancelled = True
            if found.proc is not None:
                os.killpg(found.proc.pid, signal.SIGTERM)
                found.proc.wait(10)
            elif found.slurm_id:
                subprocess.run(["scancel", found.slurm_id], capture_output=True, check=False)
            return Response(status=204)

        return app

    def _system(self, system: str):
        if system != self.system:
            raise _Error(404, f"System '{system}' not found")

    def _existing(self, raw) -> Path:
        path = self._path(raw)
        if not path.is_file():
            raise _Error(404, f"{raw}: No such file or directory")
        return path

    def wipe(self):
        shutil.rmtree(self.fs_root, ignore_errors=True)


def _matches(path_part: str, path: str) -> bool:
    """A fault's target: a substring of the path, or the exact path when it ends with ``$``."""
    return path == path_part[:-1] if path_part.endswith("$") else path_part in path


def take_fault(faults: list[Fault], after: bool) -> Fault | None:
    """The first fault armed for this request (its path, its method, before or after the route
    ran), counted down and its delay slept; the double turns it into its provider's answer. One
    matcher for the FirecREST, Qarnot and Run:AI doubles."""
    for fault in faults:
        if fault.times <= 0 or fault.after != after or not _matches(fault.path_part, request.path):
            continue
        if fault.method and fault.method != request.method:
            continue
        fault.times -= 1
        if fault.delay:
            time.sleep(fault.delay)
        return fault
    return None


# The doubles' request lines would drown the test output.
logging.getLogger("werkzeug").setLevel(logging.WARNING)


class _Error(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message
