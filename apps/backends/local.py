"""The local backend: a real process on the worker host, sandboxed, that outlives the worker.

R-CASE-8 — the command reaches nothing but its own working directory:

- It runs as the case's :class:`~apps.backends.base.RunAs` account (the owner's linked account or
  the pool's sandbox account; a trusted demo pool: the service's own), inside bubblewrap
  (``bwrap``) with its own pid namespace and ``/proc`` (no other process is visible, so no
  ``/proc/<worker>/environ``), a cleared environment plus the case's variables, read-only system
  directories, an empty ``/tmp`` and, of the cases root, only its own ``.run/work`` (owned by
  its account, mode 0700). ``network=False`` on the pool adds ``--unshare-net``. Root starts
  bwrap with CAP_SETUID/CAP_SETGID kept for ``setpriv``, which switches to the account and drops
  every capability before the command starts.
- A supervisor shell (the service's account, in its own session, detached from the process that
  launched it: a web worker never parents it, so it leaves no zombie there) starts the sandbox
  with the command's output redirected into ``.run/stdout``/``stderr`` and writes the exit
  status to ``.run/exit_status`` when it ends. ``.run/`` is the service's (0700): the command
  can neither read nor forge its control files. Nothing lives only in the memory of the process
  that started it, so a restarted worker reads the outcome from disk.
- Cancel: SIGTERM to the supervisor's process group (the supervisor and bwrap ignore it, the
  command gets it), then SIGKILL after ``GRIDGATE_CASE_CANCEL_GRACE_SECONDS``; killing bwrap
  tears down the whole pid namespace (``--die-with-parent``), so a command that trapped SIGTERM
  or left the process group still ends.

The remote id is ``local:<supervisor pid>``. A pid is trusted only while its command line names
this case's run directory (a recycled pid is never signalled). Liveness is checked on this host
only, so the backend is ``host_bound``: a case is pinned to the worker host that starts its
process (``Case.run_host``) and only that host's workers poll, sync or cancel it (issue 17).
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
    RunAs,
    SubmitSpec,
)

SUPERVISOR = """#!/bin/sh
# Written by Gridgate's local backend; runs as the service, in its own session. SIGTERM is for
# the command (a cancel), not for this shell or bwrap: both ignore it and the command gets the
# default action back (env --default-signal) before it starts.
trap '' TERM
rdir=$1; shift
"$@" >"$rdir/stdout" 2>"$rdir/stderr" </dev/null
status=$?
echo "$status" >"$rdir/exit_status.part" && mv "$rdir/exit_status.part" "$rdir/exit_status"
"""

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


def _bind_system(args: list[str]) -> None:
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    args += ["--perms", "0755", "--dir", "/etc"]  # bwrap makes missing parents 0700: the account could not enter
    for name in ETC_ENTRIES:
        args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]


def _dirs(args: list[str], path: Path, below: Path | None = None) -> None:
    """Create ``path``'s ancestors (below ``below``) 0755 in the sandbox, so the account can
    reach its working directory by its absolute path too."""
    for parent in reversed(path.parents):
        if parent == Path("/") or (below is not None and not parent.is_relative_to(below)) or parent == below:
            continue
        args += ["--perms", "0755", "--dir", str(parent)]


def sandbox_argv(spec: SubmitSpec, work: Path, env: dict[str, str]) -> list[str]:
    """The command line that runs ``spec.command`` in its sandbox (R-CASE-8)."""
    from django.conf import settings

    run_as = spec.run_as or RunAs(RunAs.TRUSTED)
    inner = ["env", "--default-signal=TERM", "/bin/sh", "-c", spec.command]
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        if run_as.switches:
            raise BackendError(
                "bubblewrap (bwrap) is not installed: cases cannot run in their sandbox (apt install bubblewrap)"
            )
        # Trusted single-user pool without bubblewrap (a developer's laptop): the service's own
        # account, a cleared environment, no sandbox. The pool says so (docs/operations.md).
        variables = [f"{name}={value}" for name, value in sorted(env.items())]
        return ["env", "-i", *variables, "/bin/sh", "-c", 'cd "$0" && exec "$@"', str(work), *inner]
    args = [bwrap, "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent"]
    if not run_as.network:
        args.append("--unshare-net")
    _bind_system(args)
    args += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp"]  # noqa: S108 - private, empty
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
        if not spec.command.strip():
            raise BackendError("the case has no command to run")
        rdir = run_dir(spec.workspace)
        try:
            rdir.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(rdir, 0o700)  # the control files are the service's alone (R-CASE-8)
            for name in ("exit_status", "cancelled", "stdout", "stderr", "pid"):
                (rdir / name).unlink(missing_ok=True)
            work = files.prepare_run_dir(
                rdir,
                spec.inputs_dir,
                spec.shared_dir,
                run_as=spec.run_as,
                shared="mount" if shutil.which("bwrap") else "link",
            )
            supervisor = rdir / "supervisor.sh"
            supervisor.write_text(SUPERVISOR)
        except OSError as exc:
            raise BackendError(f"cannot prepare the working directory: {exc}") from None
        # R-BACK-1: never the worker's environment (tokens, SECRET_KEY, DATABASE_URL…).
        argv = sandbox_argv(spec, work, sandbox_environment(spec, work))
        # Double fork: the intermediate shell exits at once (reaped here), and setsid makes the
        # supervisor a session leader of its own, reparented to init. The web or worker process
        # that launched the case is never its parent, so it leaves no zombie there and a worker
        # restart or a SIGTERM to the worker's group does not reach it.
        try:
            proc = subprocess.run(
                ["/bin/sh", "-c", 'setsid "$@" </dev/null >/dev/null 2>&1 & echo $!', "gridgate-launch"]
                + ["/bin/sh", str(supervisor), str(rdir), *argv],
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
            if code == "0":
                status, message = BackendStatus.SUCCEEDED, ""
            else:
                status, message = BackendStatus.FAILED, f"the command exited with status {code}"
        elif _is_ours(pid, rdir):
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
            os.killpg(pid, signal.SIGTERM)  # the command's processes; supervisor and bwrap ignore it
        except ProcessLookupError:
            return
        except PermissionError as exc:
            raise BackendError(f"cannot stop process group {pid}: {exc}") from None
        deadline = time.monotonic() + settings.GRIDGATE_CASE_CANCEL_GRACE_SECONDS
        while time.monotonic() < deadline and _group_alive(pid):
            time.sleep(0.05)
        # Past the grace period: SIGKILL the group. bwrap dying takes its whole pid namespace with
        # it, so a process that trapped SIGTERM or left the group ends too.
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and _group_alive(pid):
            time.sleep(0.05)

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
