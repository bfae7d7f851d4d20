"""The execution-backend contract (SPEC §6).

The core (``apps.cases``) programs against these types only. A backend translates its provider's
state names and option keys into them, so nothing outside ``apps/backends/<name>.py`` ever reads
a provider's vocabulary: the core passes ``launch_options`` through unread and understands only
``BackendStatus``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from apps.core.exceptions import Invalid
from apps.core.text import has_control_characters


class BackendStatus:
    """What every provider state is mapped to. An unknown provider state maps to PENDING."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    ALL = (PENDING, RUNNING, SUCCEEDED, FAILED, CANCELLED)
    TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})


@dataclass
class BackendState:
    """One observation of a remote job. Deltas are the output produced since the last poll."""

    status: str
    progress: float | None = None
    stdout_delta: str = ""
    stderr_delta: str = ""
    execution_time: float | None = None
    cores: int | None = None
    message: str = ""

    def __post_init__(self):
        if self.status not in BackendStatus.ALL:
            raise ValueError(f"unknown backend status {self.status!r}")
        if self.progress is not None:
            self.progress = min(1.0, max(0.0, float(self.progress)))


@dataclass
class Choice:
    value: str
    label: str


@dataclass
class LaunchOption:
    """One declared option (R-BACK-6): either a list of ``choices`` or, when ``minimum`` and
    ``maximum`` are set, a whole number in that range. Nothing undeclared is ever accepted."""

    key: str
    label: str
    choices: list[Choice]
    default: str | None = None
    minimum: int | None = None
    maximum: int | None = None

    @property
    def is_range(self) -> bool:
        return self.minimum is not None and self.maximum is not None

    def allowed(self) -> str:
        """The allowed values in words, for the 400 that refuses another one."""
        if self.is_range:
            return f"a whole number from {self.minimum} to {self.maximum}"
        if not self.choices:
            return "no value (none can be offered right now)"
        return "one of " + ", ".join(choice.value for choice in self.choices)


@dataclass
class LaunchOptions:
    """What a user may choose at launch. ``degraded``: the provider could not be asked; the
    defaults still launch (R-BACK-2)."""

    options: list[LaunchOption] = field(default_factory=list)
    degraded: bool = False
    message: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LaunchOptions:
        options = [
            LaunchOption(**{**option, "choices": [Choice(**choice) for choice in option["choices"]]})
            for option in data.get("options", [])
        ]
        return cls(options=options, degraded=data.get("degraded", False), message=data.get("message", ""))

    def pin(self, key: str, value: str) -> None:
        """Fix option ``key`` to ``value`` (a class override wins over any backend default or
        choice, R-BACK-6): the form shows it, and any other value is refused."""
        for option in self.options:
            if option.key == key:
                option.choices, option.default = [Choice(value, value)], value
                return
        self.options.append(LaunchOption(key, key.capitalize(), [Choice(value, value)], value))


def validate_launch_options(declared: LaunchOptions, chosen) -> dict[str, Any]:
    """R-BACK-6: the user's launch options, checked against what the backend declared; the one
    place this rule lives (case creation and launch call it through ``apps.cases.services``).
    What it refuses, with :class:`~apps.core.exceptions.Invalid` (400) naming the allowed values,
    and what it drops: docs/backends.md, "Launch options are an allow-list". Range values may come
    as digit strings (HTML forms post text) and are returned as ints.
    """
    if not isinstance(chosen, dict):
        raise Invalid("Launch options must be a JSON object.", launch_options=["Must be a JSON object."])
    options = {option.key: option for option in declared.options}
    clean: dict[str, Any] = {}
    problems: dict[str, list[str]] = {}
    for key, value in chosen.items():
        option = options.get(key)
        if option is None:
            allowed = ", ".join(options) or "none"
            problems[str(key)[:64]] = [
                f"{_shown(key)} is not a launch option of this backend; declared options: {allowed}."
            ]
            continue
        if value is None or value == "":
            continue
        if isinstance(value, str) and has_control_characters(value):
            problems[key] = [f"'{key}' contains control characters (newlines included); allowed: {option.allowed()}."]
            continue
        if option.is_range:
            number = _whole_number(value)
            if number is not None and option.minimum <= number <= option.maximum:
                clean[key] = number
                continue
        elif isinstance(value, str) and value in {choice.value for choice in option.choices}:
            clean[key] = value
            continue
        problems[key] = [f"{_shown(value)} is not allowed for '{key}'; allowed: {option.allowed()}."]
    if problems:
        detail = " ".join(message for messages in problems.values() for message in messages)
        if declared.degraded:
            detail += " (The provider could not be asked just now: only the defaults and fixed choices are offered.)"
        raise Invalid(detail, launch_options=problems)
    return clean


def _shown(value) -> str:
    """A refused value as the error shows it: quoted, escaped, never long."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _whole_number(value) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 9:
        return int(value)
    return None


@dataclass
class Check:
    """One line of ``manage.py doctor``: never carries a credential's value (R-BACK-1)."""

    name: str
    ok: bool
    message: str


class Doctor(list):
    """The lines of one ``doctor`` run."""

    def check(self, name: str, fn, *, fix: str = "") -> bool:
        """One line: ``fn()`` answers ``(ok, message)`` (or just the message when it passed); a
        :class:`BackendError` it raises is a failed line with its (already safe) message and the
        ``fix``. Returns whether the line passed, so a doctor stops where later checks are moot."""
        try:
            answer = fn()
        except BackendError as exc:
            answer = (False, f"{exc}: {fix}" if fix else str(exc))
        ok, message = (True, answer) if isinstance(answer, str) else answer
        self.append(Check(name, bool(ok), message))
        return bool(ok)


@dataclass(frozen=True)
class RunAs:
    """The Unix account a case's command runs as (R-CASE-8), resolved by the core at launch.

    ``owner``: the case owner's linked account; ``sandbox``: the pool's unprivileged sandbox
    account (unlinked users, where the pool allows it); ``trusted``: the service's own account,
    no switch (a non-public demo pool only). ``uid``/``gid`` are None only for ``trusted``.
    """

    OWNER = "owner"
    SANDBOX = "sandbox"
    TRUSTED = "trusted"

    mode: str
    uid: int | None = None
    gid: int | None = None
    name: str = ""
    network: bool = True
    #: networks the egress filter lets through although it drops them otherwise (the pool's
    #: ``allowed_networks``, as CIDR texts)
    allowed_networks: tuple[str, ...] = ()

    @property
    def switches(self) -> bool:
        return self.mode != self.TRUSTED


@dataclass(frozen=True)
class CaseBounds:
    """What one case may use, from its class. The local backend enforces all of it (cgroup,
    rlimits, wall time, disk watch: ``apps.backends.privileged``); every backend that copies
    results back stops at ``disk_bytes``. ``wall_seconds`` is the class's default, which a launch
    option may raise up to ``max_wall_seconds``."""

    memory_bytes: int
    cpu: float
    tasks: int
    wall_seconds: int
    max_wall_seconds: int
    disk_bytes: int


@dataclass(frozen=True)
class RemoteIdentity:
    """Whose provider credential a remote call uses (FirecREST, Qarnot; docs/backends.md,
    "Per-user credentials"). Resolved by the core from the case owner and the pool; the backend
    only calls :attr:`token`, so it never touches the database or a stored secret.

    - ``mode``: ``user`` (the case owner's own credential) or ``service`` (the pool's service
      account, from the environment variables its ``remote`` names);
    - ``label``: what the case records and shows, e.g. "user ada (subject 5f0c…)" or
      "service account (GRIDGATE_CRED_FIRECREST_CLIENT_ID)";
    - ``key``: one per credential: cases sharing it share one status call per pass and one SDK
      client;
    - ``token(fresh=False)``: user mode only: a bearer access token (FirecREST) or the API token
      (Qarnot); ``fresh=True`` refuses a cached one. Raises :class:`CredentialsRequired` when the
      user must (re)connect first;
    - ``refused()``: user mode only: the provider refused the credential itself (Qarnot's 401):
      the connection is marked failed so the user is asked to reconnect; returns the message
      (naming the page to reconnect at) for the :class:`CredentialsRequired` the backend raises.
    """

    USER = "user"
    SERVICE = "service"

    mode: str
    label: str
    key: str
    token: Callable[..., str] | None = field(default=None, repr=False, compare=False)
    refused: Callable[[], str] | None = field(default=None, repr=False, compare=False)


@dataclass
class SubmitSpec:
    """Everything a backend needs to start a case. Built by the core from the case and its class.

    ``workspace`` is the case's local workspace (``inputs/`` is read from it); ``shared_dir`` is
    the campaign's shared inputs (seen as ``shared/`` in the working directory, never brought back
    with results). ``launch_options`` are the user's choices, read only by the backend.
    """

    case_id: str
    command: str
    workspace: Path
    pool_remote: dict[str, Any]
    resources: dict[str, Any]
    batch_directives: list[str]
    environment: dict[str, str]
    launch_options: dict[str, Any]
    observability_globs: list[str]
    shared_dir: Path | None = None
    #: the campaign whose shared inputs ``shared_dir`` holds
    campaign_id: str | None = None
    #: who the command runs as (R-CASE-8); None for backends that run nothing on this host's
    #: accounts (FirecREST, Qarnot: the provider's own account runs it).
    run_as: RunAs | None = None
    #: the class's bounds (memory, tasks, CPU, wall time, disk), for backends that enforce them
    bounds: CaseBounds | None = None
    #: set by the core: renews the launch lease. A backend whose submission takes long (uploads)
    #: calls :meth:`heartbeat` between steps, so no other worker takes the launch over and
    #: submits a second job (R-CASE-1). Raises :class:`LeaseLost` when the launch is no longer
    #: ours: the backend stops there, before submitting anything.
    keepalive: Callable[[], None] | None = field(default=None, repr=False, compare=False)
    #: whose provider credential submits it (remote backends; None: the pool's service account)
    identity: RemoteIdentity | None = field(default=None, repr=False, compare=False)

    @property
    def inputs_dir(self) -> Path:
        return self.workspace / "inputs"

    def heartbeat(self) -> None:
        if self.keepalive is not None:
            self.keepalive()


@dataclass(frozen=True)
class JobRef:
    """A submitted case as a backend sees it: its remote id plus the case identity it was
    submitted under (job name, workspace) so a backend can find its files without the database."""

    case_id: str
    remote_id: str
    workspace: Path
    pool_remote: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    #: results brought back never hold more than this on disk (the class's storage)
    max_result_bytes: int | None = None
    #: whose provider credential every call about the job uses (the owner's on a per-user pool)
    identity: RemoteIdentity | None = field(default=None, hash=False, compare=False, repr=False)


class BackendError(Exception):
    """A provider call failed. The message is shown to users: never put a credential in it.

    The facts the core acts on are attributes set where the provider's error is caught (never
    read back from the text, STYLE example 6): ``timeout`` (the provider did not answer in time)
    and ``transient`` (retrying later may work: a busy controller, a dropped connection). A
    submission that fails with a transient error is retried with back-off instead of failing the
    case (R-CASE-1); any other error is permanent."""

    transient = False
    timeout = False

    def __init__(self, *args, transient: bool | None = None, timeout: bool | None = None):
        super().__init__(*args)
        if timeout is not None:
            self.timeout = timeout
        if transient is not None:
            self.transient = transient
        elif self.timeout:
            self.transient = True  # a timeout is always worth another try


def require_command(spec: SubmitSpec) -> None:
    """A case with nothing to run is refused before anything is uploaded or started (the model
    refuses an empty command; a spec is checked again here, where it would run)."""
    if not spec.command.strip():
        raise BackendError("the case has no command to run")


class SubmitUncertain(BackendError):
    """The submission may or may not have reached the provider (its answer timed out, or the
    provider said it lost the answer, and the job is not listed yet). The core keeps the case
    prepared and retries the launch later; the retry looks the job up by name first (``find``),
    so it adopts the job instead of creating a second one (R-CASE-1)."""

    transient = True


class CredentialsRequired(BackendError):
    """The case owner's own credential for a per-user pool is missing, expired or revoked
    (FirecREST's ``invalid_grant``, Qarnot's 401): nothing can be done for them until they
    reconnect, and the message says where. Not transient (the same credential fails the same way)
    and not a failure of the job: a launch fails with this message, a poll keeps the case as it
    is and says it waits for its owner to reconnect."""


class LeaseLost(BackendError):
    """The launch lease was taken over (it expired, or the case was cancelled) while this worker
    was preparing the submission: it must stop without submitting."""


class ResultsTooLarge(BackendError):
    """fetch_final found more results than the case may bring back (``JobRef.max_result_bytes``):
    not worth retrying, the case fails saying so (what was copied before the limit stays)."""


class AlreadyFinished(BackendError):
    """cancel() on a job that already ended (e.g. Qarnot's 'Invalid operation on non-running
    task'): not an error for the user, the case reports its real final state (R-CASE-6)."""


class ExecutionBackend(ABC):
    """Five verbs plus launch options and doctor. Instances are cheap and stateless: build one per
    call site with :func:`apps.backends.registry.get_backend`."""

    #: True for backends that run the command under a Unix account of this site (local, Slurm):
    #: the core resolves a :class:`RunAs` for them and refuses the launch without one (R-CASE-8).
    runs_as_user: bool = False
    #: True for backends whose job lives on the worker host that submitted it (local: a process
    #: checked through /proc). Its cases are pinned to that host (``Case.run_host``) and claimed
    #: only by its workers. Others are reachable from any host. Either way every web and worker
    #: host must see one cases root (docs/deployment.md): the web writes inputs and serves logs and
    #: results there, and any worker host may submit a not-yet-pinned launch.
    host_bound: bool = False
    #: what the pages say a pool lacks before anyone launches (``readiness``): the pool's
    #: ``remote`` keys a case cannot run without, each with what is missing in users' words, and
    #: the commands it runs on this host
    needs: tuple[tuple[str, str], ...] = ()
    commands: tuple[str, ...] = ()

    @abstractmethod
    def submit(self, spec: SubmitSpec) -> str:
        """Start the case, return the remote id. Raise BackendError on failure."""

    @abstractmethod
    def find(self, spec: SubmitSpec) -> str | None:
        """The remote id of a job already submitted for this case (by its name, the case id), or
        None. Called before every submit so a retried launch adopts instead of resubmitting
        (R-CASE-1)."""

    @abstractmethod
    def poll(self, job: JobRef) -> BackendState:
        """The job's state. Raise BackendError when the provider cannot say (a failed poll)."""

    def poll_many(self, jobs: list[JobRef]) -> dict[str, BackendState | Exception]:
        """Poll several jobs; keyed by remote id. Backends that can batch override this so a pass
        costs one provider call per (system, credential) instead of one per case."""
        out: dict[str, BackendState | Exception] = {}
        for job in jobs:
            try:
                out[job.remote_id] = self.poll(job)
            except Exception as exc:  # one bad job must not fail the others' polls
                out[job.remote_id] = exc
        return out

    @abstractmethod
    def sync(self, job: JobRef, globs: list[str]) -> None:
        """Copy the files matching ``globs`` (and ``.gridgate/progress``) into ``live/``."""

    @abstractmethod
    def fetch_final(self, job: JobRef) -> None:
        """Bring the case's results into ``results/``. Raise BackendError if they are not all
        there: the case stays running and is retried (R-CASE-4)."""

    @abstractmethod
    def cancel(self, job: JobRef) -> None:
        """Stop the job. Raise AlreadyFinished when it had already ended."""

    def purge(self, job: JobRef) -> None:
        """Remove what a finished case left on the provider's side (buckets, run directories),
        called by ``manage.py cleanup`` once the case is past the retention (SPEC §8). Must be
        idempotent: purging twice, or a case whose submission never reached the provider, is no
        error. ``job.remote_id`` may be empty (a launch that failed after uploading). The default:
        nothing kept remotely."""
        return None

    def launch_options(self, pool, identity: RemoteIdentity | None = None) -> LaunchOptions:
        """What a user may choose on ``pool`` (R-BACK-2). Nothing declared: nothing accepted.
        ``identity``: on a per-user pool, the user's own connected credential, whose account's
        choices (partitions, node types, projects) are offered; None there: the pool's own values."""
        return LaunchOptions()

    def pin_class_overrides(self, answer: LaunchOptions, resource_class) -> LaunchOptions:
        """``answer`` (the pool's options, possibly cached) with what ``resource_class`` fixes.
        Slurm-like backends pin the class's partition (R-BACK-6); others have no overrides."""
        return answer

    def doctor(self, pool=None) -> list[Check]:
        return []


class PollsMany:
    """For a backend whose provider answers many jobs in one call: it writes ``poll_many``, and
    ``poll`` is that call for one job (put before ``ExecutionBackend`` among the bases)."""

    def poll(self, job: JobRef) -> BackendState:
        result = self.poll_many([job])[job.remote_id]
        if isinstance(result, Exception):
            raise result
        return result


def duration_seconds(text: str, day_mark: str) -> float | None:
    """A provider's ``[days<day_mark>][[hh:]mm:]ss[.fraction]`` in seconds: Slurm's
    ``D-HH:MM:SS`` (day_mark ``-``), Qarnot's ``d.hh:mm:ss.fffffff`` (``.``); None when the
    text is not one (Slurm's ``UNLIMITED``, an empty field)."""
    head, _, clock = text.strip().partition(":")
    days, marked, head = head.partition(day_mark)
    if not marked:
        days, head = "0", days
    seconds = 0.0
    try:
        for part in [head, *clock.split(":")] if clock else [head]:
            seconds = seconds * 60 + float(part)
        return int(days) * 86400 + seconds
    except ValueError:
        return None
