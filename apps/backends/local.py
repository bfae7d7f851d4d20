"""The local backend: a real process on the worker host, sandboxed and bounded, that outlives
the worker.

R-CASE-8 — the command reaches nothing but its own working directory:

- It runs as the case's :class:`~apps.backends.base.RunAs` account (the owner's linked account or
  the pool's sandbox account; a trusted demo pool: the service's own), inside bubblewrap
  (``bwrap``) with its own pid namespace and ``/proc`` (no other process is visible, so no
  ``/proc/<worker>/environ``), a cleared environment plus the case's variables, read-only system
  directories, a private ``/tmp`` no larger than the class's memory and, of the cases root, only
  its own ``.run/work`` (owned by its account, mode 0700). Root starts bwrap with
  CAP_SETUID/CAP_SETGID kept for ``setpriv``, which switches to the account and drops every
  capability before the command starts.
- Issue 36 — its own network namespace, always: only its own loopback, unless the pool allows
  the network; then slirp4netns routes it out with the host's loopback out of reach (the host's
  PostgreSQL, Redis and web port listen there).
- Issue 36 — bounded: its cgroup holds the class's memory, tasks and CPU; rlimits bound a file's
  size and an account's processes; a wall time and a disk bound stop it
  (``apps.backends.supervisor``, which says how). Results come back within the class's storage,
  sparse files as sparse; logs are drained in chunks up to ``GRIDGATE_CASE_MAX_LOG_MB``; the
  working directory is dropped once the results are fetched.
- A supervisor (``apps/backends/supervisor.py``, the service's account, in its own session,
  detached from the process that launched it: a web worker never parents it, so it leaves no
  zombie there) starts the sandbox with the command's output in ``.run/stdout``/``stderr``
  and writes the exit status to ``.run/exit_status`` when it ends. ``.run/`` is the service's
  (0700): the command can neither read nor forge its control files. Nothing lives only in the
  memory of the process that started it, so a restarted worker reads the outcome from disk. The
  command itself reaches the sandbox as a file, never as an argument: every account on the host
  reads every command line.
- Cancel: SIGUSR1 asks the supervisor to stop the command (SIGTERM to its process group and
  cgroup; the supervisor and bwrap ignore it), then SIGKILL after
  ``GRIDGATE_CASE_CANCEL_GRACE_SECONDS``; killing bwrap tears down the whole pid namespace
  (``--die-with-parent``), so a command that trapped SIGTERM or left the process group still ends.

The remote id is ``local:<supervisor pid>``. A pid is trusted only while its command line names
this case's run directory (a recycled pid is never signalled). Liveness is checked on this host
only, so the backend is ``host_bound``: a case is pinned to the worker host that starts its
process (``Case.run_host``) and only that host's workers poll, sync or cancel it (issue 17).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from apps.backends import files, supervisor
from apps.backends.base import (
    AlreadyFinished,
    BackendError,
    BackendState,
    BackendStatus,
    CaseBounds,
    Check,
    ExecutionBackend,
    JobRef,
    LaunchOption,
    LaunchOptions,
    RunAs,
    SubmitSpec,
)
from apps.core.cases_root import ensure_cases_root

SUPERVISOR = Path(supervisor.__file__).resolve()
#: where the command is found in the sandbox (given as fd 3, copied in by bwrap, read-only)
COMMAND_IN_SANDBOX = "/gridgate/command.sh"
#: slirp4netns's built-in DNS forwarder, the sandbox's only name server when it has a network
SLIRP_DNS = "nameserver 10.0.2.3\n"
#: the exit statuses by which a bound shows without the supervisor's word: SIGXFSZ (a file
#: reached RLIMIT_FSIZE)
XFSZ_STATUS = str(128 + signal.SIGXFSZ)


#: /etc entries a shell command needs (users, libraries, locale, alternatives such as awk, TLS
#: roots, name resolution); the rest of /etc (a deployment's env files) stays out of sight.
ETC_ENTRIES = (
    "passwd",
    "group",
    "nsswitch.conf",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "alternatives",
    "ssl",
    "ca-certificates",
    "resolv.conf",
    "hosts",
    "host.conf",
)
#: top-level system directories, bound read-only (or recreated as the symlinks they are on
#: merged-/usr systems). Not /opt, /srv or /home: deployments live there.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64")


def run_dir(workspace: Path) -> Path:
    return workspace / ".run"


def _write_private(path: Path, text: str, mode: int = 0o600) -> None:
    """A control file of the service's run directory, never written through a planted symlink."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(path, mode)


def _read_limit(rdir: Path) -> str:
    """The bound the supervisor stopped the case at, in words ("" if none)."""
    try:
        return str(json.loads((rdir / "limit").read_text())["message"])
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def _bounds_check(trusted: bool) -> Check:
    """Issue 36: a probe cgroup with the memory and pids controllers can be made and removed."""
    from django.conf import settings

    if settings.GRIDGATE_CASE_CGROUP == "off":
        return Check("bounds", True, "GRIDGATE_CASE_CGROUP=off: cases run without memory, task and CPU bounds")
    if os.geteuid() != 0:
        return Check(
            "bounds",
            trusted,
            "the worker is not root: cases run without a cgroup (memory, tasks, CPU): trusted pools only",
        )
    name = f"doctor-{os.getpid()}"
    try:
        supervisor.create_cgroup(settings.GRIDGATE_CASE_CGROUP, name, memory_bytes=1 << 30, tasks=16, cpu=1)
    except supervisor.CgroupError as exc:
        return Check("bounds", False, f"{exc}: no case can start (docs/operations.md, 'Bounds')")
    supervisor.remove_cgroup(settings.GRIDGATE_CASE_CGROUP, name)
    where = settings.GRIDGATE_CASE_CGROUP
    return Check("bounds", True, f"each case gets a cgroup under {where!r} (memory, tasks, CPU)")


def _time_option(minimum: int, maximum: int, default: int | None) -> LaunchOption:
    return LaunchOption(
        "time",
        "Wall time (minutes)",
        [],
        str(default) if default is not None else None,
        minimum=minimum,
        maximum=maximum,
    )


def _is_ours(pid: int, rdir: Path) -> bool:
    """The process ``pid`` is alive (not a zombie) and is this case's supervisor or sandbox:
    its command line names the case's run directory (a recycled pid is never taken for it)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = handle.read().split(b"\0")
    except (OSError, IndexError):
        return False
    return state != "Z" and os.fsencode(str(rdir)) in argv


def _group_alive(pgid: int) -> bool:
    """Some process of the group is still running (zombies have finished)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _bind_system(args: list[str], *, resolv: Path | None) -> None:
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    args += ["--perms", "0755", "--dir", "/etc"]  # bwrap makes missing parents 0700: the account could not enter
    for name in ETC_ENTRIES:
        if name == "resolv.conf" and resolv is not None:
            args += ["--ro-bind", str(resolv), "/etc/resolv.conf"]
        else:
            args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]


def _dirs(args: list[str], path: Path, below: Path | None = None) -> None:
    """Create ``path``'s ancestors (below ``below``) 0755 in the sandbox, so the account can
    reach its working directory by its absolute path too."""
    for parent in reversed(path.parents):
        if parent == Path("/") or (below is not None and not parent.is_relative_to(below)) or parent == below:
            continue
        args += ["--perms", "0755", "--dir", str(parent)]


def sandbox_argv(spec: SubmitSpec, work: Path, env: dict[str, str], *, command: Path, bounds: CaseBounds) -> list[str]:
    """The command line that runs the case's command (the file ``command``, handed to bwrap as
    fd 3) in its sandbox (R-CASE-8, issue 36). A pool with the network: bwrap reports on fd 4 and
    waits on fd 5 for the supervisor to plumb it."""
    from django.conf import settings

    run_as = spec.run_as or RunAs(RunAs.TRUSTED)
    inner = ["env", "--default-signal=TERM", "/bin/sh", COMMAND_IN_SANDBOX]
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        if run_as.switches:
            raise BackendError(
                "bubblewrap (bwrap) is not installed: cases cannot run in their sandbox (apt install bubblewrap)"
            )
        # Trusted single-user pool without bubblewrap (a developer's laptop): the service's own
        # account, a cleared environment, no sandbox, the host's network. The pool says so
        # (docs/operations.md).
        variables = [f"{name}={value}" for name, value in sorted(env.items())]
        inner = ["env", "--default-signal=TERM", "/bin/sh", str(command)]
        return ["/usr/bin/env", "-i", *variables, "/bin/sh", "-c", 'cd "$0" && exec "$@"', str(work), *inner]
    args = [bwrap, "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent"]
    # Issue 36: never the host's network namespace, whose loopback holds the database.
    args.append("--unshare-net")
    if run_as.network:
        args += ["--info-fd", str(supervisor.INFO_FD), "--block-fd", str(supervisor.BLOCK_FD)]
    _bind_system(args, resolv=command.parent / "resolv.conf" if run_as.network else None)
    args += ["--proc", "/proc", "--dev", "/dev"]
    # Private and bounded: tmpfs pages count against the case's memory anyway.
    args += ["--perms", "1777", "--size", str(bounds.memory_bytes), "--tmpfs", "/tmp"]  # noqa: S108 - private
    args += ["--perms", "0755", "--dir", str(Path(COMMAND_IN_SANDBOX).parent)]
    args += ["--perms", "0444", "--ro-bind-data", str(supervisor.COMMAND_FD), COMMAND_IN_SANDBOX]
    # Of the cases root, only this case's working directory exists in the sandbox.
    root = Path(settings.GRIDGATE_CASES_ROOT).resolve()
    work = work.resolve()
    _dirs(args, root)
    args += ["--perms", "0755", "--tmpfs", str(root)]
    _dirs(args, work, below=root)
    args += ["--bind", str(work), str(work)]
    if spec.shared_dir is not None and spec.shared_dir.is_dir():
        args += ["--ro-bind", str(spec.shared_dir.resolve()), str(work / "shared")]
    args += ["--chdir", str(work), "--clearenv"]
    for name, value in sorted(env.items()):
        args += ["--setenv", name, value]
    if run_as.switches and os.geteuid() != run_as.uid:
        if os.geteuid() != 0:
            raise BackendError(
                f"running cases as {run_as.name} (uid {run_as.uid}) needs the worker to run as root "
                "(docs/operations.md); or make the pool a trusted single-user pool"
            )
        # bwrap drops every capability of a root caller; setpriv needs these two to switch to
        # the account, then clears them all (and the bounding set) before the command starts.
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--"]
        args += [
            "setpriv",
            f"--reuid={run_as.uid}",
            f"--regid={run_as.gid}",
            "--init-groups" if run_as.name else "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--",
        ]
    else:
        args.append("--")
    return args + inner


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


def supervisor_config(spec: SubmitSpec, argv: list[str], cgroup: dict | None, wall: int) -> dict:
    """What the supervisor needs (``.run/supervisor.json``): the sandbox's command line, its
    bounds and the words for each one it may have to enforce."""
    from django.conf import settings

    bounds = spec.bounds
    run_as = spec.run_as or RunAs(RunAs.TRUSTED)
    rlimits = {"FSIZE": bounds.disk_bytes, "CORE": 0}
    if run_as.switches:
        # Per account on the host, across its cases (the cgroup bounds each case): a ceiling on
        # what a user's many cases fork together. Never on the service's own account.
        rlimits["NPROC"] = settings.GRIDGATE_CASE_NPROC
    return {
        "argv": argv,
        "cgroup": cgroup,
        "rlimits": rlimits,
        "wall_seconds": wall,
        "disk_bytes": bounds.disk_bytes,
        "disk_interval": settings.GRIDGATE_CASE_DISK_CHECK_SECONDS,
        "grace": settings.GRIDGATE_CASE_CANCEL_GRACE_SECONDS,
        "network": "slirp" if run_as.network and shutil.which("bwrap") else "none",
        "slirp4netns": shutil.which("slirp4netns") or "slirp4netns",
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


class LocalBackend(ExecutionBackend):
    name = "local"
    kinds = ("local",)
    runs_as_user = True
    host_bound = True  # liveness is read from this host's /proc: only this host polls or cancels

    def find(self, spec: SubmitSpec) -> str | None:
        pid_file = run_dir(spec.workspace) / "pid"
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return f"local:{pid}"

    def submit(self, spec: SubmitSpec) -> str:
        from django.conf import settings

        if not spec.command.strip():
            raise BackendError("the case has no command to run")
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
            for name in ("exit_status", "cancelled", "stdout", "stderr", "pid", "limit", "results_fetched"):
                (rdir / name).unlink(missing_ok=True)
            work = files.prepare_run_dir(
                rdir,
                spec.inputs_dir,
                spec.shared_dir,
                run_as=spec.run_as,
                shared="mount" if shutil.which("bwrap") else "link",
            )
            command = rdir / "command.sh"
            _write_private(command, spec.command)
            if run_as.network:
                _write_private(rdir / "resolv.conf", SLIRP_DNS, mode=0o644)  # bound over /etc/resolv.conf
        except OSError as exc:
            raise BackendError(f"cannot prepare the working directory: {exc}") from None
        bounds = spec.bounds
        cgroup = None
        if os.geteuid() == 0 and settings.GRIDGATE_CASE_CGROUP != "off":
            try:
                cgroup = supervisor.create_cgroup(
                    settings.GRIDGATE_CASE_CGROUP,
                    f"case-{spec.case_id}",
                    memory_bytes=bounds.memory_bytes,
                    tasks=bounds.tasks,
                    cpu=bounds.cpu,
                )
            except supervisor.CgroupError as exc:
                raise BackendError(
                    f"the case's memory, task and CPU bounds cannot be set up: {exc} (docs/operations.md, "
                    "'Bounds'; GRIDGATE_CASE_CGROUP=off runs cases without them)"
                ) from None
        # R-BACK-1: never the worker's environment (tokens, SECRET_KEY, DATABASE_URL…).
        argv = sandbox_argv(spec, work, sandbox_environment(spec, work), command=command, bounds=bounds)
        config = supervisor_config(spec, argv, cgroup, wall_seconds(spec))
        _write_private(rdir / "supervisor.json", json.dumps(config))
        # Double fork: the intermediate shell exits at once (reaped here), and setsid makes the
        # supervisor a session leader of its own, reparented to init. The web or worker process
        # that launched the case is never its parent, so it leaves no zombie there and a worker
        # restart or a SIGTERM to the worker's group does not reach it.
        try:
            proc = subprocess.run(
                ["/bin/sh", "-c", 'setsid "$@" </dev/null >/dev/null 2>&1 & echo $!', "gridgate-launch"]
                + [sys.executable, "-I", "-S", str(SUPERVISOR), str(rdir)],
                capture_output=True,
                text=True,
                timeout=30,
                env={"PATH": files.DEFAULT_PATH},
                check=True,
            )
            pid = int(proc.stdout.strip())
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            raise BackendError(f"cannot start the command: {exc}") from None
        (rdir / "pid").write_text(str(pid))
        return f"local:{pid}"

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
            bound = _read_limit(rdir)
            if bound:
                status, message = BackendStatus.FAILED, bound
            elif code == "0":
                status, message = BackendStatus.SUCCEEDED, ""
            elif code == XFSZ_STATUS:
                status, message = (
                    BackendStatus.FAILED,
                    ("the command was stopped (SIGXFSZ): a file, or its output, reached the class's storage limit"),
                )
            else:
                status, message = BackendStatus.FAILED, f"the command exited with status {code}"
        elif _is_ours(pid, rdir):
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
        return BackendState(
            status=status,
            progress=None,
            execution_time=execution_time,
            cores=cores,
            message=message,
        )

    def sync(self, job: JobRef, globs: list[str]) -> None:
        files.sync_live(run_dir(job.workspace) / "work", job.workspace / "live", globs)

    def fetch_final(self, job: JobRef) -> None:
        files.fetch_results(run_dir(job.workspace), job.workspace / "results", max_bytes=job.max_result_bytes)

    def cancel(self, job: JobRef) -> None:
        """R-CASE-8: stop the whole tree. A run directory that vanished is "already gone": the
        tree is still stopped if it runs, and the cancel succeeds (never a FileNotFoundError)."""
        from django.conf import settings

        rdir = run_dir(job.workspace)
        pid = self._pid(job)
        if (rdir / "exit_status").exists():
            raise AlreadyFinished("the command had already finished")
        try:
            (rdir / "cancelled").write_text("cancelled\n")
        except FileNotFoundError:
            pass  # the run directory is gone; whatever still runs under this pid is stopped below
        if not _is_ours(pid, rdir):
            return  # already gone
        try:
            os.kill(pid, signal.SIGUSR1)  # the supervisor stops the command: SIGTERM, grace, SIGKILL
        except ProcessLookupError:
            return
        except PermissionError as exc:
            raise BackendError(f"cannot stop process {pid}: {exc}") from None
        deadline = time.monotonic() + settings.GRIDGATE_CASE_CANCEL_GRACE_SECONDS + 10
        while time.monotonic() < deadline and _is_ours(pid, rdir):
            time.sleep(0.05)
        # A supervisor that did not stop in time (or a run started by an older version): SIGKILL
        # the group. bwrap dying takes its whole pid namespace with it, so a process that trapped
        # SIGTERM or left the group ends too.
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and _group_alive(pid):
            time.sleep(0.05)

    def launch_options(self, pool) -> LaunchOptions:
        """The wall time in minutes (issue 36); its range and default are the class's
        (:meth:`pin_class_overrides`)."""
        return LaunchOptions(options=[_time_option(1, 7 * 24 * 60, None)])

    def pin_class_overrides(self, answer: LaunchOptions, resource_class) -> LaunchOptions:
        options = [
            _time_option(1, max(1, resource_class.max_wall_time // 60), max(1, resource_class.wall_time // 60))
            if option.key == "time"
            else option
            for option in answer.options
        ]
        return LaunchOptions(options=options, degraded=answer.degraded, message=answer.message)

    def purge(self, job: JobRef) -> None:
        """A cgroup its supervisor could not remove (it was killed) goes with the case."""
        from django.conf import settings

        if os.geteuid() == 0 and settings.GRIDGATE_CASE_CGROUP != "off":
            supervisor.remove_cgroup(settings.GRIDGATE_CASE_CGROUP, f"case-{job.case_id}")

    def doctor(self, pool=None) -> list[Check]:
        from django.conf import settings

        checks = [Check("shell", os.access("/bin/sh", os.X_OK), "/bin/sh runs the case commands")]
        bwrap = shutil.which("bwrap")
        trusted = pool is not None and pool.trusted  # runs as the service: no switch, sandbox optional
        checks.append(
            Check(
                "sandbox",
                bool(bwrap) or trusted,
                f"{bwrap} isolates each case (R-CASE-8)"
                if bwrap
                else "bwrap is missing: apt install bubblewrap (only trusted pools run without it)",
            )
        )
        checks.append(
            Check(
                "run as the owner",
                os.geteuid() == 0 or trusted,
                "the worker runs as root and switches to each case's account"
                if os.geteuid() == 0
                else "the worker is not root: only trusted pools can run cases (docs/operations.md)",
            )
        )
        checks.append(_bounds_check(trusted))
        network = pool is not None and pool.network
        slirp = shutil.which("slirp4netns")
        checks.append(
            Check(
                "network",
                bool(slirp) or not network,
                f"{slirp} routes the cases of pools that allow the network, never to the host's loopback"
                if slirp
                else "slirp4netns is missing: cases of pools that allow the network cannot start "
                "(apt install slirp4netns); other pools' cases have no network",
            )
        )
        root = Path(settings.GRIDGATE_CASES_ROOT)
        try:
            ensure_cases_root()
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
