"""The fake backend: a scripted remote service, in process, for tests and benchmarks
(docs/backends.md, "fake").

Like csauto's StubAdapter it satisfies the contract with local files and a scripted state
sequence, so the whole remote lifecycle runs with no network, no account and no credit. Its
"remote" state lives in this process (class attributes), so it serves tests, the benchmark and a
single-process demo, not a multi-host deployment.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field

from apps.backends import files
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

DEFAULT_SCRIPT = (BackendStatus.PENDING, BackendStatus.RUNNING, BackendStatus.RUNNING, BackendStatus.SUCCEEDED)


@dataclass
class Faults:
    """Injected failures (tests, ``FakeBackend.faults.fail_polls = N``): how many of the next
    polls, downloads or submissions fail. ``fail_submit`` fails for good, ``transient_submit``
    with a transient error (nothing queued), ``uncertain_submit`` with a lost answer (the job IS
    queued, the caller is not told)."""

    fail_polls: int = 0
    fail_fetch_final: int = 0
    fail_submit: int = 0
    transient_submit: int = 0
    uncertain_submit: int = 0


@dataclass
class FakeJob:
    case_id: str
    script: list[str]
    step: int = -1
    cancelled: bool = False
    files: dict[str, bytes] = field(default_factory=dict)
    progress_file: str | None = None

    @property
    def status(self) -> str:
        if self.cancelled:
            return BackendStatus.CANCELLED
        return self.script[self.step] if self.step >= 0 else BackendStatus.PENDING


class FakeBackend(ExecutionBackend):
    # The fake "provider": shared by every instance in this process.
    jobs: dict[str, FakeJob] = {}
    faults = Faults()
    calls: dict[str, int] = {}
    script: tuple[str, ...] = DEFAULT_SCRIPT
    _lock = threading.Lock()
    _ids = itertools.count(1)

    @classmethod
    def reset(cls) -> None:
        with cls._lock:
            cls.jobs = {}
            cls.faults = Faults()
            cls.calls = {}
            cls.script = DEFAULT_SCRIPT

    def _count(self, verb: str) -> None:
        with self._lock:
            self.calls[verb] = self.calls.get(verb, 0) + 1

    @staticmethod
    def _take(attr: str) -> bool:
        with FakeBackend._lock:
            left = getattr(FakeBackend.faults, attr)
            if left > 0:
                setattr(FakeBackend.faults, attr, left - 1)
                return True
        return False

    # -- contract --------------------------------------------------------------------------
    def find(self, spec: SubmitSpec) -> str | None:
        self._count("find")
        with self._lock:
            for remote_id, job in self.jobs.items():
                if job.case_id == spec.case_id:
                    return remote_id
        return None

    def submit(self, spec: SubmitSpec) -> str:
        self._count("submit")
        if self._take("fail_submit"):
            raise BackendError("fake: submission refused (injected failure)")
        if self._take("transient_submit"):
            raise BackendError("fake: provider busy, try later (injected failure)", transient=True)
        script = list(self.script)
        if spec.launch_options.get("outcome") == "fail":
            script[-1] = BackendStatus.FAILED
        outputs = {}
        for rel, path in files.walk_files(spec.inputs_dir):
            outputs[f"inputs-seen/{rel}"] = path.read_bytes()
        outputs["result.txt"] = f"fake result of {spec.case_id}\n".encode()
        with self._lock:
            remote_id = f"fake-{next(self._ids)}"
            self.jobs[remote_id] = FakeJob(case_id=spec.case_id, script=script, files=outputs)
        if self._take("uncertain_submit"):
            raise SubmitUncertain("fake: the answer was lost (injected failure)", timeout=True)
        return remote_id

    def _job(self, remote_id: str) -> FakeJob:
        job = self.jobs.get(remote_id)
        if job is None:
            raise BackendError(f"fake: job {remote_id} not found")
        return job

    def poll(self, job_ref: JobRef) -> BackendState:
        self._count("poll")
        if self._take("fail_polls"):
            raise BackendError("fake: provider unreachable (injected failure)")
        with self._lock:
            job = self._job(job_ref.remote_id)
            if not job.cancelled and job.status not in BackendStatus.TERMINAL:
                job.step = min(job.step + 1, len(job.script) - 1)
            status, step, total = job.status, job.step, len(job.script)
        stdout = f"step {step + 1}/{total}: {status}\n"
        stderr = "fake: simulated failure\n" if status == BackendStatus.FAILED else ""
        return BackendState(
            status=status,
            progress=None,  # like most providers: progress comes from the marker file
            stdout_delta=stdout,
            stderr_delta=stderr,
            execution_time=float(max(step, 0)),
            cores=1,
            message="fake: scripted failure" if status == BackendStatus.FAILED else "",
        )

    def set_progress_marker(self, remote_id: str, value: str) -> None:
        """Test hook: the command "writes" ``.gridgate/progress``."""
        with self._lock:
            self._job(remote_id).progress_file = value

    def sync(self, job_ref: JobRef, globs: list[str]) -> None:
        self._count("sync")
        with self._lock:
            job = self._job(job_ref.remote_id)
            marker = job.progress_file
        live = job_ref.workspace / "live"
        live.mkdir(parents=True, exist_ok=True)
        if marker is not None:
            (live / ".gridgate").mkdir(exist_ok=True)
            (live / files.PROGRESS_FILE).write_text(marker)
        (live / "fake.log").write_text(f"synced {job_ref.remote_id}\n")

    def fetch_final(self, job_ref: JobRef) -> None:
        self._count("fetch_final")
        if self._take("fail_fetch_final"):
            raise BackendError("fake: download interrupted (injected failure)")
        with self._lock:
            outputs = dict(self._job(job_ref.remote_id).files)
        for rel, data in outputs.items():
            target = job_ref.workspace / "results" / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f".{target.name}.part")  # a reader never sees half a file
            partial.write_bytes(data)
            partial.replace(target)

    def cancel(self, job_ref: JobRef) -> None:
        self._count("cancel")
        with self._lock:
            job = self._job(job_ref.remote_id)
            if job.status in BackendStatus.TERMINAL:
                raise AlreadyFinished(f"fake: job {job_ref.remote_id} already {job.status}")
            job.cancelled = True

    def complete(self, remote_id: str) -> None:
        """Test hook: the provider finishes the job now (e.g. between a refresh and a cancel)."""
        with self._lock:
            job = self._job(remote_id)
            job.step = len(job.script) - 1

    def launch_options(self, pool, identity=None) -> LaunchOptions:
        choices = [Choice("succeed", "Succeed"), Choice("fail", "Fail")]
        return LaunchOptions(options=[LaunchOption("outcome", "Scripted outcome", choices, default="succeed")])

    def doctor(self, pool=None) -> list[Check]:
        return [Check("fake", True, "the fake backend needs nothing (in-process, for tests and benchmarks)")]
