"""The local backend: a real process on the worker host, sandboxed and bounded, that outlives
the worker. What it does is in docs/backends.md, "local"; the sandbox, its bounds and its network
in docs/operations.md, "Running users' commands". The reasons behind it:

- R-CASE-8: the command reaches nothing but its own working directory. bubblewrap gives it its own
  pid namespace and ``/proc`` (so no ``/proc/<worker>/environ``), its own network namespace (the
  host's PostgreSQL, Redis and web port listen on the host's loopback) and a cleared environment.
- The service is not root: what needs root is the privileged helper's
  (``apps/backends/privileged.py``, through :mod:`apps.backends.as_root`), which checks every
  request. This module prepares the run directory as the service (the command goes in
  ``command.sh``, never an argument, since every account on the host reads every command line)
  and reads what the supervisor writes there: nothing lives only in the memory of the worker that
  started the case, so a restarted worker reads the outcome from disk.
- Cancel: bwrap dying takes its whole pid namespace with it, so a command that trapped SIGTERM or
  left the process group still ends.
- The remote id is ``local:<supervisor pid>``, but the supervisor's flock on ``.run/lock``, not
  the pid (which may be recycled, and which the service may not see under ``hidepid``), says
  whether the case still runs. That lock is this host's, so the backend is ``host_bound``.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import time
from dataclasses import replace
from pathlib import Path

from django.conf import settings

from apps.backends import as_root, files
from apps.backends.base import (
    AlreadyFinished,
    BackendError,
    BackendState,
    BackendStatus,
    Check,
    ExecutionBackend,
    JobRef,
    LaunchOption,
    LaunchOptions,
    RunAs,
    SubmitSpec,
    require_command,
)
from apps.core.cases_root import ensure_cases_root, root_parent_check

#: the exit status by which a bound shows without the supervisor's word: SIGXFSZ (a file reached
#: RLIMIT_FSIZE)
XFSZ_STATUS = str(128 + signal.SIGXFSZ)
#: control files of a run, removed before each start (a retried launch starts clean)
CONTROL_FILES = ("exit_status", "cancelled", "stdout", "stderr", "pid", "limit", "results_fetched")


def run_dir(workspace: Path) -> Path:
    return workspace / ".run"


def _read_limit(rdir: Path) -> str:
    """The bound the supervisor stopped the case at, in words ("" if none)."""
    try:
        return str(json.loads((rdir / "limit").read_text())["message"])
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def supervisor_alive(rdir: Path) -> bool:
    """The case's supervisor still runs: it holds the run's lock (an flock ends with it)."""
    try:
        fd = os.open(rdir / "lock", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also lets go of the shared lock, if we got it
    return False


def sandbox_environment(spec: SubmitSpec, work: Path) -> dict[str, str]:
    """The case's variables; HOME is its working directory and TMPDIR the sandbox's empty /tmp
    (the worker's own HOME and TMPDIR mean nothing, and may hold what the command must not see)."""
    env = files.case_environment(spec)
    env.update(PATH=files.DEFAULT_PATH, HOME=str(work), TMPDIR="/tmp")  # noqa: S108 - the sandbox's private tmpfs
    return env


def wall_seconds(spec: SubmitSpec) -> int:
    """The class's wall time, or the launch option ``time`` (minutes) within the class's maximum."""
    bounds = spec.bounds
    chosen = spec.launch_options.get("time")
    if chosen in (None, ""):
        return bounds.wall_seconds
    return min(int(chosen) * 60, bounds.max_wall_seconds)


def _gb(n: int) -> str:
    return f"{n / (1 << 30):g} GB"


def _duration(seconds: int) -> str:
    hours, rest = divmod(int(seconds), 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


def start_request(spec: SubmitSpec, work: Path) -> dict:
    """What the helper's ``start`` is asked: who, with what, within which bounds, and the words
    for each bound it may have to enforce."""
    bounds = spec.bounds
    run_as = spec.run_as or RunAs(RunAs.TRUSTED)
    wall = wall_seconds(spec)
    return {
        "case_id": spec.case_id,
        "account": {"uid": run_as.uid} if run_as.switches else None,
        "env": sandbox_environment(spec, work),
        "network": run_as.network,
        "allowed_networks": list(run_as.allowed_networks),
        "shared_campaign": spec.campaign_id if spec.shared_dir is not None and spec.shared_dir.is_dir() else None,
        "bounds": {
            "memory_bytes": bounds.memory_bytes,
            "cpu": bounds.cpu,
            "tasks": bounds.tasks,
            "disk_bytes": bounds.disk_bytes,
        },
        "wall_seconds": wall,
        "grace": settings.GRIDGATE_CASE_CANCEL_GRACE_SECONDS,
        "disk_interval": settings.GRIDGATE_CASE_DISK_CHECK_SECONDS,
        "messages": {
            "memory": f"the command ran out of memory: the class allows {_gb(bounds.memory_bytes)} "
            "and the kernel killed a process of the case",
            "tasks": f"the command reached the class's limit of {bounds.tasks} tasks (processes and threads) "
            "and was stopped",
            "wall_time": f"the command ran past its wall time of {_duration(wall)} and was stopped",
            "disk": f"the case's working directory and output grew past the class's storage of "
            f"{_gb(bounds.disk_bytes)} and the command was stopped",
            "network": "the case's network could not be set up (slirp4netns): ask an operator",
        },
    }


def _time_option(maximum: int, default: str | None) -> LaunchOption:
    return LaunchOption("time", "Wall time (minutes)", [], default, minimum=1, maximum=maximum)


class LocalBackend(ExecutionBackend):
    runs_as_user = True
    host_bound = True  # liveness is this host's lock: only this host polls or cancels

    def find(self, spec: SubmitSpec) -> str | None:
        pid_file = run_dir(spec.workspace) / "pid"
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return f"local:{pid}"

    def submit(self, spec: SubmitSpec) -> str:
        require_command(spec)
        if spec.bounds is None:  # pragma: no cover - the core always sets them
            raise BackendError("the case has no bounds: refusing to run it unbounded")
        run_as = spec.run_as or RunAs(RunAs.TRUSTED)
        if run_as.network and shutil.which("bwrap") and not shutil.which("slirp4netns"):
            raise BackendError(
                "this pool allows its cases the network, but slirp4netns (which keeps the host's loopback "
                "out of their reach) is not installed on the worker host: apt install slirp4netns"
            )
        rdir = run_dir(spec.workspace)
        try:
            rdir.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(rdir, 0o700)  # the control files are the service's alone (R-CASE-8)
            for name in CONTROL_FILES:
                (rdir / name).unlink(missing_ok=True)
            work = files.prepare_run_dir(
                rdir, spec.inputs_dir, spec.shared_dir, shared="mount" if shutil.which("bwrap") else "link"
            )
            files.write_private(rdir / "command.sh", spec.command.encode("utf-8", "surrogateescape"))
        except OSError as exc:
            raise BackendError(f"cannot prepare the working directory: {exc}") from None
        # R-BACK-1: the sandbox gets the case's variables only, never the worker's environment.
        pid = as_root.call("start", start_request(spec, work), timeout=120)["pid"]
        files.write_private(rdir / "pid", str(pid).encode())
        return f"local:{pid}"

    def poll(self, job: JobRef) -> BackendState:
        rdir = run_dir(job.workspace)
        # The status is decided before the output is read: a command that ends between the two
        # reads would otherwise be finalized without the output it wrote last (R-CASE-5).
        if (rdir / "cancelled").exists():
            status, message = BackendStatus.CANCELLED, "cancelled"
        elif (rdir / "exit_status").exists():
            code = (rdir / "exit_status").read_text().strip()
            bound = _read_limit(rdir)
            if bound:
                status, message = BackendStatus.FAILED, bound
            elif code == "0":
                status, message = BackendStatus.SUCCEEDED, ""
            elif code == XFSZ_STATUS:
                stopped = "the command was stopped (SIGXFSZ): a file, or its output, reached the class's storage limit"
                status, message = BackendStatus.FAILED, stopped
            else:
                status, message = BackendStatus.FAILED, f"the command exited with status {code}"
        elif supervisor_alive(rdir):
            status, message = BackendStatus.RUNNING, ""
        else:
            # Gone without writing its status: killed from outside or the host rebooted.
            status, message = BackendStatus.FAILED, "the process disappeared without an exit status"
        # A finished command writes nothing more: drain its output now, in chunks (the case is
        # finalized on this answer and never polled again).
        limit = None if status in BackendStatus.TERMINAL else 4 << 20
        for stream in ("stdout", "stderr"):
            files.drain_log(rdir / stream, job.workspace / f"{stream}.log", cap=files.log_cap_bytes(), limit=limit)
        started = (rdir / "pid").stat().st_mtime if (rdir / "pid").exists() else None
        ended = (rdir / "exit_status").stat().st_mtime if (rdir / "exit_status").exists() else None
        execution_time = None
        if started is not None:
            execution_time = max(0.0, (ended or time.time()) - started)
        return BackendState(status=status, execution_time=execution_time, cores=1, message=message)

    def sync(self, job: JobRef, globs: list[str]) -> None:
        as_root.call("collect", {"case_id": job.case_id, "what": "live", "globs": list(globs or [])}, timeout=3600)

    def fetch_final(self, job: JobRef) -> None:
        if (run_dir(job.workspace) / "results_fetched").exists():
            return  # a retry whose outcome was not recorded: the results are in, the work is gone
        request = {"case_id": job.case_id, "what": "results", "max_bytes": job.max_result_bytes}
        as_root.call("collect", request, timeout=24 * 3600)

    def cancel(self, job: JobRef) -> None:
        """R-CASE-8: stop the whole tree. A run directory that vanished is "already gone": the
        tree is still stopped if it runs, and the cancel succeeds (never a FileNotFoundError)."""
        rdir = run_dir(job.workspace)
        if (rdir / "exit_status").exists():
            raise AlreadyFinished("the command had already finished")
        try:
            files.write_private(rdir / "cancelled", b"cancelled\n")
        except FileNotFoundError:
            pass  # the run directory is gone; the helper stops what still runs through its cgroup
        else:
            if not supervisor_alive(rdir):
                return  # already gone
        grace = settings.GRIDGATE_CASE_CANCEL_GRACE_SECONDS
        as_root.call("stop", {"case_id": job.case_id, "grace": grace}, timeout=grace + 60)

    def launch_options(self, pool, identity=None) -> LaunchOptions:
        """The wall time in minutes; its range and default are the class's
        (:meth:`pin_class_overrides`)."""
        return LaunchOptions(options=[_time_option(7 * 24 * 60, None)])

    def pin_class_overrides(self, answer: LaunchOptions, resource_class) -> LaunchOptions:
        options = [
            _time_option(max(1, resource_class.max_wall_time // 60), str(max(1, resource_class.wall_time // 60)))
            if option.key == "time"
            else option
            for option in answer.options
        ]
        return replace(answer, options=options)

    def purge(self, job: JobRef) -> None:
        """The working directory and a cgroup its supervisor could not remove (it was killed)."""
        if run_dir(job.workspace).exists():
            as_root.call("clean", {"case_id": job.case_id}, timeout=3600)

    def doctor(self, pool=None) -> list[Check]:
        checks = [Check("shell", os.access("/bin/sh", os.X_OK), "/bin/sh runs the case commands")]
        trusted = pool is not None and pool.trusted  # runs as the service: no switch, sandbox optional
        if bwrap := shutil.which("bwrap"):
            checks.append(Check("sandbox", True, f"{bwrap} isolates each case (R-CASE-8)"))
        else:
            missing = "bwrap is missing: apt install bubblewrap (only trusted pools run without it)"
            checks.append(Check("sandbox", trusted, missing))
        checks.append(as_root.helper_check(trusted, cgroup=True))
        if not trusted:
            checks.append(Check("cases root parent", *root_parent_check()))
        network = pool is not None and pool.network
        if slirp := shutil.which("slirp4netns"):
            routes = f"{slirp} routes the cases of pools that allow the network, never to the host's loopback"
            checks.append(Check("network", True, routes))
        else:
            missing = (
                "slirp4netns is missing: cases of pools that allow the network cannot start "
                "(apt install slirp4netns); other pools' cases have no network"
            )
            checks.append(Check("network", not network, missing))
        if network:
            checks.append(as_root.egress_check())
        root = Path(settings.GRIDGATE_CASES_ROOT)
        try:
            ensure_cases_root()
            probe = root / ".doctor-probe"
            probe.write_text("ok")
            probe.unlink()
            checks.append(Check("cases root", True, f"{root} is writable"))
        except OSError as exc:
            fix = "set GRIDGATE_CASES_ROOT to a writable directory"
            checks.append(Check("cases root", False, f"{root} is not writable ({exc}): {fix}"))
        free_gb = shutil.disk_usage(root).free / 1e9 if root.exists() else 0
        checks.append(Check("disk space", free_gb >= 1, f"{free_gb:.1f} GB free under {root}"))
        return checks
