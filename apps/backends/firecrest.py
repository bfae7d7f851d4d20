"""The FirecREST backend: Slurm jobs on an HPC system through the FirecREST v2 API (pyfirecrest).

Quirks this module absorbs so the core never sees them:

- **Credentials** (R-BACK-1): OIDC client credentials from the environment variables named by the
  pool's ``client_id_env``/``client_secret_env``; ``ClientCredentialsAuth`` caches the token, so
  one client is kept per (API, credential) in this process. Values never reach a message:
  every provider error goes through :func:`remote_common.scrub`.
- **Remote id = ``<job id>@<system>``**: a class may override the system (``system_name``), and
  the poll pass only has the pool's remote, so the id carries the system it was submitted to.
- **Job name = case id.** ``find`` asks ``job_info(name=case id)`` before every submission, and a
  submission whose answer timed out looks the job up the same way before giving up, so a retried
  launch adopts the job instead of creating a second one (R-CASE-1).
- **One status call per (system, credential) per pass** (R-BACK-4): ``poll_many`` lists the
  user's jobs once (``GET /compute/{system}/jobs``) and picks every case out of that list; a job
  missing from it is looked up alone, and a 404 there (right after submit FirecREST/Slurm may not
  list it yet) is a failed poll, never a failure (R-CASE-3).
- **States** are Slurm's, possibly a list or comma-joined ("COMPLETED", "CANCELLED by 1234",
  ["FAILED"]): COMPLETED is success only with exit code 0; unknown states map to pending.
- **Files**: ``ops/upload``/``ops/download`` below ~1 MiB; above, pyfirecrest goes through the
  transfer endpoints (S3 staging and a transfer job), which this module simply lets it do.
- **Output deltas** (R-CASE-5) come from ``ops/tail`` with ``skipHeading`` at the byte offset the
  workspace log already has, so a restarted worker resumes exactly where the last one stopped.

Remote layout: ``<working_root>/<case id>/`` holds ``work/`` (inputs, the job's working
directory), ``stdout`` and ``stderr``; a campaign's shared inputs are uploaded once to
``<working_root>/campaigns/<campaign id>/shared/`` and linked as ``work/shared``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import posixpath
import threading
import time
from pathlib import Path

from apps.backends import files, sbatch
from apps.backends.base import (
    AlreadyFinished,
    BackendError,
    BackendState,
    BackendStatus,
    Check,
    Choice,
    ExecutionBackend,
    JobRef,
    LaunchOption,
    LaunchOptions,
    SubmitSpec,
    SubmitUncertain,
)
from apps.backends.remote_common import (
    LIVE_MAX_BYTES,
    MissingCredential,
    confined_target,
    env_secret,
    glob_matches,
    scrub,
)
from apps.backends.slurm import STATES, TIME_CHOICES, parse_elapsed
from apps.resources.remote import with_defaults

logger = logging.getLogger(__name__)

TIMEOUT = 30.0  # seconds per HTTP request: a hung API is a failed call, not a hung worker
RATE_LIMIT_RETRIES = 2  # pyfirecrest sleeps Retry-After on 429; bounded so a pass stays bounded
FIND_AFTER_TIMEOUT_ATTEMPTS = 3
FIND_AFTER_TIMEOUT_SLEEP = 1.0
MAX_DELTA_CHARS = 4 << 20
MAX_WALK_ENTRIES = 5000
STATE_DIR = ".firecrest"  # hidden in the case workspace: not listed, not a result

_clients: dict[tuple, object] = {}
_clients_lock = threading.Lock()


class ProviderError(BackendError):
    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def _sdk():
    try:
        import firecrest
        from firecrest.v2 import Firecrest
    except ImportError as exc:  # pragma: no cover - pinned in requirements.txt
        raise BackendError(f"pyfirecrest is not installed ({exc}): pip install -r requirements.txt") from None
    return firecrest, Firecrest


def map_state(raw, exit_code=None) -> str:
    """Slurm state(s) → BackendStatus. A list or comma-joined value ends only when every part
    has; then the worst part decides. COMPLETED with a non-zero exit code is a failure."""
    if isinstance(raw, list | tuple):
        words = [str(w) for w in raw]
    else:
        words = str(raw or "").split(",")
    mapped = []
    for word in words:
        key = word.strip().split(" ")[0].rstrip("+").upper()
        if key:
            mapped.append(STATES.get(key, BackendStatus.PENDING))
    if not mapped:
        return BackendStatus.PENDING
    if all(status in BackendStatus.TERMINAL for status in mapped):
        for worst in (BackendStatus.FAILED, BackendStatus.CANCELLED):
            if worst in mapped:
                return worst
        code = _exit_code(exit_code)
        return BackendStatus.SUCCEEDED if code in (None, 0) else BackendStatus.FAILED
    if BackendStatus.RUNNING in mapped or any(status in BackendStatus.TERMINAL for status in mapped):
        return BackendStatus.RUNNING
    return BackendStatus.PENDING


def _exit_code(value) -> int | None:
    if value is None or value == "":
        return None
    if isinstance(value, int):
        return value
    text = str(value).split(":")[0]  # Slurm's "code:signal"
    try:
        return int(text)
    except ValueError:
        return None


def split_remote_id(remote_id: str, default_system: str) -> tuple[str, str]:
    job_id, sep, system = str(remote_id).partition("@")
    return job_id, (system if sep and system else default_system)


class Session:
    """One pool's view of FirecREST: the client, the system, the secrets to scrub."""

    def __init__(self, remote: dict, system: str | None = None):
        self.remote = with_defaults("firecrest", remote or {})
        self.api_url = self.remote.get("api_url") or ""
        self.system = system or self.remote.get("system_name") or ""
        self.id_env = self.remote.get("client_id_env")
        self.secret_env = self.remote.get("client_secret_env")
        self._client = None
        self.secrets: list[str] = []

    def credentials(self) -> tuple[str, str]:
        client_id = env_secret(self.id_env, "FirecREST client id")
        secret = env_secret(self.secret_env, "FirecREST client secret")
        self.secrets = [client_id, secret]
        return client_id, secret

    @property
    def group_key(self) -> tuple:
        """Cases sharing this key share one status call per pass (R-BACK-4)."""
        return (self.api_url, self.system, self.id_env, self.secret_env)

    @property
    def client(self):
        if self._client is None:
            firecrest, Firecrest = _sdk()
            client_id, secret = self.credentials()
            digest = hashlib.sha256(f"{client_id}\0{secret}".encode()).hexdigest()
            key = (self.api_url, self.remote.get("token_uri"), digest)
            with _clients_lock:
                client = _clients.get(key)
                if client is None:
                    auth = firecrest.ClientCredentialsAuth(client_id, secret, self.remote.get("token_uri"))
                    auth.timeout = TIMEOUT
                    client = Firecrest(firecrest_url=self.api_url, authorization=auth)
                    client.timeout = TIMEOUT
                    client.num_retries_rate_limit = RATE_LIMIT_RETRIES
                    _clients[key] = client
            self._client = client
        return self._client

    def call(self, what: str, method: str, *args, **kwargs):
        """Call the SDK; every failure becomes a ProviderError whose message is safe to show."""
        client = self.client
        try:
            return getattr(client, method)(*args, **kwargs)
        except BackendError:
            raise
        except Exception as exc:
            status, detail = describe(exc)
            raise ProviderError(scrub(f"FirecREST {what} failed: {detail}", self.secrets), status) from None

    @property
    def working_root(self) -> str:
        root = self.remote.get("working_root")
        if not root:
            raise BackendError("the pool has no remote.working_root: set the remote directory for case workspaces")
        return root.rstrip("/") or "/"

    def run_dir(self, case_id: str) -> str:
        return posixpath.join(self.working_root, case_id)


def describe(exc: Exception) -> tuple[int | None, str]:
    """(HTTP status, message) for an SDK or transport exception, without request headers."""
    import httpx
    import requests

    firecrest, _ = _sdk()
    if isinstance(exc, firecrest.ClientsCredentialsException):
        status = exc.responses[-1].status_code if exc.responses else None
        return status, f"the token endpoint refused the client credentials (HTTP {status}): check them"
    if isinstance(exc, firecrest.FirecrestException):
        response = exc.responses[-1] if exc.responses else None
        if response is None:
            return None, type(exc).__name__
        try:
            body = response.json()
            detail = body.get("message") or body.get("description") or json.dumps(body)[:300]
        except ValueError:
            detail = response.text[:300]
        return response.status_code, f"HTTP {response.status_code}: {detail}"
    if isinstance(exc, httpx.TimeoutException | requests.Timeout):
        return None, f"no answer within {TIMEOUT:g} s (timeout)"
    if isinstance(exc, httpx.TransportError | requests.ConnectionError):
        return None, f"cannot connect ({type(exc).__name__})"
    if isinstance(exc, firecrest.NotImplementedOnAPIversion):
        return None, f"not supported by this FirecREST version: {exc}"
    return None, f"{type(exc).__name__}: {exc}"


def _is_timeout(exc: ProviderError) -> bool:
    return exc.status is None and "timeout" in str(exc)


class FirecrestBackend(ExecutionBackend):
    name = "firecrest"
    kinds = ("firecrest",)

    # -- submission --------------------------------------------------------------------------
    def _session(self, spec: SubmitSpec) -> Session:
        system = spec.environment.get("RSC_FIRECREST_SYSTEM_NAME")  # class override, else pool
        return Session(spec.pool_remote, system)

    def find(self, spec: SubmitSpec) -> str | None:
        session = self._session(spec)
        return self._find(session, spec.case_id)

    def _find(self, session: Session, case_id: str) -> str | None:
        firecrest, _ = _sdk()
        try:
            jobs = session.client.job_info(session.system, name=case_id)
        except firecrest.NotImplementedOnAPIversion:
            # API < 2.6 has no name filter: list the user's jobs and filter here.
            jobs = session.call("job lookup", "job_info", session.system)
        except BackendError:
            raise
        except Exception as exc:
            status, detail = describe(exc)
            if status == 404:
                return None
            raise ProviderError(scrub(f"FirecREST job lookup failed: {detail}", session.secrets), status) from None
        ids = [str(job.get("jobId")) for job in jobs or [] if job.get("name") == case_id and job.get("jobId")]
        ids = [i for i in ids if i.isdigit()]
        return f"{max(ids, key=int)}@{session.system}" if ids else None

    def job_script(self, spec: SubmitSpec, rdir: str) -> str:
        """R-BACK-4: ``#SBATCH`` lines from the launch specification and the (already allowed)
        launch options, through the renderer the Slurm backend uses too."""
        return sbatch.render(
            job_name=spec.case_id,
            run_dir=rdir,
            batch_directives=spec.batch_directives,
            launch_options=spec.launch_options,
            environment={**spec.environment, "GRIDGATE_CASE_ID": spec.case_id},
            command=spec.command,
            export_none=False,
            make_progress_dir=True,
        )

    def _upload_tree(self, session: Session, local_root: Path, remote_root: str, heartbeat=None) -> dict[str, list]:
        """Upload every regular file under ``local_root``; returns {rel: [size, sha256]}."""
        manifest = {}
        made = {remote_root}
        account = session.remote.get("account")
        for rel, path in files.walk_files(local_root):
            if heartbeat is not None:
                heartbeat()  # renew the launch lease between uploads (R-CASE-1)
            directory = posixpath.join(remote_root, posixpath.dirname(rel)) if "/" in rel else remote_root
            if directory not in made:
                session.call(f"mkdir {directory}", "mkdir", session.system, directory, create_parents=True)
                made.add(directory)
            # pyfirecrest sends files under ~1 MiB to ops/upload and larger ones through the
            # transfer endpoints (S3 staging + a transfer job), blocking until they land.
            session.call(
                f"upload of {rel}",
                "upload",
                session.system,
                str(path),
                directory,
                posixpath.basename(rel),
                account=account,
            )
            manifest[rel] = [path.stat().st_size, files._hash(path)]
        return manifest

    def _upload_shared(self, session: Session, shared_dir: Path, heartbeat=None) -> str:
        """A campaign's shared inputs, uploaded once per campaign (a marker says it is complete)."""
        campaign_root = posixpath.join(session.working_root, "campaigns", shared_dir.parent.name)
        target = posixpath.join(campaign_root, "shared")
        marker = posixpath.join(campaign_root, ".gridgate-complete")
        try:
            session.call("stat of the shared-inputs marker", "stat", session.system, marker)
            return target
        except ProviderError as exc:
            if exc.status != 404:
                raise
        session.call(f"mkdir {target}", "mkdir", session.system, target, create_parents=True)
        self._upload_tree(session, shared_dir, target, heartbeat)
        session.call(
            "upload of the shared-inputs marker", "upload", session.system, _bytes_io(b"ok\n"), campaign_root,
            ".gridgate-complete", file_size=3,
        )  # fmt: skip
        return target

    def submit(self, spec: SubmitSpec) -> str:
        if not spec.command.strip():
            raise BackendError("the case has no command to run")
        session = self._session(spec)
        rdir = session.run_dir(spec.case_id)
        work = posixpath.join(rdir, "work")
        script = self.job_script(spec, rdir)  # validates launch options before anything is sent
        session.call(f"mkdir {work}", "mkdir", session.system, posixpath.join(work, ".gridgate"), create_parents=True)
        manifest = self._upload_tree(session, spec.inputs_dir, work, spec.heartbeat)
        if spec.shared_dir is not None and spec.shared_dir.is_dir():
            target = self._upload_shared(session, spec.shared_dir, spec.heartbeat)
            try:
                session.call("link of shared/", "symlink", session.system, target, posixpath.join(work, "shared"))
            except ProviderError as exc:
                if exc.status not in (400, 409):  # already linked by an earlier attempt
                    raise
        _save_state(spec.workspace, "manifest.json", manifest)
        spec.heartbeat()  # last check that the launch is still ours before the job exists
        try:
            answer = session.call("job submission", "submit", session.system, working_dir=work, script_str=script)
        except ProviderError as exc:
            if not _is_timeout(exc) and exc.status not in (502, 503, 504):
                raise
            # The request may have reached Slurm: adopt the job if it is there (R-CASE-1).
            for attempt in range(FIND_AFTER_TIMEOUT_ATTEMPTS):
                try:
                    found = self._find(session, spec.case_id)
                except BackendError:
                    found = None
                if found:
                    logger.info("case %s: submission timed out; adopted job %s", spec.case_id, found)
                    return found
                if attempt + 1 < FIND_AFTER_TIMEOUT_ATTEMPTS:
                    time.sleep(FIND_AFTER_TIMEOUT_SLEEP)
            raise SubmitUncertain(f"{exc}; the job is not listed (yet): the launch will be retried") from None
        job_id = str(answer.get("jobId") or "")
        if not job_id.isdigit():
            raise BackendError(f"FirecREST answered {answer!r} instead of a job id")
        return f"{job_id}@{session.system}"

    # -- observation -----------------------------------------------------------------------
    def poll(self, job: JobRef) -> BackendState:
        result = self.poll_many([job])[job.remote_id]
        if isinstance(result, Exception):
            raise result
        return result

    def poll_many(self, jobs: list[JobRef]) -> dict[str, BackendState | Exception]:
        groups: dict[tuple, tuple[Session, list[JobRef]]] = {}
        for job in jobs:
            session = Session(job.pool_remote)
            _job_id, system = split_remote_id(job.remote_id, session.system)
            session.system = system
            groups.setdefault(session.group_key, (session, []))[1].append(job)
        out: dict[str, BackendState | Exception] = {}
        for session, group in groups.values():
            out.update(self._poll_group(session, group))
        return out

    def _poll_group(self, session: Session, group: list[JobRef]) -> dict[str, BackendState | Exception]:
        try:
            listing = session.call("job listing", "job_info", session.system)  # the one status call
        except BackendError as exc:
            return {job.remote_id: exc for job in group}
        known = {str(entry.get("jobId")): entry for entry in listing or []}
        out: dict[str, BackendState | Exception] = {}
        for job in group:
            job_id, _system = split_remote_id(job.remote_id, session.system)
            try:
                entry = known.get(job_id)
                if entry is None or entry.get("name") != job.case_id:
                    entry = self._lookup_one(session, job)
                out[job.remote_id] = self._state(session, job, entry)
            except Exception as exc:  # one bad job must not fail the others' polls
                out[job.remote_id] = exc
        return out

    def _lookup_one(self, session: Session, job: JobRef) -> dict:
        job_id, _system = split_remote_id(job.remote_id, session.system)
        try:
            entries = session.call(f"lookup of job {job_id}", "job_info", session.system, job_id)
        except ProviderError as exc:
            if exc.status == 404:
                # Right after submit FirecREST may not know the job yet: a failed poll (R-CASE-3).
                raise BackendError(f"FirecREST does not know job {job_id} (yet)") from None
            raise
        for entry in entries or []:
            if str(entry.get("jobId")) == job_id and entry.get("name") in (job.case_id, None):
                return entry
        raise BackendError(f"FirecREST does not list job {job_id} for case {job.case_id}")

    def _state(self, session: Session, job: JobRef, entry: dict) -> BackendState:
        status_info = entry.get("status") or {}
        raw = status_info.get("state")
        exit_code = status_info.get("exitCode")
        status = map_state(raw, exit_code)
        elapsed = (entry.get("time") or {}).get("elapsed")
        if isinstance(elapsed, str):
            elapsed = parse_elapsed(elapsed)
        stdout = stderr = ""
        if status != BackendStatus.PENDING:
            rdir = session.run_dir(job.case_id)
            try:
                stdout = self._delta(session, posixpath.join(rdir, "stdout"), job.workspace / "stdout.log")
                stderr = self._delta(session, posixpath.join(rdir, "stderr"), job.workspace / "stderr.log")
            except BackendError:
                if status in BackendStatus.TERMINAL:
                    raise  # the last output must be caught up before the case ends
                stdout = stderr = ""  # caught up at the next poll: the offset lives on disk
        message = ""
        words = ",".join(raw) if isinstance(raw, list) else str(raw or "")
        if status == BackendStatus.FAILED:
            reason = status_info.get("stateReason")
            message = f"Slurm job {entry.get('jobId')} ended {words}" + (
                f" (exit code {exit_code})" if exit_code not in (None, "") else ""
            )
            if reason and reason != "None":
                message += f": {reason}"
        return BackendState(
            status=status,
            stdout_delta=stdout,
            stderr_delta=stderr,
            execution_time=float(elapsed) if isinstance(elapsed, int | float) else None,
            message=message,
        )

    def _delta(self, session: Session, remote_path: str, local_log: Path) -> str:
        try:
            offset = local_log.stat().st_size
        except FileNotFoundError:
            offset = 0
        try:
            text = session.call(
                "output tail", "tail", session.system, remote_path, num_bytes=offset, exclude_beginning=True
            )
        except ProviderError as exc:
            if exc.status == 404:
                return ""  # Slurm has not created the file yet
            raise
        if isinstance(text, dict):  # some API versions wrap the content
            text = text.get("content", "")
        return str(text or "")[:MAX_DELTA_CHARS]

    # -- files --------------------------------------------------------------------------------
    def _walk(self, session: Session, root: str, skip_top: tuple[str, ...]):
        """(rel, entry) for regular files under ``root``; symlinks are never followed."""
        pending = [("", root)]
        seen = 0
        while pending:
            rel_dir, path = pending.pop()
            for entry in session.call(f"listing of {path}", "list_files", session.system, path, show_hidden=True):
                seen += 1
                if seen > MAX_WALK_ENTRIES:
                    raise BackendError(f"more than {MAX_WALK_ENTRIES} entries under {root}: not walking further")
                name = str(entry.get("name") or "").rsplit("/", 1)[-1]
                if name in ("", ".", ".."):
                    continue
                rel = f"{rel_dir}/{name}" if rel_dir else name
                if not rel_dir and name in skip_top:
                    continue
                kind = str(entry.get("type") or "")
                if kind == "d":
                    pending.append((rel, posixpath.join(path, name)))
                elif kind in ("-", "f", "file"):
                    yield rel, entry

    def sync(self, job: JobRef, globs: list[str]) -> None:
        session = Session(job.pool_remote)
        session.system = split_remote_id(job.remote_id, session.system)[1]
        work = posixpath.join(session.run_dir(job.case_id), "work")
        live = job.workspace / "live"
        seen = _load_state(job.workspace, "live.json")
        for rel, entry in self._walk(session, work, ("shared",)):
            if not glob_matches(rel, globs):
                continue
            size = int(entry.get("size") or 0)
            stamp = [size, str(entry.get("lastModified") or "")]
            target = confined_target(live, rel)
            if target is None or size > LIVE_MAX_BYTES:
                continue
            if seen.get(rel) == stamp and target.exists():
                continue  # unchanged since the last sync: not downloaded again
            self._download(session, posixpath.join(work, rel), target)
            seen[rel] = stamp
        _save_state(job.workspace, "live.json", seen)

    def fetch_final(self, job: JobRef) -> None:
        session = Session(job.pool_remote)
        session.system = split_remote_id(job.remote_id, session.system)[1]
        work = posixpath.join(session.run_dir(job.case_id), "work")
        manifest = _load_state(job.workspace, "manifest.json")
        results = job.workspace / "results"
        results.mkdir(parents=True, exist_ok=True)
        for rel, entry in self._walk(session, work, files.NOT_RESULTS):
            size = int(entry.get("size") or 0)
            known = manifest.get(rel)
            if known and known[0] == size:
                answer = session.call(f"checksum of {rel}", "checksum", session.system, posixpath.join(work, rel))
                if isinstance(answer, dict) and answer.get("checksum") == known[1]:
                    continue  # an input the job did not change is not a result
            target = confined_target(results, rel)
            if target is None:
                continue
            self._download(session, posixpath.join(work, rel), target)

    def _download(self, session: Session, source: str, target: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.part")
        try:
            session.call(f"download of {source}", "download", session.system, source, str(tmp))
        except FileNotFoundError:
            raise BackendError(f"{source} vanished during the download") from None
        tmp.replace(target)

    # -- cancel --------------------------------------------------------------------------------
    def cancel(self, job: JobRef) -> None:
        session = Session(job.pool_remote)
        job_id, session.system = split_remote_id(job.remote_id, session.system)
        state = self._poll_group(session, [job])[job.remote_id]
        if isinstance(state, BackendState) and state.status in BackendStatus.TERMINAL:
            raise AlreadyFinished(f"Slurm job {job_id} already ended")
        try:
            session.call(f"cancel of job {job_id}", "cancel_job", session.system, job_id)
        except ProviderError as exc:
            if exc.status == 404:
                # FirecREST answers 404 for a job Slurm no longer holds: it has finished.
                raise AlreadyFinished(f"Slurm job {job_id} already ended") from None
            raise

    # -- launch form and doctor ----------------------------------------------------------------
    def launch_options(self, pool) -> LaunchOptions:
        time_option = LaunchOption(
            "time", "Time limit", [Choice(value, label) for value, label in TIME_CHOICES], "01:00:00"
        )
        session = Session(pool.remote if pool is not None else {})
        configured = session.remote.get("partition")
        try:
            partitions = session.call("partition listing", "partitions", session.system)
        except BackendError as exc:
            fallback = [Choice(configured, configured)] if configured else []
            return LaunchOptions(
                options=[LaunchOption("partition", "Partition", fallback, configured), time_option],
                degraded=True,
                message=str(exc),
            )
        names = [str(p.get("name")) for p in partitions or [] if p.get("name")]
        default = configured if configured in names else (names[0] if names else configured)
        return LaunchOptions(
            options=[LaunchOption("partition", "Partition", [Choice(n, n) for n in names], default), time_option]
        )

    def pin_class_overrides(self, answer: LaunchOptions, resource_class) -> LaunchOptions:
        return sbatch.pin_class_partition(answer, resource_class)

    def doctor(self, pool=None) -> list[Check]:
        checks = []
        try:
            firecrest, _ = _sdk()
            checks.append(Check("sdk", True, f"pyfirecrest {firecrest.__version__} is installed"))
        except BackendError as exc:
            return [Check("sdk", False, str(exc))]
        if pool is None:
            checks.append(Check("pool", True, "no FirecREST pool configured: nothing more to check"))
            return checks
        session = Session(pool.remote)
        try:
            session.credentials()
            checks.append(
                Check("credentials", True, f"{session.id_env} and {session.secret_env} are set (values not shown)")
            )
        except MissingCredential as exc:
            checks.append(Check("credentials", False, str(exc)))
            return checks
        try:
            session.client._authorization.get_access_token()
            checks.append(Check("auth", True, "the token endpoint issued a token for these client credentials"))
        except Exception as exc:
            _status, detail = describe(exc)
            checks.append(
                Check(
                    "auth", False, scrub(f"no token from {session.remote.get('token_uri')}: {detail}", session.secrets)
                )
            )
            return checks
        try:
            systems = session.call("system listing", "systems")
            names = [s.get("name") for s in systems or []]
            checks.append(Check("reachability", True, f"{session.api_url} answers ({len(names)} systems)"))
        except BackendError as exc:
            checks.append(Check("reachability", False, str(exc)))
            return checks
        system = next((s for s in systems if s.get("name") == session.system), None)
        if system is None:
            checks.append(
                Check(
                    "system",
                    False,
                    f"system {session.system!r} is not offered ({', '.join(map(str, names)) or 'none'}): "
                    "fix remote.system_name",
                )
            )
            return checks
        health = (system.get("servicesHealth") or [{}])[0] if isinstance(system.get("servicesHealth"), list) else {}
        healthy = health.get("healthy", True) is not False
        checks.append(
            Check("system", healthy, f"system {session.system} " + ("is up" if healthy else "reports unhealthy"))
        )
        partition = session.remote.get("partition")
        if partition:
            try:
                partitions = [p.get("name") for p in session.call("partition listing", "partitions", session.system)]
                ok = partition in partitions
                checks.append(
                    Check(
                        "partition",
                        ok,
                        f"partition {partition} exists"
                        if ok
                        else f"partition {partition} is not on {session.system} ({', '.join(partitions)}): "
                        "fix remote.partition",
                    )
                )
            except BackendError as exc:
                checks.append(Check("partition", False, str(exc)))
        root = session.remote.get("working_root")
        if not root:
            checks.append(Check("working_root", False, "remote.working_root is not set: cases need it"))
        else:
            try:
                session.call("working_root creation", "mkdir", session.system, root, create_parents=True)
                checks.append(Check("working_root", True, f"{root} exists and is writable on {session.system}"))
            except BackendError as exc:
                checks.append(Check("working_root", False, f"{exc}: fix remote.working_root"))
        return checks


def _bytes_io(data: bytes):
    import io

    return io.BytesIO(data)


def _state_path(workspace: Path, name: str) -> Path:
    return workspace / STATE_DIR / name


def _load_state(workspace: Path, name: str) -> dict:
    try:
        return json.loads(_state_path(workspace, name).read_text())
    except (OSError, ValueError):
        return {}


def _save_state(workspace: Path, name: str, data: dict) -> None:
    path = _state_path(workspace, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{name}.part")
    tmp.write_text(json.dumps(data, sort_keys=True))
    tmp.replace(path)
