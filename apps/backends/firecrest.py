"""The FirecREST backend: Slurm jobs on an HPC system through the FirecREST v2 API (pyfirecrest).

Quirks this module absorbs so the core never sees them:

- **Credentials** (R-BACK-1): on a per-user pool (``"credentials": "user"``, docs/backends.md
  "Per-user credentials") every call about a case carries its owner's access token, obtained
  through the :class:`~apps.backends.base.RemoteIdentity` the core passes in (refresh grant,
  rotated refresh token stored back); a call without a user identity is refused, never made
  under the service account (R-CRED-1). On a service pool: OIDC client credentials from the
  environment variables named by the pool's ``client_id_env``/``client_secret_env``;
  ``ClientCredentialsAuth`` caches the token. One client is kept per (API, credential) in this
  process. Values never reach a message: every provider error goes through
  :func:`remote_common.scrub`.
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
    RemoteIdentity,
    SubmitSpec,
    SubmitUncertain,
)
from apps.backends.remote_common import (
    LIVE_MAX_BYTES,
    MissingCredential,
    confined_target,
    env_secret,
    glob_matches,
    load_state,
    provider_words,
    save_state,
    scrub,
)
from apps.backends.slurm import STATES, TIME_CHOICES, parse_elapsed
from apps.resources.remote import USER, authorization_endpoint, credential_mode, revocation_endpoint, with_defaults

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


#: pyfirecrest reuses a token until this many seconds before it expires. The real server refuses
#: a token with less than 30 s left (401 "expires too soon"); the SDK's default of 10 s made a
#: call fail in every token cycle. 60 s leaves room for the request itself.
MIN_TOKEN_VALIDITY = 60


class ProviderError(BackendError):
    """A FirecREST call failed. The facts a caller decides on are attributes set where the SDK's
    exception is caught (never read back from the message):

    - ``status``: the HTTP status, or None when no answer came;
    - ``timeout``: no answer within ``TIMEOUT``: the request may have been carried out;
    - ``dropped``: the connection was lost after the request was sent: it may have been carried out;
    - ``permanent``: retrying the same call will not help (a 4xx refusal).
    """

    def __init__(
        self,
        message: str,
        status: int | None = None,
        *,
        timeout: bool = False,
        dropped: bool = False,
        permanent: bool = False,
    ):
        super().__init__(message)
        self.status = status
        self.timeout = timeout
        self.dropped = dropped
        self.permanent = permanent

    @property
    def transient(self) -> bool:
        """Retrying later may work (R-CASE-1): anything but a refusal (4xx) is transient."""
        return not self.permanent

    @property
    def maybe_done(self) -> bool:
        """The request may have reached the server and been carried out (R-CASE-1)."""
        return self.timeout or self.dropped or self.status in (502, 503, 504)


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


class UserTokenAuth:
    """pyfirecrest's authorization object for a per-user pool: the access token comes from the
    case owner's :class:`RemoteIdentity` (the core's; it refreshes and stores the rotated refresh
    token). ``forget()`` makes the next request ask for a fresh one (the 401 retry below)."""

    def __init__(self, identity: RemoteIdentity):
        self.identity = identity
        self.timeout = TIMEOUT
        self.last_token = ""
        self._fresh = False

    def get_access_token(self) -> str:
        fresh, self._fresh = self._fresh, False
        self.last_token = self.identity.token(fresh=fresh)
        return self.last_token

    def forget(self) -> None:
        self._fresh = True


class Session:
    """One pool's view of FirecREST for one credential: the client, the system, the secrets to scrub."""

    def __init__(self, remote: dict, system: str | None = None, identity: RemoteIdentity | None = None):
        self.remote = with_defaults("firecrest", remote or {})
        self.api_url = self.remote.get("api_url") or ""
        self.system = system or self.remote.get("system_name") or ""
        self.id_env = self.remote.get("client_id_env")
        self.secret_env = self.remote.get("client_secret_env")
        self.per_user = credential_mode("firecrest", self.remote) == USER
        self.identity = identity
        self._client = None
        self.secrets: list[str] = []

    def credentials(self) -> tuple[str, str]:
        client_id = env_secret(self.id_env, "FirecREST client id", self.remote)
        secret = env_secret(self.secret_env, "FirecREST client secret", self.remote)
        self.secrets = [client_id, secret]
        return client_id, secret

    @property
    def group_key(self) -> tuple:
        """Cases sharing this key share one status call per pass (R-BACK-4): on a per-user pool,
        one per user (each user's listing shows only their jobs)."""
        if self.per_user:
            return (self.api_url, self.system, "user", self.identity.key if self.identity else "")
        return (self.api_url, self.system, self.id_env, self.secret_env)

    @property
    def client(self):
        if self._client is None and self.per_user:
            self._client = self._user_client()
        if self._client is None:
            firecrest, Firecrest = _sdk()
            client_id, secret = self.credentials()
            digest = hashlib.sha256(f"{client_id}\0{secret}".encode()).hexdigest()
            key = (self.api_url, self.remote.get("token_uri"), digest)
            with _clients_lock:
                client = _clients.get(key)
                if client is None:
                    auth = firecrest.ClientCredentialsAuth(
                        client_id, secret, self.remote.get("token_uri"), min_token_validity=MIN_TOKEN_VALIDITY
                    )
                    auth.timeout = TIMEOUT
                    client = Firecrest(firecrest_url=self.api_url, authorization=auth)
                    client.timeout = TIMEOUT
                    client.num_retries_rate_limit = RATE_LIMIT_RETRIES
                    _clients[key] = client
            self._client = client
        return self._client

    def _user_client(self):
        """R-CRED-1: a per-user pool's calls carry the case owner's own token, never the service
        account's: without a user identity nothing is sent at all."""
        if self.identity is None or not self.identity.is_user:
            raise BackendError(
                "this pool runs jobs under each user's own credentials and no user credential was given: "
                "refusing to act under the service account (R-CRED-1)"
            )
        _firecrest, Firecrest = _sdk()
        key = (self.api_url, "user", self.identity.key)
        with _clients_lock:
            client = _clients.get(key)
            if client is None:
                client = Firecrest(firecrest_url=self.api_url, authorization=UserTokenAuth(self.identity))
                client.timeout = TIMEOUT
                client.num_retries_rate_limit = RATE_LIMIT_RETRIES
                _clients[key] = client
            # the latest identity object (same credential) answers the next token requests
            client._authorization.identity = self.identity
        return client

    def scrub_values(self) -> list[str]:
        """What no message may show: the service credential, or the user's current access token."""
        if self.per_user and self._client is not None:
            token = getattr(self._client._authorization, "last_token", "")
            return [token] if token else []
        return self.secrets

    def call(self, what: str, method: str, *args, **kwargs):
        """Call the SDK; every failure becomes a ProviderError whose message is safe to show.

        A 401 from the API (not from the token endpoint) is retried once with a fresh token: the
        real server refuses a token with less than 30 s left ("expires too soon"), a refusal
        that happens before anything is done, so the retry is safe even for a submission."""
        client = self.client
        for attempt in (1, 2):
            try:
                return getattr(client, method)(*args, **kwargs)
            except BackendError:
                raise
            except Exception as exc:
                error = provider_error(exc, f"FirecREST {what} failed", self.scrub_values(), service=not self.per_user)
                if error.status == 401 and not error.permanent and attempt == 1:
                    _forget_token(client)
                    for arg in args:  # an in-memory upload is sent again from its start
                        if hasattr(arg, "seek"):
                            arg.seek(0)
                    continue
                raise error from None
        raise AssertionError("unreachable")  # pragma: no cover

    @property
    def working_root(self) -> str:
        root = self.remote.get("working_root")
        if not root:
            raise BackendError("the pool has no remote.working_root: set the remote directory for case workspaces")
        return root.rstrip("/") or "/"

    def run_dir(self, case_id: str) -> str:
        return posixpath.join(self.working_root, case_id)


def provider_error(exc: Exception, prefix: str, secrets: list[str], *, service: bool = False) -> ProviderError:
    """The ProviderError for an SDK or transport exception: the facts as attributes, a message
    without request headers or credential values (R-BACK-1); under a service account, the
    provider's own words only in the log (``remote_common.provider_words``)."""
    import httpx
    import requests

    firecrest, _ = _sdk()
    status, facts = None, {}
    if isinstance(exc, firecrest.ClientsCredentialsException):
        status = exc.responses[-1].status_code if exc.responses else None
        detail = f"the token endpoint refused the client credentials (HTTP {status}): check them"
        facts["permanent"] = status is not None and 400 <= status < 500
        status = None  # the token endpoint's status is not the API's: never retried as a 401
    elif isinstance(exc, firecrest.FirecrestException):
        response = exc.responses[-1] if exc.responses else None
        if response is None:
            detail = type(exc).__name__
        else:
            status = response.status_code
            try:
                body = response.json()
                text = body.get("message") or body.get("description") or json.dumps(body)[:300]
            except ValueError:
                text = response.text[:300]
            detail = provider_words(scrub(f"HTTP {status}: {text}", secrets), service=service, status=status)
            facts["permanent"] = 400 <= status < 500 and status not in (401, 404, 408, 429)
    elif isinstance(exc, httpx.ConnectTimeout | requests.ConnectTimeout):
        detail = f"cannot connect within {TIMEOUT:g} s (timeout)"  # nothing was sent
    elif isinstance(exc, httpx.TimeoutException | requests.Timeout):
        detail = f"no answer within {TIMEOUT:g} s (timeout)"
        facts["timeout"] = True
    elif isinstance(exc, httpx.ConnectError | requests.ConnectionError):
        detail = f"cannot connect ({type(exc).__name__})"  # refused before anything was sent
    elif isinstance(exc, httpx.TransportError):
        # RemoteProtocolError/ReadError/WriteError: the connection was lost with the request
        # (partly) sent; the server may have carried it out.
        detail = f"the connection was lost before the answer ({type(exc).__name__})"
        facts["dropped"] = True
    elif isinstance(exc, firecrest.NotImplementedOnAPIversion):
        detail = f"not supported by this FirecREST version: {exc}"
        facts["permanent"] = True
    else:
        detail = f"{type(exc).__name__}: {exc}"
    return ProviderError(scrub(f"{prefix}: {detail}", secrets), status, **facts)


def describe(exc: Exception) -> tuple[int | None, str]:
    """(HTTP status, message) for an SDK or transport exception, without request headers."""
    error = provider_error(exc, "FirecREST", [])
    return error.status, str(error).removeprefix("FirecREST: ")


def _forget_token(client) -> None:
    """Make pyfirecrest ask the token endpoint again at the next call."""
    auth = getattr(client, "_authorization", None)
    if isinstance(auth, UserTokenAuth):
        auth.forget()
    elif auth is not None and hasattr(auth, "_token_expiration_ts"):
        auth._access_token = None
        auth._token_expiration_ts = None


class FirecrestBackend(ExecutionBackend):
    name = "firecrest"
    kinds = ("firecrest",)

    # -- submission --------------------------------------------------------------------------
    def _session(self, spec: SubmitSpec) -> Session:
        system = spec.environment.get("RSC_FIRECREST_SYSTEM_NAME")  # class override, else pool
        return Session(spec.pool_remote, system, spec.identity)

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
            error = provider_error(
                exc, "FirecREST job lookup failed", session.scrub_values(), service=not session.per_user
            )
            if error.status == 404:
                return None
            if error.status == 401 and not error.permanent:  # "expires too soon": once more, fresh
                _forget_token(session.client)
                jobs = session.call("job lookup", "job_info", session.system, name=case_id)
            else:
                raise error from None
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
            wall_seconds=sbatch.wall_seconds(spec),
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
            if not exc.maybe_done:
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
            session = Session(job.pool_remote, identity=job.identity)
            _job_id, system = split_remote_id(job.remote_id, session.system)
            session.system = system
            groups.setdefault(session.group_key, (session, []))[1].append(job)
        out: dict[str, BackendState | Exception] = {}
        for session, group in groups.values():
            out.update(self._poll_group(session, group))
        return out

    def _poll_group(self, session: Session, group: list[JobRef], *, output: bool = True):
        try:
            listing = session.call("job listing", "job_info", session.system)  # the one status call
        except BackendError as exc:
            return {job.remote_id: exc for job in group}
        out: dict[str, BackendState | Exception] = {}
        for job in group:
            try:
                entry = _entry_for(listing, job, session.system)
                if entry is None:
                    entry = self._lookup_one(session, job)
                if entry is ALLOCATION:
                    # Only the allocation record is visible: nothing new, not a failed poll. The
                    # core never moves a running case back to pending, so no state regresses.
                    out[job.remote_id] = BackendState(status=BackendStatus.PENDING)
                else:
                    out[job.remote_id] = self._state(session, job, entry, output=output)
            except Exception as exc:  # one bad job must not fail the others' polls
                out[job.remote_id] = exc
        return out

    def _lookup_one(self, session: Session, job: JobRef):
        job_id, _system = split_remote_id(job.remote_id, session.system)
        try:
            entries = session.call(f"lookup of job {job_id}", "job_info", session.system, job_id)
        except ProviderError as exc:
            if exc.status == 404:
                # Right after submit FirecREST may not know the job yet: a failed poll (R-CASE-3).
                raise BackendError(f"FirecREST does not know job {job_id} (yet)") from None
            raise
        entry = _entry_for(entries, job, session.system)
        if entry is None:
            # A job that has just finished can be missing for ~3 s (slurmctld has let it go and
            # accounting has not caught up): a failed poll, never a state (R-CASE-3).
            raise BackendError(f"FirecREST does not list job {job_id} for case {job.case_id} (yet)")
        return entry

    def _state(self, session: Session, job: JobRef, entry: dict, *, output: bool = True) -> BackendState:
        status_info = entry.get("status") or {}
        raw = status_info.get("state")
        exit_code = status_info.get("exitCode")
        status = map_state(raw, exit_code)
        elapsed = (entry.get("time") or {}).get("elapsed")
        if isinstance(elapsed, str):
            elapsed = parse_elapsed(elapsed)
        stdout = stderr = ""
        if status != BackendStatus.PENDING and output:
            rdir = session.run_dir(job.case_id)
            final = status in BackendStatus.TERMINAL
            try:
                stdout = self._delta(session, posixpath.join(rdir, "stdout"), job.workspace / "stdout.log", final)
                stderr = self._delta(session, posixpath.join(rdir, "stderr"), job.workspace / "stderr.log", final)
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

    def _delta(self, session: Session, remote_path: str, local_log: Path, final: bool = False) -> str:
        """The remote file past the bytes the workspace log already has (R-CASE-5).

        The server runs ``tail --bytes=+N``: a 1-based start (``+1`` is the whole file) and
        ``bytes=0`` drops the option (the last 10 lines). So the 0-based offset ``k`` is asked
        as ``k + 1``. The content comes back as text: a multi-byte character cut at the end of
        the file (still being written) arrives as U+FFFD; it is left for the next poll, which
        starts at its first byte, except in the last poll of a finished job."""
        try:
            offset = local_log.stat().st_size
        except FileNotFoundError:
            offset = 0
        try:
            text = session.call(
                "output tail", "tail", session.system, remote_path, num_bytes=offset + 1, exclude_beginning=True
            )
        except ProviderError as exc:
            if exc.status == 404:
                return ""  # Slurm has not created the file yet
            raise
        if isinstance(text, dict):  # some API versions wrap the content
            text = text.get("content", "")
        text = str(text or "")[:MAX_DELTA_CHARS]
        if not final or len(text) == MAX_DELTA_CHARS:
            text = text.rstrip("\ufffd")
        return text

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
        session = Session(job.pool_remote, identity=job.identity)
        session.system = split_remote_id(job.remote_id, session.system)[1]
        work = posixpath.join(session.run_dir(job.case_id), "work")
        live = job.workspace / "live"
        seen = _load_state(job.workspace, "live.json")
        for rel, entry in self._walk(session, work, ("shared",)):
            if not glob_matches(rel, globs):
                continue
            size = _size(entry)
            stamp = [size, str(entry.get("lastModified") or "")]
            target = confined_target(live, rel)
            if target is None or size > LIVE_MAX_BYTES:
                continue
            source = posixpath.join(work, rel)
            known = seen.get(rel)
            if known and known[:2] == stamp and target.exists():
                # Sizes and one-second mtimes miss a same-size rewrite within a second: the
                # remote checksum decides (one call, no download when unchanged).
                answer = session.call(f"checksum of {rel}", "checksum", session.system, source)
                if isinstance(answer, dict) and answer.get("checksum") == (known[2:] or [None])[0]:
                    continue
            self._download(session, source, target)
            seen[rel] = [*stamp, files._hash(target)]
        _save_state(job.workspace, "live.json", seen)

    def fetch_final(self, job: JobRef) -> None:
        session = Session(job.pool_remote, identity=job.identity)
        session.system = split_remote_id(job.remote_id, session.system)[1]
        work = posixpath.join(session.run_dir(job.case_id), "work")
        manifest = _load_state(job.workspace, "manifest.json")
        results = job.workspace / "results"
        results.mkdir(parents=True, exist_ok=True)
        for rel, entry in self._walk(session, work, files.NOT_RESULTS):
            size = _size(entry)
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
        """Cancel straight away (one call). The real server answers a finished or unknown job
        with 500 and scancel's message ("Job/step already completing or complete", "Invalid job
        id specified"), older ones with 404: the job's state then decides whether it had already
        ended (R-CASE-6); its output is not read here, so the next poll still brings all of it."""
        session = Session(job.pool_remote, identity=job.identity)
        job_id, session.system = split_remote_id(job.remote_id, session.system)
        try:
            session.call(f"cancel of job {job_id}", "cancel_job", session.system, job_id)
            return
        except ProviderError as exc:
            if exc.status not in (404, 500):
                raise
            refused = exc
        state = self._poll_group(session, [job], output=False)[job.remote_id]
        if isinstance(state, BackendState) and state.status in BackendStatus.TERMINAL:
            raise AlreadyFinished(f"Slurm job {job_id} already ended")
        raise refused

    def purge(self, job: JobRef) -> None:
        """``<working_root>/<case id>`` goes (SPEC §8, ``manage.py cleanup``). Idempotent: when
        the removal is refused, a stat that answers 404 means it was already gone."""
        session = Session(job.pool_remote, identity=job.identity)
        session.system = split_remote_id(job.remote_id, session.system)[1]
        rdir = session.run_dir(job.case_id)
        try:
            session.call(f"removal of {rdir}", "rm", session.system, rdir)
        except ProviderError as exc:
            try:
                session.call(f"stat of {rdir}", "stat", session.system, rdir)
            except ProviderError as gone:
                if gone.status == 404:
                    return
            raise exc from None

    # -- launch form and doctor ----------------------------------------------------------------
    def launch_options(self, pool, identity=None) -> LaunchOptions:
        time_option = LaunchOption(
            "time", "Time limit", [Choice(value, label) for value, label in TIME_CHOICES], "01:00:00"
        )
        session = Session(pool.remote_config() if pool is not None else {}, identity=identity)
        configured = session.remote.get("partition")
        if session.per_user and identity is None:
            # No service account to ask with: until the user connects, the pool's own partition
            # (and a class's, pinned later) is what may be chosen.
            fallback = [Choice(configured, configured)] if configured else []
            return LaunchOptions(options=[LaunchOption("partition", "Partition", fallback, configured), time_option])
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
        return sbatch.pin_class_time(sbatch.pin_class_partition(answer, resource_class), resource_class)

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
        session = Session(pool.remote_config())
        if session.per_user:
            return checks + _doctor_per_user(session)
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
        # servicesHealth is a list (scheduler, ssh, filesystem…): any entry may be the sick one.
        health = system.get("servicesHealth")
        entries = [h for h in health if isinstance(h, dict)] if isinstance(health, list) else []
        sick = [h for h in entries if h.get("healthy") is False]
        if sick:
            detail = "; ".join(
                f"{h.get('serviceType') or 'service'}" + (f" ({h['message']})" if h.get("message") else "")
                for h in sick
            )
            message = scrub(f"system {session.system} reports unhealthy: {detail}", session.secrets)
        else:
            message = f"system {session.system} is up ({len(entries)} service(s) healthy)"
        checks.append(Check("system", not sick, message))
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


def _doctor_per_user(session: Session) -> list[Check]:
    """A per-user pool has no service account to ask FirecREST with: doctor checks what users need
    to connect (the sealing key, the authorization endpoint, the public client at the token
    endpoint); the system, partition and working_root are met by the first user's case."""
    from apps.backends import oauth, sealing

    checks = [
        Check(
            "credentials",
            sealing.available(),
            "per-user credentials: GRIDGATE_CREDENTIALS_KEY is set (value not shown)"
            if sealing.available()
            else "per-user credentials need GRIDGATE_CREDENTIALS_KEY (a Fernet key) on every web and worker host: "
            "users cannot connect without it",
        )
    ]
    endpoint = authorization_endpoint(session.remote)
    checks.append(
        Check("authorization", bool(endpoint), f"users connect at {endpoint}" if endpoint else "set authorization_uri")
    )
    ok, message = oauth.probe_client(session.remote)
    checks.append(Check("client", ok, message))
    # Disconnecting revokes the grant there (RFC 7009): a made-up token is answered 200.
    endpoint = revocation_endpoint(session.remote)
    try:
        oauth.revoke(session.remote, "gridgate-doctor-probe")
    except oauth.OAuthError as exc:
        advice = "check revocation_uri and the public client" if endpoint else "set revocation_uri"
        checks.append(Check("revocation", False, f"disconnecting cannot revoke users' grants: {exc}: {advice}"))
    else:
        checks.append(Check("revocation", True, f"disconnecting revokes users' grants at {endpoint}"))
    return checks


#: the allocation record FirecREST/sacct shows for a running job (name "allocation", PENDING)
ALLOCATION = object()


def _entry_for(entries, job: JobRef, system: str):
    """The record of ``job`` in a job listing, matched by id (names are not unique and the
    allocation record has none of ours): the entry, ``ALLOCATION`` when only the allocation
    record is there, or None."""
    job_id, _system = split_remote_id(job.remote_id, system)
    mine = [e for e in entries or [] if isinstance(e, dict) and str(e.get("jobId")) == job_id]
    for entry in mine:
        if entry.get("name") in (job.case_id, None):
            return entry
    if any(entry.get("name") == "allocation" for entry in mine):
        return ALLOCATION
    if mine:
        raise BackendError(f"FirecREST job {job_id} is not case {job.case_id}'s job (its name differs)")
    return None


def _size(entry: dict) -> int:
    """A listing's size: the real server sends a string ("12")."""
    try:
        return int(str(entry.get("size") or 0).strip())
    except ValueError:
        return 0


def _bytes_io(data: bytes):
    import io

    return io.BytesIO(data)


def _load_state(workspace: Path, name: str) -> dict:
    return load_state(workspace, STATE_DIR, name)


def _save_state(workspace: Path, name: str, data: dict) -> None:
    save_state(workspace, STATE_DIR, name, data)
