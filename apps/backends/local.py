"""The local backend: a real subprocess on the worker host that outlives the worker.

The command runs detached (``start_new_session``: its own process group, so a worker restart or
SIGTERM to the cluster does not kill it) in a scratch copy of ``inputs/`` under the case's
``.run/`` directory. A small shell wrapper writes the command's exit status to ``.run/exit_status``
when it ends, so a worker that restarts later reads the outcome from disk: nothing lives only in
the memory of the process that started it.

The remote id is ``local:<pid>``. Liveness is checked on this host only: the local backend serves
single-host deployments (or pins its cases to the host that started them).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from apps.backends import files
from apps.backends.base import (
    AlreadyFinished,
    BackendError,
    BackendState,
    BackendStatus,
    Check,
    ExecutionBackend,
    JobRef,
    SubmitSpec,
)

WRAPPER = """#!/bin/sh
# Written by Gridgate's local backend. The exit status goes to a file, atomically, so whoever
# polls later (any worker, after any restart) reads the outcome from disk.
cd "$1/work" || exit 97
/bin/sh -c "$2" >"$1/stdout" 2>"$1/stderr" </dev/null
status=$?
echo "$status" >"$1/exit_status.part" && mv "$1/exit_status.part" "$1/exit_status"
"""


def run_dir(workspace: Path) -> Path:
    return workspace / ".run"


def _alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (a zombie has finished)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return state != "Z"


class LocalBackend(ExecutionBackend):
    name = "local"
    kinds = ("local",)

    def find(self, spec: SubmitSpec) -> str | None:
        pid_file = run_dir(spec.workspace) / "pid"
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return f"local:{pid}"

    def submit(self, spec: SubmitSpec) -> str:
        if not spec.command.strip():
            raise BackendError("the case has no command to run")
        rdir = run_dir(spec.workspace)
        for name in ("exit_status", "cancelled", "stdout", "stderr", "pid"):
            (rdir / name).unlink(missing_ok=True)
        rdir.mkdir(parents=True, exist_ok=True)
        try:
            files.prepare_run_dir(rdir, spec.inputs_dir, spec.shared_dir)
        except OSError as exc:
            raise BackendError(f"cannot prepare the working directory: {exc}") from None
        wrapper = rdir / "wrapper.sh"
        wrapper.write_text(WRAPPER)
        # R-BACK-1: never the worker's environment (tokens, SECRET_KEY, DATABASE_URL…).
        env = files.case_environment(spec)
        try:
            process = subprocess.Popen(
                ["/bin/sh", str(wrapper), str(rdir), spec.command],
                cwd=rdir,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # own process group: survives the worker, killable as a group
                close_fds=True,
                env=env,
            )
        except OSError as exc:
            raise BackendError(f"cannot start the command: {exc}") from None
        (rdir / "pid").write_text(str(process.pid))
        return f"local:{process.pid}"

    @staticmethod
    def _pid(job: JobRef) -> int:
        try:
            return int(job.remote_id.split(":", 1)[1])
        except (IndexError, ValueError):
            raise BackendError(f"not a local job id: {job.remote_id!r}") from None

    def poll(self, job: JobRef) -> BackendState:
        rdir = run_dir(job.workspace)
        pid = self._pid(job)
        cores = 1
        # The status is decided before the output is read: a command that ends between the two
        # reads would otherwise be finalized without the output it wrote last (R-CASE-5).
        if (rdir / "cancelled").exists():
            status, message = BackendStatus.CANCELLED, "cancelled"
        elif (rdir / "exit_status").exists():
            code = (rdir / "exit_status").read_text().strip()
            if code == "0":
                status, message = BackendStatus.SUCCEEDED, ""
            else:
                status, message = BackendStatus.FAILED, f"the command exited with status {code}"
        elif _alive(pid):
            status, message = BackendStatus.RUNNING, ""
        else:
            # Gone without writing its status: killed from outside or the host rebooted.
            status, message = BackendStatus.FAILED, "the process disappeared without an exit status"
        # A finished command writes nothing more: drain its output now, whatever its size (the
        # case is finalized on this answer and never polled again).
        limit = None if status in BackendStatus.TERMINAL else 4 << 20
        stdout = files.read_delta(rdir / "stdout", job.workspace / "stdout.log", limit=limit)
        stderr = files.read_delta(rdir / "stderr", job.workspace / "stderr.log", limit=limit)
        started = (rdir / "pid").stat().st_mtime if (rdir / "pid").exists() else None
        ended = (rdir / "exit_status").stat().st_mtime if (rdir / "exit_status").exists() else None
        execution_time = None
        if started is not None:
            execution_time = max(0.0, (ended or time.time()) - started)
        return BackendState(
            status=status,
            progress=None,
            stdout_delta=stdout,
            stderr_delta=stderr,
            execution_time=execution_time,
            cores=cores,
            message=message,
        )

    def sync(self, job: JobRef, globs: list[str]) -> None:
        files.sync_live(run_dir(job.workspace) / "work", job.workspace / "live", globs)

    def fetch_final(self, job: JobRef) -> None:
        files.copy_results(run_dir(job.workspace), job.workspace / "results")

    def cancel(self, job: JobRef) -> None:
        rdir = run_dir(job.workspace)
        if (rdir / "exit_status").exists():
            raise AlreadyFinished("the command had already finished")
        pid = self._pid(job)
        (rdir / "cancelled").write_text("cancelled\n")
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        except PermissionError as exc:
            raise BackendError(f"cannot stop process group {pid}: {exc}") from None

    def doctor(self, pool=None) -> list[Check]:
        from django.conf import settings

        checks = [Check("shell", os.access("/bin/sh", os.X_OK), "/bin/sh runs the case commands")]
        root = Path(settings.GRIDGATE_CASES_ROOT)
        try:
            root.mkdir(parents=True, exist_ok=True)
            probe = root / ".doctor-probe"
            probe.write_text("ok")
            probe.unlink()
            checks.append(Check("cases root", True, f"{root} is writable"))
        except OSError as exc:
            checks.append(
                Check(
                    "cases root",
                    False,
                    f"{root} is not writable ({exc}): set GRIDGATE_CASES_ROOT to a writable directory",
                )
            )
        free_gb = shutil.disk_usage(root).free / 1e9 if root.exists() else 0
        checks.append(Check("disk space", free_gb >= 1, f"{free_gb:.1f} GB free under {root}"))
        return checks
