"""The ``pasqal_qpu`` driver: a Pasqal QPU through its on-premise QPU API (what Warden drives).

Facts (``shared/reference/PROVIDERS.md``, Warden's client and mock): base ``<url>/api/v1``,
every answer a JSend envelope ``{"code", "message", "data"}``; ``GET /system`` → the QPU's
Pulser device; ``GET /system/operational`` → ``UP``/``DOWN``; ``POST /jobs`` → a job
``{uid, status, result, ...}``; ``GET /jobs/{uid}``; ``PUT /jobs/{uid}/cancel``, whose 400 with a
code containing 3003 means "already finished". The QPU runs one job at a time (a new job drops
the running one), so a device of this driver has ``max_concurrent_jobs`` = 1.

Device ``config``: ``url`` (the QPU API's base, without ``/api/v1``); its authentication, either
OAuth2 client credentials as Warden's client does it (``token_url``, the centre's identity
provider's token endpoint, ``client_id_env`` and ``client_secret_env``, the names of the
environment variables holding them, optional ``scope``: a bearer token, fetched again when the
QPU API answers 401) or a static header (``auth_header``, e.g. ``Authorization``, and ``auth_env``,
the variable holding its value): secrets never go in the database; ``timeout`` (seconds per
request, default 10),
``retries`` (extra attempts on 5xx and connection errors, default 3), ``backoff`` (first pause
between attempts in seconds, doubled each time, default 1), ``request_deadline`` (seconds: how
long the QPU API may still carry out a request after it received it, its own server's deadline;
default the larger of 120 and ``timeout`` + all back-offs + 60, and always above ``timeout`` + all
back-offs).

Lost answers. ``POST /jobs`` is not idempotent and the API has no list endpoint, so the driver
writes its intent (a ``DriverRun`` keyed by Gridgate's stable run id, also sent as
``context.pasqman_job_id``) before sending, and commits it. If the answer is lost after the
request left (a dropped connection, a read timeout, a 5xx: the QPU may have created the job
before failing), or the worker died between the POST and recording its answer, the next attempt
does not resend: it walks the QPU's job uids forward from the highest uid this device recorded
(after checking that job is still there with its own tag: a QPU API restarted on an empty store
gives its uids again) and adopts the job whose ``pasqman_job_id`` is ours. "No uid past the last
one" proves the QPU never created the job only once the QPU API has finished with the lost
request: a slow QPU API creates it after the driver's timeout and back-off (seen 15 s and 25 s
after the POST), and a resend then ran the job twice. So until ``request_deadline`` after the POST
left, a lost answer keeps its job and device (``SubmissionPending``) and is looked for again; it
resends only when a walk begun after that deadline still finds neither the job nor a uid past
the last one. When it cannot tell (no uid recorded yet for this device, uids that started again,
a job without its context, a walk too long, a QPU API it could not ask until twice the deadline),
the job ends ``unknown`` for an operator rather than risk running it twice
(``UndecidedSubmission``).
"""

import json
import logging
import threading
import time
from datetime import datetime, timedelta
from urllib.parse import urlparse

import httpx
from django.utils import timezone

from apps.core import credentials
from apps.core.exceptions import Unavailable
from apps.resources.remote import ENV_NAME
from apps.scheduling.device_status import record_status
from apps.scheduling.drivers.base import (
    DeviceDriver,
    DriverState,
    PermanentDriverError,
    ProviderStatus,
    SubmissionPending,
    TransientDriverError,
    UndecidedSubmission,
)
from apps.scheduling.drivers.sequences import provider_device, specs_problem, validate_sequence
from apps.scheduling.models import DriverRun

log = logging.getLogger(__name__)

KNOWN = {
    "url",
    "auth_header",
    "auth_env",
    "token_url",
    "client_id_env",
    "client_secret_env",
    "scope",
    "timeout",
    "retries",
    "backoff",
    "request_deadline",
}
TOKEN_LEEWAY = 30  # seconds before a token's expiry it is fetched again (half its life when shorter)
HEADER_NAME = ENV_NAME  # letters, digits, underscores; dashes allowed below
CANNOT_CANCEL = "3003"  # the QPU's code for "this job can no longer be cancelled"
UID_WALK = 50  # how far past the last known uid a lost submission is looked for
RECHECK = timedelta(seconds=5)  # how often a lost submission is looked for before its deadline
now = timezone.now  # the driver's clock (a test moves it)


def backoff_total(config: dict) -> float:
    """Every pause a call may take between its attempts (``backoff`` doubled ``retries`` times)."""
    return float(config.get("backoff", 1)) * (2 ** int(config.get("retries", 3)) - 1)


def request_deadline(config: dict) -> float:
    """Seconds after a POST left within which the QPU API may still create its job."""
    floor = float(config.get("timeout", 10)) + backoff_total(config)
    return float(config.get("request_deadline") or max(120.0, floor + 60))


STATES = {"PENDING": "running", "RUNNING": "running", "DONE": "completed", "ERROR": "failed", "CANCELED": "cancelled"}


class QpuError(Exception):
    """A QPU API call that failed after its retries. ``sent``: the request may have reached the
    QPU (its answer was lost); ``status``/``body``: the QPU's own error answer, when it gave one."""

    def __init__(self, message: str, *, status: int | None = None, body: dict | None = None, sent: bool = False):
        super().__init__(message)
        self.status = status
        self.body = body or {}
        self.sent = sent

    @property
    def transient(self) -> bool:
        return self.status is None or self.status >= 500 or self.status == 429

    @property
    def answered(self) -> bool:
        """The QPU API itself answered (its envelope, with its ``code``), so it is done with the
        request, whatever it did; a proxy's error page or a lost answer says nothing of that."""
        return self.status is not None and "code" in self.body


class BearerTokens:
    """OAuth2 client-credentials tokens for the QPU API, from the centre's identity provider
    (Keycloak at the sites Warden serves), as Warden's QPU client gets them: fetched once per
    (token URL, client id) and process, reused until shortly before they expire, fetched again at
    once when the QPU API answers 401. The secret is read from its variable at each fetch and
    never kept beside the token."""

    def __init__(self):
        self._lock = threading.Lock()
        self._tokens: dict[tuple[str, str], tuple[str, float]] = {}

    def get(self, config: dict, timeout: float, *, fresh: bool = False) -> str:
        try:
            pool = credentials.pool_of(config)
            client_id = credentials.read(config.get("client_id_env"), "QPU API client id", pool=pool)
            secret = credentials.read(config.get("client_secret_env"), "QPU API client secret", pool=pool)
        except credentials.CredentialError as exc:  # names the variable, never a value
            raise QpuError(str(exc)) from None
        key = (config["token_url"], client_id)
        with self._lock:
            cached = self._tokens.get(key)
            if cached and not fresh and cached[1] > time.monotonic():
                return cached[0]
        form = {"grant_type": "client_credentials", "client_id": client_id, "client_secret": secret}
        if config.get("scope"):
            form["scope"] = config["scope"]
        try:
            response = httpx.post(config["token_url"], data=form, timeout=timeout)
        except httpx.TransportError as exc:
            raise QpuError(f"cannot reach the identity provider for a QPU API token: {type(exc).__name__}") from None
        body = _json(response)
        if response.status_code >= 400 or not isinstance(body.get("access_token"), str):
            reason = str(body.get("error") or response.status_code)[:100]
            status = response.status_code if response.status_code >= 400 else 502
            raise QpuError(f"the identity provider refused a QPU API token: {reason}", status=status)
        life = float(body.get("expires_in") or 60)
        if life <= 2 * TOKEN_LEEWAY:
            log.warning("QPU API tokens live %s s only: each is kept for half of that", life)
        keep = life - TOKEN_LEEWAY if life > 2 * TOKEN_LEEWAY else life / 2
        with self._lock:
            self._tokens[key] = (body["access_token"], time.monotonic() + keep)
        return body["access_token"]


TOKENS = BearerTokens()


class QpuClient:
    """Small synchronous client of the QPU API: timeouts on every call, retries with back-off
    on 5xx and connection errors (``POST`` only while the request surely did not leave); a static
    header (``auth_header``/``auth_env``) or OAuth2 client-credentials bearer tokens
    (``token_url``, ``client_id_env``, ``client_secret_env``), a 401 answered once with a fresh
    token."""

    def __init__(self, config: dict):
        self.config = config
        self.base = config["url"].rstrip("/") + "/api/v1"
        self.timeout = float(config.get("timeout", 10))
        self.retries = int(config.get("retries", 3))
        self.backoff = float(config.get("backoff", 1))
        self.headers = {}
        if config.get("auth_header"):
            try:
                self.headers[config["auth_header"]] = credentials.read(
                    config.get("auth_env"), "QPU API credential", pool=credentials.pool_of(config)
                )
            except credentials.CredentialError as exc:  # names the variable, never a value
                raise QpuError(str(exc)) from None

    def _headers(self, fresh: bool) -> dict:
        if not self.config.get("token_url"):
            return self.headers
        return {"Authorization": f"Bearer {TOKENS.get(self.config, self.timeout, fresh=fresh)}"}

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        """The ``data`` of the envelope; raises QpuError."""
        resend = method != "POST"
        attempt = 0
        fresh = False
        while True:
            try:
                with httpx.Client(timeout=self.timeout, headers=self._headers(fresh)) as client:
                    response = client.request(method, self.base + path, json=body)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # nothing reached the QPU
                error = QpuError(f"cannot reach the QPU API: {type(exc).__name__}")
            except httpx.TransportError as exc:  # the request left; its answer did not come back
                error = QpuError(f"the QPU API's answer was lost: {type(exc).__name__}", sent=True)
                if not resend:
                    raise error from None
            else:
                if response.status_code == 401 and self.config.get("token_url") and not fresh:
                    fresh = True  # refused before it did anything: once more with a new token
                    continue
                envelope = _json(response)
                if response.status_code < 400 and _code(envelope) < 400:
                    data = envelope.get("data")
                    return data if isinstance(data, dict) else {}
                status = response.status_code if response.status_code >= 400 else _code(envelope)
                error = QpuError(
                    f"QPU API {method} {path}: {status} {str(envelope.get('message', ''))[:200]}".strip(),
                    status=status,
                    body=envelope,
                    # A 5xx to a POST may come after the QPU created the job: never sent again.
                    sent=not resend and status >= 500,
                )
                if not error.transient or error.sent:
                    raise error
            if attempt >= self.retries:
                raise error
            time.sleep(self.backoff * 2**attempt)
            attempt += 1


def _json(response) -> dict:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _code(envelope: dict) -> int:
    try:
        return int(envelope.get("code", 200))
    except (TypeError, ValueError):
        return 200


def cannot_cancel(error: QpuError) -> bool:
    """The QPU's "already finished" answer to a cancel: 400 whose code (top level, or inside
    ``data`` as Warden's mock puts it) contains 3003."""
    if error.status != 400:
        return False
    data = error.body.get("data")
    codes = [error.body.get("code"), data.get("code") if isinstance(data, dict) else None]
    return any(CANNOT_CANCEL in str(code) for code in codes if code is not None)


def counts_from(result) -> dict[str, int]:
    """Bitstring counts from a DONE job's ``result``: a JSON string ``{"counter": {...}}`` (or
    the counts themselves)."""
    data = json.loads(result) if isinstance(result, str) else result
    if isinstance(data, dict) and isinstance(data.get("counter"), dict):
        data = data["counter"]
    if not isinstance(data, dict) or not all(isinstance(v, int) and not isinstance(v, bool) for v in data.values()):
        raise ValueError("the QPU's result holds no bitstring counter")
    return {str(k): int(v) for k, v in sorted(data.items())}


def runtime(job: dict) -> float | None:
    try:
        started = datetime.fromisoformat(str(job["start_datetime"]))
        ended = datetime.fromisoformat(str(job["end_datetime"]))
    except (KeyError, TypeError, ValueError):
        return None
    return max((ended - started).total_seconds(), 0.0)


def run_id(job) -> str:
    """Gridgate's stable id of a job's run, sent as ``context.pasqman_job_id``."""
    return f"gridgate-job-{job.pk}"


def _parsed_url(value):
    """``value`` split into a URL's parts, or None: not a string, or one ``urlparse`` refuses
    (``https://[host/x``, an unclosed bracket), which is the staff's input error, not a 500."""
    if not isinstance(value, str):
        return None
    try:
        return urlparse(value)
    except ValueError:
        return None


class PasqalQpuDriver(DeviceDriver):
    name = "pasqal_qpu"
    has_provider = True
    max_concurrency = 1

    def validate_config(self, config):
        problems = [f"unknown key '{k}' for the pasqal_qpu driver" for k in config if k not in KNOWN]
        parsed = _parsed_url(config.get("url"))
        if parsed is None or parsed.scheme not in ("http", "https") or not parsed.netloc:
            problems.append("'url' must be the QPU API's http(s) URL, e.g. http://qpu.example.org:8000")
        header, env = config.get("auth_header"), config.get("auth_env")
        token_url = config.get("token_url")
        if token_url is not None:
            parsed_token = _parsed_url(token_url)
            if parsed_token is None or parsed_token.scheme not in ("http", "https") or not parsed_token.netloc:
                problems.append("'token_url' must be the identity provider's http(s) token endpoint")
            if header is not None:
                problems.append(
                    "'token_url' (OAuth2 bearer tokens) and 'auth_header' (a static header) exclude each other"
                )
            for key in ("client_id_env", "client_secret_env"):
                if credentials.name_problem(config.get(key)):
                    problems.append(f"'{key}' {credentials.name_problem(config.get(key))}")
        elif "client_id_env" in config or "client_secret_env" in config or "scope" in config:
            problems.append("'client_id_env', 'client_secret_env' and 'scope' go with 'token_url'")
        if (header is None) != (env is None):
            problems.append("'auth_header' and 'auth_env' go together (the header and the variable holding its value)")
        if header is not None and (not isinstance(header, str) or not HEADER_NAME.match(header.replace("-", "_"))):
            problems.append("'auth_header' must be an HTTP header name")
        if env is not None and credentials.name_problem(env):
            problems.append(f"'auth_env' {credentials.name_problem(env)}")
        numbers_ok = True
        for key, low, high in (
            ("timeout", 0.1, 300),
            ("retries", 0, 10),
            ("backoff", 0, 60),
            ("request_deadline", 1, 86_400),
        ):
            value = config.get(key)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high
            ):
                problems.append(f"'{key}' must be a number from {low} to {high}")
                numbers_ok = False
        if numbers_ok and config.get("request_deadline") is not None:
            floor = float(config.get("timeout", 10)) + backoff_total(config)
            if config["request_deadline"] <= floor:
                problems.append(
                    f"'request_deadline' must be above 'timeout' plus every back-off ({floor:g} s): before it, a QPU "
                    "API may still create a job whose answer was lost"
                )
        return problems

    # -- specs and status (the worker's status pass) ---------------------------------------
    def pulser_device(self, device):
        if not device.provider_specs:
            raise Unavailable(
                f"The specs of QPU device '{device.name}' are not known yet: the worker reads them from the QPU "
                "(GET /system) on its status pass. Try again shortly."
            )
        return provider_device(device.provider_specs, where=f"QPU device '{device.name}'")

    def specs(self, device):
        self.pulser_device(device)  # 503 until the worker has read them
        return device.provider_specs

    def specs_text(self, device):
        self.pulser_device(device)
        return device.provider_specs_text or json.dumps(device.provider_specs)

    def validate_payload(self, device, payload, shots):
        """R-DEV-1 against the QPU's own Pulser device (``GET /system``, as last read)."""
        validate_sequence(payload, shots, self.pulser_device(device), where=f"QPU device '{device.name}'")

    def check_status(self, device):
        try:
            client = QpuClient(device.credential_config())
            operational = str(client.call("GET", "/system/operational").get("operational_status", "")).upper()
            specs = client.call("GET", "/system").get("specs")
        except QpuError as exc:
            return ProviderStatus("unreachable", message=str(exc))
        # The QPU's own text is kept as sent (QRMI's qpu/specs passes it through, as Warden does):
        # the parsed copy is stored as jsonb, which keeps neither key order nor spacing.
        text = specs if isinstance(specs, str) else json.dumps(specs) if isinstance(specs, dict) else ""
        if isinstance(specs, str):
            try:
                specs = json.loads(specs)
            except ValueError:
                specs = None
        if not isinstance(specs, dict):
            specs, text = None, ""
        problem = specs_problem(specs) if specs is not None else ""
        if problem:
            return ProviderStatus("down", message=problem)
        status = "up" if operational == "UP" else "down"
        return ProviderStatus(
            status, message=f"QPU operational status: {operational or 'missing'}", specs=specs, specs_text=text
        )

    # -- jobs ------------------------------------------------------------------------------
    def submit(self, device, job):
        stable = run_id(job)
        # The intent, committed before anything is sent: "prepared" until the POST leaves,
        # "submitting" while its answer is awaited, "unsent" when it surely never left.
        run, created = DriverRun.objects.get_or_create(
            remote_id=stable,
            defaults={"device": device, "payload": job.payload, "shots": job.shots, "status": "prepared"},
        )
        if run.external_id:  # answered before; the worker died before the job recorded it
            return run.external_id
        try:
            client = QpuClient(device.credential_config())
            if run.status == "submitting":  # an earlier POST left and its answer never came back
                adopted = self._find_lost(client, device, run)
                if adopted:
                    return self._record(run, adopted)
            self._require_up(client, device)
        except QpuError as exc:
            if run.status == "submitting":  # the QPU cannot be asked now; the job may be there
                raise self._still_lost(run, device, f"the QPU API could not be asked about it: {exc}") from None
            raise TransientDriverError(str(exc)) from None
        sequence = job.payload["sequence"]
        body = {
            "nb_run": job.shots,
            "pulser_sequence": sequence if isinstance(sequence, str) else json.dumps(sequence),
            "context": {"batch_id": f"gridgate-session-{job.session_id}", "pasqman_job_id": stable},
        }
        run.sent_at = now()
        DriverRun.objects.filter(pk=stable).update(status="submitting", sent_at=run.sent_at)
        try:
            answer = client.call("POST", "/jobs", body)
        except QpuError as exc:
            run.status = "submitting"
            if exc.sent and exc.answered:
                # A 5xx from the QPU API itself: it is done with the request, so a walk now says
                # whether it created the job before failing.
                try:
                    adopted = self._find_lost(client, device, run, settled=True)
                except QpuError as walk_error:
                    raise self._still_lost(run, device, f"{exc}; then {walk_error}") from None
                if adopted:
                    return self._record(run, adopted)
            elif exc.sent:  # the answer was lost: the QPU may create the job until its own deadline
                raise self._still_lost(run, device, str(exc)) from None
            # The QPU answered with an error (and created nothing), or was never reached.
            DriverRun.objects.filter(pk=stable, external_id="").update(status="unsent")
            if exc.transient:
                raise TransientDriverError(str(exc)) from None
            raise PermanentDriverError(f"The QPU refused the job: {exc}") from None
        if "uid" not in answer:
            raise PermanentDriverError("The QPU accepted the job but its answer carries no uid.")
        return self._record(run, answer)

    def _record(self, run, answer: dict) -> str:
        uid = str(answer["uid"])
        DriverRun.objects.filter(pk=run.pk).update(external_id=uid, status="submitted")
        return uid

    def _require_up(self, client, device):
        operational = str(client.call("GET", "/system/operational").get("operational_status", "")).upper()
        if operational != "UP":
            record_status(device, ProviderStatus("down", message=f"QPU operational status: {operational or 'missing'}"))
            raise TransientDriverError("The QPU is down; the job waits until it is up again.")

    def _still_lost(self, run, device, why: str) -> SubmissionPending | UndecidedSubmission:
        """What to raise while a lost submission is not settled: keep the job and its device and
        look again every RECHECK (and at the deadline itself, whose walk settles it), or, once
        twice the QPU API's deadline has passed without a walk that could settle it (the QPU API
        not answering), leave it to an operator."""
        deadline = timedelta(seconds=request_deadline(device.config or {}))
        current = now()
        if run.sent_at is None or current >= run.sent_at + 2 * deadline:
            return self._undecided(run.remote_id)
        deadline_at = run.sent_at + deadline
        retry_at = min(deadline_at, current + RECHECK) if current < deadline_at else current + RECHECK
        return SubmissionPending(
            f"The QPU's answer to submission {run.remote_id} was lost ({why}); the QPU API may create the job until "
            f"{deadline_at:%H:%M:%S} UTC: the job keeps its device and is looked for again.",
            retry_at=retry_at,
        )

    @staticmethod
    def _undecided(stable: str) -> UndecidedSubmission:
        return UndecidedSubmission(
            "The QPU's answer to this job's submission was lost and the QPU cannot tell whether it created the job: "
            f"it was not submitted again, so that it never runs twice. An operator looks for the tag {stable} "
            "in the QPU's jobs (context.pasqman_job_id) and submits it again if the QPU never ran it."
        )

    def _find_lost(self, client, device, run, *, settled: bool = False) -> dict | None:
        """The job a lost submission created, if the QPU has it; None when the QPU shows it never
        created it; SubmissionPending while it may still; UndecidedSubmission when it cannot tell
        (see the module docstring).

        The walk from the last uid this device recorded is only evidence while the QPU's uids
        are the ones Gridgate knew: that last job must still be there, with its own tag. A QPU
        API that lost its jobs (restarted on an empty store) gives uids again from its start, so
        a missing uid past the last one would prove nothing: the job is left undecided. And a
        missing uid proves only that the job does not exist *yet*: the QPU API may still be
        working on the lost request until its own deadline, so only a walk begun after that
        deadline (``request_deadline`` after the POST left) settles it, or one made after the QPU
        API itself answered the POST (``settled``).
        """
        stable = run.remote_id
        walk_started = now()
        known = sorted(
            (int(uid), tag)
            for uid, tag in DriverRun.objects.filter(device=device).values_list("external_id", "remote_id")
            if uid.isdigit()
        )
        undecided = self._undecided(stable)
        if not known:
            raise undecided
        last_uid, last_tag = known[-1]
        try:
            last = client.call("GET", f"/jobs/{last_uid}")
        except QpuError as exc:
            if exc.status in (400, 404):
                log.warning(
                    "lost submission %s: the QPU no longer has job %s (its ids started again?)", stable, last_uid
                )
                raise undecided from None
            raise
        if not isinstance(last.get("context"), dict) or last["context"].get("pasqman_job_id") != last_tag:
            log.warning(
                "lost submission %s: the QPU's job %s is not the one recorded (its ids started again?)",
                stable,
                last_uid,
            )
            raise undecided
        for uid in range(last_uid + 1, last_uid + 1 + UID_WALK):
            try:
                job = client.call("GET", f"/jobs/{uid}")
            except QpuError as exc:
                if exc.status not in (400, 404):
                    raise
                deadline = timedelta(seconds=request_deadline(device.config or {}))
                if settled or (run.sent_at is not None and walk_started >= run.sent_at + deadline):
                    log.info(
                        "lost submission %s: the QPU has no job %s after its deadline, so it never created it",
                        stable,
                        uid,
                    )
                    return None
                raise self._still_lost(run, device, f"the QPU has no job {uid} yet") from None
            context = job.get("context")
            if not isinstance(context, dict):
                raise undecided
            if context.get("pasqman_job_id") == stable:
                log.warning("lost submission %s found on the QPU as job %s: adopted", stable, uid)
                return job
        raise undecided

    def poll(self, device, remote_id):
        try:
            job = QpuClient(device.credential_config()).call("GET", f"/jobs/{remote_id}")
        except QpuError as exc:
            if exc.transient:
                raise TransientDriverError(str(exc)) from None
            raise PermanentDriverError(f"The QPU has no job {remote_id}: {exc}") from None
        status = str(job.get("status", "")).upper()
        state = STATES.get(status)
        if state is None:
            raise TransientDriverError(f"The QPU reported an unknown status '{status[:40]}' for job {remote_id}.")
        if state == "running":
            return DriverState("running", started=status == "RUNNING")
        logs = f"QPU job {remote_id}: {status}\n"
        if state == "completed":
            try:
                counts = counts_from(job.get("result"))
            except (ValueError, TypeError) as exc:
                return DriverState(
                    "failed", error=f"The QPU's result could not be read: {exc}", logs=logs, started=True
                )
            return DriverState(
                "completed", result={"counts": counts}, runtime_seconds=runtime(job), logs=logs, started=True
            )
        if state == "failed":
            message = job.get("error") or job.get("message") or "the QPU reported an error"
            return DriverState(
                "failed", error=f"QPU job {remote_id} failed: {str(message)[:1000]}", logs=logs, started=True
            )
        return DriverState(
            "cancelled", error="Cancelled on the QPU.", logs=logs, runtime_seconds=runtime(job), started=True
        )

    def cancel(self, device, remote_id):
        """``PUT /jobs/{uid}/cancel``; "already finished" (3003) is not an error: the poll that
        follows reads the job's real final state (R-JOB-2)."""
        try:
            QpuClient(device.credential_config()).call("PUT", f"/jobs/{remote_id}/cancel")
        except QpuError as exc:
            if cannot_cancel(exc):
                log.info("QPU job %s had already finished when cancelled", remote_id)
                return
            if exc.transient:
                raise TransientDriverError(str(exc)) from None
            raise PermanentDriverError(f"The QPU refused to cancel job {remote_id}: {exc}") from None
