"""The process side of a local case: its bounds, its network, and how it ended (issue 36).

The local backend starts this file as a detached interpreter of its own (``python -I -S
supervisor.py <run dir>``, standard library only, nothing of the project imported) under the
service's account (root on a shared host). It runs the sandbox's command line from
``supervisor.json`` and stays beside it until it ends:

- **cgroup**: the sandbox enters the case's cgroup (created with its memory, task and CPU bounds
  by the backend at submit, :func:`create_cgroup`) before bwrap starts, so everything the command
  forks is counted and bounded; an out-of-memory kill or a refused fork anywhere in it ends the
  whole case (as Slurm records OUT_OF_MEMORY for a job with any OOM kill), and the cgroup is
  removed once it is empty;
- **rlimits**: ``RLIMIT_FSIZE`` (no single file, stdout included, past the case's disk bound),
  ``RLIMIT_NPROC`` (a ceiling per account on the host, across its cases), no core dumps;
- **wall time** and **disk**: past its wall time, or once its working directory and output hold
  more than its disk bound (measured every few seconds), the command is stopped;
- **network**: for a pool that allows it, slirp4netns gives the sandbox's own network namespace
  a user-mode route out with ``--disable-host-loopback``: the host's loopback services
  (PostgreSQL, Redis, the web port) are never reachable from a case;
- **the command** is handed to the sandbox as fd 3, never on a command line (``ps`` shows every
  command line to every account on the host).

Files of the run directory (``.run/``, the service's, 0700): ``supervisor.json`` and
``command.sh`` (written by the backend), ``stdout``/``stderr``, ``limit`` (written when a bound
stopped the case: ``{"reason", "message"}``) and ``exit_status`` (written last, atomically).
``SIGUSR1`` asks the supervisor to stop the command now (a cancel): SIGTERM to its process group
and cgroup (the supervisor and bwrap ignore it), SIGKILL after the grace period.
"""

from __future__ import annotations

import json
import math
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

#: fds the sandbox's command line refers to: the command, and bwrap's --info-fd/--block-fd
COMMAND_FD, INFO_FD, BLOCK_FD = 3, 4, 5
CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000
#: how long slirp4netns may take to plumb the sandbox's network before the case fails
NETWORK_SETUP_SECONDS = 20


class CgroupError(Exception):
    """The case's cgroup cannot be made: the message says what to set up (docs/operations.md)."""


# -- cgroups (v2 unified, or v1 per controller) ---------------------------------------------------
def _mounts() -> tuple[str | None, dict[str, str]]:
    """The cgroup2 mount point (if any) and the v1 mount point of each controller."""
    unified, v1 = None, {}
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            head, _, tail = line.partition(" - ")
            fields, rest = head.split(), tail.split()
            if len(fields) < 5 or len(rest) < 3:
                continue
            if rest[0] == "cgroup2" and unified is None:
                unified = fields[4]
            elif rest[0] == "cgroup":
                for option in rest[2].split(","):
                    if option in CONTROLLERS:
                        v1.setdefault(option, fields[4])
    return unified, v1


def _v2_root(unified: str | None) -> str | None:
    """The unified hierarchy, when it carries the memory and pids controllers."""
    if unified is None:
        return None
    try:
        available = Path(unified, "cgroup.controllers").read_text().split()
    except OSError:
        return None
    return unified if {"memory", "pids"} <= set(available) else None


def _write(path: Path, value) -> None:
    path.write_text(f"{value}\n")


def create_cgroup(base: str, name: str, *, memory_bytes: int, tasks: int, cpu: float) -> dict:
    """Create (or reuse, on a retried submit) the case's cgroup with its bounds; returns what
    :class:`Cgroup` needs: ``{"version", "dirs"}``. ``base`` is relative to the cgroup mount
    (``gridgate``: a hierarchy of its own at the top, as docker's cgroupfs driver makes)."""
    unified, v1 = _mounts()
    root = _v2_root(unified)
    quota = max(1000, math.ceil(cpu * CPU_PERIOD_US))
    try:
        if root is not None:
            parent = Path(root)
            for part in Path(base).parts:
                # Controllers reach a child only when every ancestor hands them down.
                _enable_v2_controllers(parent)
                parent = parent / part
                parent.mkdir(exist_ok=True)
            _enable_v2_controllers(parent)
            leaf = parent / name
            leaf.mkdir(exist_ok=True)
            _write(leaf / "memory.max", memory_bytes)
            if (leaf / "memory.swap.max").exists():
                _write(leaf / "memory.swap.max", 0)
            _write(leaf / "pids.max", tasks)
            if (leaf / "cpu.max").exists():
                _write(leaf / "cpu.max", f"{quota} {CPU_PERIOD_US}")
            return {"version": 2, "dirs": {"unified": str(leaf)}}
        missing = [c for c in ("memory", "pids") if c not in v1]
        if missing:
            raise CgroupError(
                f"no cgroup hierarchy with the {' and '.join(missing)} controller is mounted on this host"
            )
        dirs = {}
        for controller in CONTROLLERS:
            if controller in v1:
                leaf = Path(v1[controller], base, name)
                leaf.mkdir(parents=True, exist_ok=True)
                dirs[controller] = leaf
        memory = dirs["memory"]
        _write(memory / "memory.limit_in_bytes", memory_bytes)
        if (memory / "memory.memsw.limit_in_bytes").exists():
            _write(memory / "memory.memsw.limit_in_bytes", memory_bytes)  # no escape into swap
        _write(dirs["pids"] / "pids.max", tasks)
        if "cpu" in dirs:
            _write(dirs["cpu"] / "cpu.cfs_period_us", CPU_PERIOD_US)
            _write(dirs["cpu"] / "cpu.cfs_quota_us", quota)
        return {"version": 1, "dirs": {controller: str(path) for controller, path in dirs.items()}}
    except OSError as exc:
        raise CgroupError(f"cannot create the case's cgroup under {base!r}: {exc.strerror or exc}") from None


def remove_cgroup(base: str, name: str) -> None:
    """Remove a case's cgroup left behind (its supervisor was killed); nothing if there is none."""
    unified, v1 = _mounts()
    root = _v2_root(unified)
    mounts = [root] if root is not None else [v1[c] for c in CONTROLLERS if c in v1]
    dirs = {str(i): str(Path(mount, base, name)) for i, mount in enumerate(mounts) if Path(mount, base, name).is_dir()}
    if dirs:
        Cgroup(2 if root is not None else 1, dirs).remove()


def _enable_v2_controllers(directory: Path) -> None:
    available = set((directory / "cgroup.controllers").read_text().split())
    enabled = set((directory / "cgroup.subtree_control").read_text().split())
    wanted = [c for c in CONTROLLERS if c in available and c not in enabled]
    if wanted:
        try:
            _write(directory / "cgroup.subtree_control", " ".join(f"+{c}" for c in wanted))
        except OSError as exc:
            raise CgroupError(
                f"cannot enable {', '.join(wanted)} below {directory} ({exc.strerror}): with systemd, run "
                "the worker with Delegate=yes and point GRIDGATE_CASE_CGROUP below its own cgroup"
            ) from None


class Cgroup:
    """One case's cgroup as the supervisor uses it: enter, read what the kernel refused or
    killed, stop everything in it, remove it."""

    def __init__(self, version: int, dirs: dict[str, str]):
        self.version = version
        self.by_controller = {controller: Path(path) for controller, path in dirs.items()}
        self.dirs = list(self.by_controller.values())

    def _file(self, controller: str, name: str) -> Path:
        return self.by_controller.get(controller, self.dirs[0]) / name

    def enter(self, pid: int) -> None:
        for directory in self.dirs:
            _write(directory / "cgroup.procs", pid)

    def _counter(self, path: Path, key: str) -> int:
        try:
            for line in path.read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def oom_kills(self) -> int:
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        return self._counter(self._file("memory", name), "oom_kill")

    def forks_refused(self) -> int:
        return self._counter(self._file("pids", "pids.events"), "max")

    def pids(self) -> set[int]:
        out = set()
        for directory in self.dirs:
            try:
                out.update(int(p) for p in (directory / "cgroup.procs").read_text().split())
            except (OSError, ValueError):
                pass
        return out

    def signal(self, signum: int) -> None:
        if signum == signal.SIGKILL and self.version == 2 and (self.dirs[0] / "cgroup.kill").exists():
            try:
                _write(self.dirs[0] / "cgroup.kill", 1)
                return
            except OSError:
                pass
        for pid in self.pids():
            try:
                os.kill(pid, signum)
            except OSError:
                pass

    def remove(self) -> None:
        """Kill what is left and remove the directories (a cgroup with a process cannot go)."""
        for _ in range(50):
            if not self.pids():
                break
            self.signal(signal.SIGKILL)
            time.sleep(0.1)
        for directory in self.dirs:
            for _ in range(20):
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


# -- watching -------------------------------------------------------------------------------------
def disk_usage(paths) -> int:
    """Bytes the paths hold on disk (allocated blocks: a sparse file costs what it stores),
    directories included; symlinks are never followed."""
    total = 0
    stack = [str(p) for p in paths]
    while stack:
        path = stack.pop()
        try:
            info = os.lstat(path)
        except OSError:
            continue
        total += info.st_blocks * 512
        if os.path.isdir(path) and not os.path.islink(path):
            try:
                with os.scandir(path) as entries:
                    stack.extend(entry.path for entry in entries)
            except OSError:
                pass
    return total


class Supervisor:
    def __init__(self, rdir: Path):
        self.rdir = rdir
        self.config = json.loads((rdir / "supervisor.json").read_text())
        cgroup = self.config.get("cgroup")
        self.cgroup = Cgroup(cgroup["version"], cgroup["dirs"]) if cgroup else None
        self.stop_requested = False
        self.child = 0
        self.slirp = None

    # The command's own fds in the sandbox: 0 from /dev/null, 1 and 2 into the run directory.
    def _open(self) -> dict[int, int]:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        fds = {
            0: os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC),
            1: os.open(self.rdir / "stdout", flags, 0o600),
            2: os.open(self.rdir / "stderr", flags, 0o600),
            COMMAND_FD: os.open(self.rdir / "command.sh", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC),
        }
        return fds

    def start(self) -> None:
        fds = self._open()
        network = self.config.get("network") == "slirp"
        if network:
            info_r, fds[INFO_FD] = os.pipe2(os.O_CLOEXEC)
            fds[BLOCK_FD], block_w = os.pipe2(os.O_CLOEXEC)
        # Above every target number first, so no dup2 below overwrites a source not yet moved.
        high = {target: _dup_high(fd) for target, fd in fds.items()}
        for fd in fds.values():
            os.close(fd)
        pid = os.fork()
        if pid == 0:  # the sandbox's process
            try:
                if self.cgroup is not None:
                    self.cgroup.enter(os.getpid())
                import resource

                for name, value in self.config.get("rlimits", {}).items():
                    resource.setrlimit(getattr(resource, f"RLIMIT_{name}"), (value, value))
                signal.signal(signal.SIGUSR1, signal.SIG_DFL)
                for target, fd in high.items():
                    os.dup2(fd, target)  # dup2 clears close-on-exec on the copy
                os.closerange(max(high) + 1, os.sysconf("SC_OPEN_MAX"))
                os.closerange(max(fds) + 1, min(high.values()))
                argv = self.config["argv"]
                os.execv(argv[0], argv)  # noqa: S606 - the sandbox's command line, no shell
            finally:
                os._exit(127)
        self.child = pid
        for fd in high.values():
            os.close(fd)
        if network:
            self._plumb_network(info_r, block_w)

    def _plumb_network(self, info_r: int, block_w: int) -> None:
        """Give the sandbox's network namespace its route out (never the host's loopback), then
        let bwrap go on (it waits on --block-fd until then)."""
        data = b""
        deadline = time.monotonic() + NETWORK_SETUP_SECONDS
        child_pid = None
        while child_pid is None and time.monotonic() < deadline:
            ready, _, _ = select.select([info_r], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            chunk = os.read(info_r, 4096)
            if not chunk:
                break
            data += chunk
            try:
                child_pid = int(json.loads(data)["child-pid"])
            except (ValueError, KeyError):
                continue
        os.close(info_r)
        if child_pid is None:
            os.close(block_w)
            return  # bwrap failed before creating the sandbox: its exit status says so
        ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
        self.exit_r, self.exit_w = os.pipe2(os.O_CLOEXEC)
        try:
            self.slirp = subprocess.Popen(
                [
                    self.config.get("slirp4netns", "slirp4netns"),
                    "--configure",
                    "--mtu=65520",
                    "--disable-host-loopback",
                    f"--ready-fd={ready_w}",
                    f"--exit-fd={self.exit_r}",
                    str(child_pid),
                    "tap0",
                ],
                pass_fds=(ready_w, self.exit_r),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        except OSError:
            self.slirp = None
        os.close(ready_w)
        ok = False
        if self.slirp is not None:
            ready, _, _ = select.select([ready_r], [], [], NETWORK_SETUP_SECONDS)
            ok = bool(ready) and os.read(ready_r, 1) == b"1"
        os.close(ready_r)
        if not ok:
            self._limit("network", self.config["messages"]["network"])
            self.stop_requested = True
        else:
            os.write(block_w, b"1")
        os.close(block_w)

    def _limit(self, reason: str, message: str) -> None:
        _write_atomically(self.rdir / "limit", json.dumps({"reason": reason, "message": message}))
        self.reason = reason

    def _exited(self):
        pid, status = os.waitpid(self.child, os.WNOHANG)
        return os.waitstatus_to_exitcode(status) if pid else None

    def stop(self) -> int:
        """SIGTERM to the command (its process group and cgroup), SIGKILL after the grace."""
        try:
            os.killpg(os.getpgid(0), signal.SIGTERM)  # we and bwrap ignore it; the command does not
        except OSError:
            pass
        if self.cgroup is not None:
            self.cgroup.signal(signal.SIGTERM)
        deadline = time.monotonic() + float(self.config.get("grace", 10))
        while time.monotonic() < deadline:
            code = self._exited()
            if code is not None:
                return code
            time.sleep(0.05)
        try:
            os.kill(self.child, signal.SIGKILL)  # bwrap: its pid namespace goes with it
        except OSError:
            pass
        if self.cgroup is not None:
            self.cgroup.signal(signal.SIGKILL)
        return os.waitstatus_to_exitcode(os.waitpid(self.child, 0)[1])

    def watch(self) -> int:
        """Wait for the command, stopping it at the first bound it crosses."""
        messages = self.config["messages"]
        started = time.monotonic()
        wall = float(self.config.get("wall_seconds") or math.inf)
        disk = self.config.get("disk_bytes")
        disk_every = float(self.config.get("disk_interval", 5))
        disk_paths = [self.rdir / "work", self.rdir / "stdout", self.rdir / "stderr"]
        next_disk = started + disk_every
        self.reason = None
        while True:
            code = self._exited()
            if code is not None:
                break
            now = time.monotonic()
            if self.stop_requested:
                return self.stop()  # a cancel (or a failed network set-up): no bound to record
            if now - started >= wall:
                self._limit("wall_time", messages["wall_time"])
            elif self.cgroup is not None and self.cgroup.oom_kills():
                self._limit("memory", messages["memory"])
            elif self.cgroup is not None and self.cgroup.forks_refused():
                self._limit("tasks", messages["tasks"])
            elif disk and now >= next_disk:
                next_disk = now + disk_every
                if disk_usage(disk_paths) > disk:
                    self._limit("disk", messages["disk"])
            if self.reason:
                return self.stop()
            time.sleep(0.2)
        # Ended on its own: an OOM kill or a refused fork along the way still fails the case,
        # whatever the shell's last command returned.
        if self.cgroup is not None and self.cgroup.oom_kills():
            self._limit("memory", messages["memory"])
        elif self.cgroup is not None and self.cgroup.forks_refused():
            self._limit("tasks", messages["tasks"])
        return code

    def finish(self, code: int) -> None:
        if self.slirp is not None:
            os.close(self.exit_w)  # slirp4netns ends when its exit fd closes
            try:
                self.slirp.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.slirp.kill()
        if self.cgroup is not None:
            self.cgroup.remove()
        # As a shell reports a signal: 128 + its number.
        _write_atomically(self.rdir / "exit_status", str(code if code >= 0 else 128 - code))


def _dup_high(fd: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)


def _write_atomically(path: Path, text: str) -> None:
    part = path.with_name(path.name + ".part")
    part.write_text(text + "\n")
    os.replace(part, path)


def main(argv: list[str]) -> int:
    rdir = Path(argv[1])
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a cancel's SIGTERM is for the command
    supervisor = Supervisor(rdir)

    def stop_now(signum, frame):
        supervisor.stop_requested = True

    signal.signal(signal.SIGUSR1, stop_now)
    try:
        supervisor.start()
        code = supervisor.watch()
    except Exception as exc:  # nothing started, or the watch itself broke: the case fails saying so
        failure = {"reason": "supervisor", "message": f"the case could not run: {exc}"}
        _write_atomically(rdir / "limit", json.dumps(failure))
        code = 1
        if supervisor.child:
            try:
                os.kill(supervisor.child, signal.SIGKILL)
                os.waitpid(supervisor.child, 0)
            except OSError:
                pass
    supervisor.finish(code)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
