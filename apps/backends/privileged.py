"""The one part of Gridgate that runs as root: the account switch, and what must be done with
another account's files (R-CASE-8).

The web and worker processes run as the service's own unprivileged account. For the few things
only root can do they run this file, through one sudo rule (``GRIDGATE_PRIVILEGED_COMMAND``,
docs/deployment.md), as a fresh interpreter that imports nothing of the project and nothing
outside the standard library (``python3 -I -S``): no Django, no pickle, no SDK runs as root. A
service that itself runs as root (a single-host test set-up) calls it the same way without
sudo. Each call is ``<verb>`` with one JSON request on stdin; the answer is one JSON object on
stdout (exit status 2 and ``{"error"}`` for a refusal). The verbs are the functions in
:data:`VERBS` (docs/operations.md, "What the service runs as", has the table).

What it trusts under sudo: nothing the caller says about where things are or who may run.
Every request is checked against :data:`CONFIG_FILE` (root's, writable by nobody else); every
path is reached from a configured root one component at a time without following a symlink;
the command line it runs is built here from those checked values, never taken from the caller.
Without sudo the configuration comes with the request (the caller is root already, or runs
trusted cases as itself and can switch to nobody).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import fnmatch
import grp
import hashlib
import ipaddress
import json
import math
import os
import pwd
import re
import resource
import select
import shutil
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

#: a request names the protocol it was written for: a helper installed from an older or newer
#: checkout refuses it (reinstall it with the checkout, docs/deployment.md)
PROTOCOL = 2
CONFIG_FILE = "/etc/gridgate/privileged.json"
CASE_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
#: the largest command, environment and job script a request may carry
MAX_TEXT = 1 << 20
#: fds the sandbox's command line refers to (dup'ed there in the sandbox's process)
COMMAND_FD, INFO_FD, BLOCK_FD, RESOLV_FD, WORK_FD, SHARED_FD, SECCOMP_FD = 3, 4, 5, 6, 7, 8, 9
CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000
#: how long slirp4netns may take to plumb a sandbox's network before the case fails
NETWORK_SETUP_SECONDS = 20
COMMAND_IN_SANDBOX = "/gridgate/command.sh"
#: slirp4netns's built-in DNS forwarder: the only name server of a case with the network
SLIRP_RESOLV = b"nameserver 10.0.2.3\n"
#: /etc entries a shell command needs (users, libraries, locale, alternatives such as awk, TLS
#: roots, name resolution); the rest of /etc (a deployment's env files) stays out of sight.
ETC_ENTRIES = (
    "passwd", "group", "nsswitch.conf", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "alternatives",
    "ssl", "ca-certificates", "resolv.conf", "hosts", "host.conf",
)  # fmt: skip
#: top-level system directories, bound read-only (or recreated as the symlinks they are on
#: merged-/usr systems). Not /opt, /srv or /home: deployments live there.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64")
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
#: top-level names of a working directory that are never results: the campaign's shared inputs
#: (never downloaded back) and Gridgate's own control files
NOT_RESULTS = ("shared", ".gridgate")
PROGRESS_FILE = ".gridgate/progress"
FORBIDDEN_GROUPS = ("root", "sudo", "wheel", "adm")
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Refused(Exception):
    """The request is not one this helper carries out; the message says why."""


class TooLarge(Refused):
    """The results hold more than the case may bring back."""


# -- configuration ---------------------------------------------------------------------------------
@dataclass
class Config:
    """Where things are and who may run (from :data:`CONFIG_FILE` under sudo)."""

    cases_root: str
    service_uid: int
    service_gid: int
    min_uid: int = 1000
    sandbox_accounts: list[str] = field(default_factory=list)
    working_roots: list[str] = field(default_factory=list)
    cgroup: str = "gridgate"
    nproc: int = 4096
    #: the Slurm client's configuration file, when not the default (SLURM_CONF)
    slurm_conf: str | None = None
    #: when set, cases run only as members of one of these groups
    allowed_groups: list[str] = field(default_factory=list)
    #: never as a member of these (administrators: a case would run with their groups)
    forbidden_groups: list[str] = field(default_factory=lambda: list(FORBIDDEN_GROUPS))

    @classmethod
    def from_dict(cls, data) -> Config:
        if not isinstance(data, dict):
            raise Refused("the configuration is not a JSON object")
        try:
            config = cls(
                cases_root=str(data["cases_root"]),
                service_uid=int(data["service_uid"]),
                service_gid=int(data["service_gid"]),
                min_uid=int(data.get("min_uid", 1000)),
                sandbox_accounts=[str(name) for name in data.get("sandbox_accounts", [])],
                working_roots=[str(root) for root in data.get("working_roots", [])],
                cgroup=str(data.get("cgroup", "gridgate")),
                nproc=int(data.get("nproc", 4096)),
                slurm_conf=str(data["slurm_conf"]) if data.get("slurm_conf") else None,
                allowed_groups=[str(name) for name in data.get("allowed_groups", [])],
                forbidden_groups=[str(name) for name in data.get("forbidden_groups", FORBIDDEN_GROUPS)],
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise Refused(f"the configuration is incomplete or malformed ({exc})") from None
        for root in [config.cases_root, *config.working_roots, *([config.slurm_conf] if config.slurm_conf else [])]:
            if not root.startswith("/"):
                raise Refused(f"configured root {root!r} is not an absolute path")
        return config


def via_sudo() -> bool:
    """Run as root on behalf of another account: by sudo (which sets SUDO_UID itself; the caller
    cannot choose it without a SETENV rule, which the documented rule does not give), or by any
    other way up (doas, pkexec, a setuid wrapper) that leaves a sign: a real uid that is not root,
    or a parent that is not root's. Then only :data:`CONFIG_FILE` counts."""
    if os.geteuid() != 0:
        return False
    if os.getuid() != 0 or os.environ.get("SUDO_UID", "0") != "0":
        return True
    if any(os.environ.get(name) for name in ("DOAS_USER", "PKEXEC_UID")):
        return True
    try:
        status = Path(f"/proc/{os.getppid()}/status").read_text()
        real = next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:"))
    except (OSError, StopIteration, IndexError):
        return True  # who asked cannot be told: take the cautious reading
    return real != "0"


def load_config(request: dict) -> Config:
    if not via_sudo():
        return Config.from_dict(request.get("config"))
    try:
        fd = os.open(CONFIG_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise Refused(f"cannot read {CONFIG_FILE}: {exc.strerror} (docs/deployment.md)") from None
    with os.fdopen(fd) as handle:
        info = os.fstat(handle.fileno())
        if info.st_uid != 0 or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise Refused(f"{CONFIG_FILE} must be root's and writable by nobody else")
        try:
            config = Config.from_dict(json.load(handle))
        except ValueError as exc:
            raise Refused(f"{CONFIG_FILE} is not valid JSON ({exc})") from None
    if int(os.environ["SUDO_UID"]) != config.service_uid:
        raise Refused("only the service account named in the configuration may call this helper")
    return config


# -- checked values ------------------------------------------------------------------------------
def case_id(request: dict) -> str:
    value = request.get("case_id")
    if not isinstance(value, str) or not CASE_ID.fullmatch(value):
        raise Refused("case_id must be a case's UUID")
    return value


def account(config: Config, request: dict):
    """The passwd entry of the account the case runs as, or None for no switch (the service's
    own account: only when the helper itself is not root)."""
    wanted = request.get("account")
    if wanted is None:
        if os.geteuid() == 0:
            raise Refused("as root, a case always runs as an account of its own")
        return None
    try:
        entry = pwd.getpwuid(int(wanted["uid"]))
    except (KeyError, TypeError, ValueError):
        raise Refused(f"no account with uid {wanted!r} on this host") from None
    if entry.pw_uid == 0 or entry.pw_uid == config.service_uid:
        raise Refused("cases never run as root or as the service's own account")
    overflow = overflow_ids()
    if entry.pw_uid in overflow or entry.pw_gid in overflow:
        raise Refused(
            f"uid {entry.pw_uid} ({entry.pw_name}) is the kernel's overflow account (nobody): files no "
            "namespace or NFS export can map belong to it, so no case runs as it"
        )
    if entry.pw_uid < config.min_uid and entry.pw_name not in config.sandbox_accounts:
        raise Refused(
            f"uid {entry.pw_uid} ({entry.pw_name}) is a system account (below {config.min_uid}): "
            "cases run as users' own accounts or a named sandbox account"
        )
    groups = set()
    for gid in os.getgrouplist(entry.pw_name, entry.pw_gid):
        with contextlib.suppress(KeyError):
            groups.add(grp.getgrgid(gid).gr_name)
    if config.allowed_groups and not groups & set(config.allowed_groups):
        raise Refused(f"{entry.pw_name} is in none of the groups whose members cases may run as")
    admin = sorted(groups & set(config.forbidden_groups))
    if admin:
        raise Refused(f"{entry.pw_name} is an administrator (member of {', '.join(admin)})")
    if os.geteuid() != 0:
        raise Refused("switching to another account needs root (the helper is not run by sudo or as root)")
    return entry


#: where the kernel says which uid and gid stand for "unmapped" (65534 unless changed)
OVERFLOW_FILES = ("/proc/sys/kernel/overflowuid", "/proc/sys/kernel/overflowgid", "/proc/sys/fs/overflowuid")


def overflow_ids() -> set[int]:
    """The overflow uids and gids (``nobody``, 65534 by default), read from the kernel."""
    ids = {65534}
    for path in OVERFLOW_FILES:
        with contextlib.suppress(OSError, ValueError):
            ids.add(int(Path(path).read_text().strip()))
    return ids


def _positive_int(request: dict, key: str, maximum: int = 1 << 62, minimum: int = 1) -> int:
    value = request.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise Refused(f"{key} must be a whole number from {minimum} to {maximum}")
    return value


def _text(value, what: str) -> str:
    if not isinstance(value, str) or "\x00" in value or len(value) > MAX_TEXT:
        raise Refused(f"{what} must be text without NUL, at most {MAX_TEXT} characters")
    return value


# -- paths reached without following links ---------------------------------------------------------
#: the configured roots this request opened, by path: each is opened once per request (the
#: helper serves one request per process, :func:`main` closes them)
_ROOTS: dict[str, int] = {}


def root_fd(root: str) -> int:
    """The configured root ``root`` (the operator's path: it may be a symlink to a shared file
    system), opened on first use and the same descriptor for the rest of the request.

    The service owns what lies above the cases root in many set-ups (``/srv/gridgate/var``): it can
    rename the root away and put a link to a directory of root's in its place. Resolved once, the
    root cannot change under the request; resolved at each step, a swap between two steps would
    have root create a directory of the service's inside one of root's (doctor also fails while
    the root's parent is the service's to write)."""
    if root not in _ROOTS:
        _ROOTS[root] = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    return _ROOTS[root]


def close_roots() -> None:
    for fd in _ROOTS.values():
        os.close(fd)
    _ROOTS.clear()


def open_dir(root: str, *parts: str, create: bool = False, owner: tuple[int, int] | None = None) -> int:
    """An fd on ``root/parts…``: ``root`` is a configured root (:func:`root_fd`), each part below
    it is opened ``O_NOFOLLOW`` (and made 0700, handed to ``owner``, when ``create``)."""
    fd = os.dup(root_fd(root))
    try:
        for part in parts:
            if part in ("", ".", "..") or "/" in part or "\x00" in part:
                raise Refused(f"invalid path component {part!r}")
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o700, dir_fd=fd)
                    if owner is not None:
                        os.chown(part, *owner, dir_fd=fd, follow_symlinks=False)
            try:
                inner = os.open(part, _DIR, dir_fd=fd)
            except OSError as exc:
                problem = f"{part!r} under {root} is not a directory reached without a link ({exc.strerror})"
                raise Refused(problem) from None
            os.close(fd)
            fd = inner
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_regular(name, *, dir_fd: int | None = None) -> int | None:
    """An fd on ``name`` if it is a regular file with one name, reached without following a
    symlink, else None (a symlink, a hard link, a FIFO, a device, a directory, or nothing)."""
    try:
        fd = os.open(name, _READ, dir_fd=dir_fd)
    except OSError:
        return None
    info = os.fstat(fd)
    # A hard link is no symlink, but it can name a file its maker could not read (a root-only file
    # on the same file system where protected_hardlinks is off): never one.
    if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
        os.close(fd)
        return None
    os.set_blocking(fd, True)
    return fd


#: how deep a tree may nest before it is refused (the walks below hold one fd per level)
MAX_DEPTH = 256
_SUBDIR = _DIR | os.O_NONBLOCK


class TooDeep(Refused):
    """A tree nested deeper than :data:`MAX_DEPTH`."""


def walk(top_fd: int, skip_top: tuple[str, ...] = ()):
    """(relative directory, its fd, its file names) for each directory under ``top_fd``, depth
    first, its own first. Every directory is opened relative to its parent's fd with
    ``O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK``, so an entry swapped for a link, a FIFO or a device
    between the listing and the open is skipped, never followed or blocked on (os.fwalk opens
    before it checks). Iterative: a tree deeper than MAX_DEPTH raises :class:`TooDeep` instead of
    exhausting the stack or the fds. The fds are closed as the walk moves on."""
    stack = [("", os.dup(top_fd), None)]
    try:
        while stack:
            rel, fd, pending = stack[-1]
            if pending is None:
                subdirs, names = [], []
                with os.scandir(fd) as entries:
                    for entry in entries:
                        if not rel and entry.name in skip_top:
                            continue
                        if entry.is_dir(follow_symlinks=False):
                            subdirs.append(entry.name)
                        else:
                            names.append(entry.name)
                stack[-1] = (rel, fd, sorted(subdirs, reverse=True))
                yield rel, fd, sorted(names)
                continue
            if not pending:
                os.close(fd)
                stack.pop()
                continue
            name = pending.pop()
            if len(stack) > MAX_DEPTH:
                raise TooDeep(f"the tree is nested deeper than {MAX_DEPTH} directories")
            try:
                child = os.open(name, _SUBDIR, dir_fd=fd)
            except OSError:
                continue  # gone, or no longer a directory: nothing of it is read
            stack.append((f"{rel}/{name}" if rel else name, child, None))
    finally:
        for _rel, fd, _pending in stack:
            os.close(fd)


def untrusted_files(dir_fd: int, skip_top: tuple[str, ...] = ()):
    """(relative path, directory fd, name) of the entries under the directory ``dir_fd`` (see
    :func:`walk`)."""
    for rel, fd, names in walk(dir_fd, skip_top):
        for name in names:
            yield (f"{rel}/{name}" if rel else name), fd, name


def remove_tree(parent_fd: int, name: str) -> None:
    """Remove ``name`` under ``parent_fd`` and everything below it, following no link. A level
    past MAX_DEPTH is first moved up to the top (a rename within the tree), so a tree of any
    depth goes with at most MAX_DEPTH fds open."""
    try:
        info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        os.unlink(name, dir_fd=parent_fd)
        return
    top = os.open(name, _SUBDIR, dir_fd=parent_fd)
    moved = 0
    try:
        while True:
            stack = [os.dup(top)]
            try:
                while stack:
                    fd = stack[-1]
                    child = None
                    with os.scandir(fd) as entries:
                        for entry in entries:
                            if entry.is_dir(follow_symlinks=False):
                                child = entry.name
                                break
                            os.unlink(entry.name, dir_fd=fd)
                    if child is None:
                        os.close(stack.pop())
                        if stack:
                            # Empty now: the parent removes it by the name it found it under.
                            _rmdir_empty_children(stack[-1])
                        continue
                    if len(stack) >= MAX_DEPTH:
                        moved += 1
                        os.rename(child, f".gridgate-deep-{os.getpid()}-{moved}", src_dir_fd=fd, dst_dir_fd=top)
                        continue
                    try:
                        stack.append(os.open(child, _SUBDIR, dir_fd=fd))
                    except OSError:
                        os.unlink(child, dir_fd=fd)  # swapped for a link meanwhile: the link goes
            finally:
                for fd in stack:
                    os.close(fd)
            with os.scandir(top) as entries:
                if not any(True for _ in entries):
                    break
    finally:
        os.close(top)
    os.rmdir(name, dir_fd=parent_fd)


def _rmdir_empty_children(fd: int) -> None:
    with os.scandir(fd) as entries:
        names = [entry.name for entry in entries if entry.is_dir(follow_symlinks=False)]
    for name in names:
        with contextlib.suppress(OSError):  # not empty yet: its turn comes
            os.rmdir(name, dir_fd=fd)


def data_extents(fd: int, size: int):
    """(start, end) of each stretch of ``fd`` that holds data (the whole file where the file
    system cannot tell holes apart)."""
    offset = 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                return  # nothing but a hole up to the end
            yield offset, size
            return
        end = os.lseek(fd, start, os.SEEK_HOLE)
        yield start, end
        offset = end


def copy_sparse(src: int, out: int) -> None:
    """The content of ``src`` into ``out``; holes stay holes (an 8 GiB sparse file storing
    nothing is copied as nothing)."""
    size = os.fstat(src).st_size
    for start, end in data_extents(src, size):
        position = start
        while position < end:
            chunk = os.pread(src, min(1 << 20, end - position), position)
            if not chunk:
                break
            os.pwrite(out, chunk, position)
            position += len(chunk)
    os.ftruncate(out, size)


def sha256_fd(fd: int) -> str:
    digest = hashlib.sha256()
    os.lseek(fd, 0, os.SEEK_SET)
    while chunk := os.read(fd, 1 << 20):
        digest.update(chunk)
    return digest.hexdigest()


def write_into(root_fd: int, rel: str, src: int, owner: tuple[int, int]) -> None:
    """Copy ``src`` to ``rel`` below the directory ``root_fd`` (the service's), every directory
    reached ``O_NOFOLLOW`` (made 0700 and the service's when missing), the file made anew under a
    temporary name, handed to the service and renamed into place: nothing is written through a
    link planted there, and a failure leaves complete files only."""
    parts = rel.split("/")
    fd = os.dup(root_fd)
    try:
        for part in parts[:-1]:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o700, dir_fd=fd)
                os.chown(part, *owner, dir_fd=fd, follow_symlinks=False)
            inner = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = inner
        name = parts[-1]
        part = f".{name}.part"
        out = _new_file(fd, part)
        try:
            copy_sparse(src, out)
            os.fchown(out, *owner)
        finally:
            os.close(out)
        os.replace(part, name, src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        os.close(fd)


def give_tree(dir_fd: int, entry, *, service_uid: int) -> None:
    """Hand the tree under ``dir_fd`` (prepared by the service) to the account ``entry``, the
    top 0700. Every entry is opened without following a link and changed through its fd; a tree
    holding anything but the service's (or already the account's) directories and single-named
    regular files is refused: nothing else changes hands."""
    uid, gid = entry.pw_uid, entry.pw_gid
    for _rel, fd, filenames in walk(dir_fd):
        _check_owned(os.fstat(fd), service_uid, uid, "a directory")
        os.fchown(fd, uid, gid)
        for name in filenames:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(info.st_mode):
                continue  # a link changes nothing: it is never followed
            file_fd = open_regular(name, dir_fd=fd)
            if file_fd is None:
                raise Refused(f"the working directory holds {name!r}, which is not a single regular file")
            try:
                _check_owned(os.fstat(file_fd), service_uid, uid, name)
                os.fchown(file_fd, uid, gid)
            finally:
                os.close(file_fd)
    os.fchmod(dir_fd, 0o700)


def _check_owned(info, service_uid: int, uid: int, what: str) -> None:
    if info.st_uid not in (service_uid, uid):
        raise Refused(f"the working directory holds {what} of uid {info.st_uid}, neither the service's nor the case's")


# -- where a case's run directory is --------------------------------------------------------------
def run_dir(config: Config, request: dict) -> int:
    """An fd on the case's run directory, which the service made: ``<cases root>/<case>/.run``
    (local, and Slurm pools without a working root) or ``<working root>/<case>`` (Slurm)."""
    case = case_id(request)
    where = request.get("run") or {"kind": "local"}
    if not isinstance(where, dict):
        raise Refused("run must be an object")
    root = where.get("working_root")
    if root is not None:
        if root not in config.working_roots:
            raise Refused(f"{root!r} is not a working root of this site's Slurm pools")
        fd = open_dir(root, case)
    else:
        fd = open_dir(config.cases_root, case, ".run")
    # A Slurm job traverses its run directory to its work/ (0711); a local one is the service's
    # alone (0700), so nothing of the account's reaches what lies around its working directory.
    closed = stat.S_IWGRP | stat.S_IWOTH if where.get("kind") == "slurm" else 0o077
    info = os.fstat(fd)
    if info.st_uid != config.service_uid or info.st_mode & closed:
        os.close(fd)
        raise Refused("the run directory is not the service's own (or others may open it)")
    return fd


# -- cgroups (v2 unified, or v1 per controller) ---------------------------------------------------
class CgroupError(Refused):
    """The case's cgroup cannot be made: the message says what to set up (docs/operations.md)."""


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


def _cgroup_base(base: str) -> list[str]:
    parts = [part for part in base.split("/") if part]
    if not parts or any(part in (".", "..") for part in parts):
        raise CgroupError(f"the cgroup base {base!r} is not a path below the cgroup mount")
    return parts


def create_cgroup(base: str, name: str, *, memory_bytes: int, tasks: int, cpu: float) -> dict:
    """Create (or reuse, on a retried start) the case's cgroup with its bounds; returns what
    :class:`Cgroup` needs: ``{"version", "dirs"}``. ``base`` is relative to the cgroup mount
    (``gridgate``: a hierarchy of its own at the top, as docker's cgroupfs driver makes)."""
    unified, v1 = _mounts()
    root = _v2_root(unified)
    quota = max(1000, math.ceil(cpu * CPU_PERIOD_US))
    try:
        if root is not None:
            leaf = Path(root)
            for part in [*_cgroup_base(base), name]:
                # Controllers reach a child only when every ancestor hands them down.
                _enable_v2_controllers(leaf)
                leaf = leaf / part
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
                leaf = Path(v1[controller], *_cgroup_base(base), name)
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
    leaves = [Path(mount, *_cgroup_base(base), name) for mount in mounts]
    found = {str(i): str(leaf) for i, leaf in enumerate(leaves) if leaf.is_dir()}
    if found:
        Cgroup(2 if root is not None else 1, found).remove()


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
        with contextlib.suppress(OSError, ValueError):
            for line in path.read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
        return 0

    def oom_kills(self) -> int:
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        return self._counter(self._file("memory", name), "oom_kill")

    def forks_refused(self) -> int:
        return self._counter(self._file("pids", "pids.events"), "max")

    def pids(self) -> set[int]:
        out = set()
        for directory in self.dirs:
            with contextlib.suppress(OSError, ValueError):
                out.update(int(p) for p in (directory / "cgroup.procs").read_text().split())
        return out

    def signal(self, signum: int) -> None:
        if signum == signal.SIGKILL and self.version == 2 and (self.dirs[0] / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                _write(self.dirs[0] / "cgroup.kill", 1)
                return
        for pid in self.pids():
            with contextlib.suppress(OSError):
                os.kill(pid, signum)

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


# -- the egress filter of a case with the network ---------------------------------------------------
#: what a case with the network never reaches unless its pool lists it: "this" network, private
#: (RFC 1918), shared/CGNAT (RFC 6598), loopback, link-local (cloud metadata at 169.254.169.254),
#: multicast and reserved; for IPv6 (slirp4netns routes none, kept closed all the same) loopback,
#: unique-local, link-local and multicast
BLOCKED_V4 = (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
    "192.168.0.0/16", "224.0.0.0/3",
)  # fmt: skip
BLOCKED_V6 = ("::/127", "fc00::/7", "fe80::/10", "ff00::/8")
#: slirp4netns's name server inside the sandbox (its 10.0.2.0/24 is otherwise dropped with 10/8:
#: 10.0.2.2 is the host)
SLIRP_DNS = "10.0.2.3"
NFT = ("/usr/sbin/nft", "/sbin/nft")
NSENTER = "/usr/bin/nsenter"
NFT_MISSING = "nftables (nft) is not installed: apt install nftables"


def host_addresses() -> tuple[list[str], list[str]]:
    """This host's own addresses (every interface's, from the kernel's local routing table and
    ``if_inet6``): a case with the network reaches none of them, so nothing a host service
    listens on beyond loopback is in its reach either."""
    v4, v6 = set(), set()
    try:
        lines = Path("/proc/net/fib_trie").read_text().splitlines()
    except OSError:
        lines = []
    for previous, line in zip(lines, lines[1:], strict=False):
        if line.strip() == "/32 host LOCAL":
            v4.add(previous.strip().lstrip("|-+ ").strip())
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            raw = line.split()[0]
            v6.add(str(ipaddress.ip_address(int(raw, 16))))
    return sorted(v4), sorted(v6)


def egress_rules(allowed: list[str]) -> str:
    """The nftables ruleset loaded into a networked case's own network namespace (its OUTPUT
    hook: every packet the case sends). The command holds no capability, so it cannot change it."""
    own4, own6 = host_addresses()

    def merged(items, version: int) -> list[str]:
        # An anonymous nftables set refuses overlapping intervals (127.0.0.1 inside 127.0.0.0/8).
        networks = [n for n in map(ipaddress.ip_network, items) if n.version == version]
        return [str(n) for n in ipaddress.collapse_addresses(networks)]

    allow4, allow6 = merged(allowed, 4), merged(allowed, 6)
    drop4, drop6 = merged([*BLOCKED_V4, *own4], 4), merged([*BLOCKED_V6, *own6], 6)

    lines = [
        "table inet gridgate_egress {",
        "  chain out {",
        "    type filter hook output priority 0; policy accept;",
        '    oif "lo" accept',
        f"    ip daddr {SLIRP_DNS} udp dport 53 accept",
        f"    ip daddr {SLIRP_DNS} tcp dport 53 accept",
    ]
    if allow4:
        lines.append(f"    ip daddr {{ {', '.join(allow4)} }} accept")
    if allow6:
        lines.append(f"    ip6 daddr {{ {', '.join(allow6)} }} accept")
    lines.append(f"    ip daddr {{ {', '.join(drop4)} }} drop")
    lines.append(f"    ip6 daddr {{ {', '.join(drop6)} }} drop")
    lines += ["  }", "}", ""]
    return "\n".join(lines)


def _nft(namespace: list[str], allowed: list[str], timeout: float) -> subprocess.CompletedProcess | None:
    """nft loading :func:`egress_rules` into the network namespace the command ``namespace``
    runs it in; None when nftables is not installed."""
    nft = next((path for path in NFT if os.access(path, os.X_OK)), None)
    if nft is None:
        return None
    return subprocess.run(
        [*namespace, nft, "-f", "-"],
        input=egress_rules(allowed).encode(),
        capture_output=True,
        timeout=timeout,
        env={"PATH": DEFAULT_PATH},
        check=False,
    )


def load_egress_filter(pid: int, allowed: list[str]) -> str | None:
    """Load :func:`egress_rules` into the network namespace of ``pid`` (the sandbox's); the
    reason it could not, or None."""
    try:
        proc = _nft([NSENTER, f"--net=/proc/{pid}/ns/net"], allowed, NETWORK_SETUP_SECONDS)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nft could not run: {exc}"
    if proc is None:
        return NFT_MISSING
    if proc.returncode != 0:
        return f"nft refused the egress filter: {proc.stderr.decode(errors='replace').strip()[:500]}"
    return None


def egress_probe() -> str:
    """doctor's question: can a filter be loaded into a fresh network namespace here?"""
    try:
        proc = _nft(["/usr/bin/unshare", "--net"], [], 30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot load an egress filter into a network namespace: {exc}"
    if proc is None:
        return NFT_MISSING
    if proc.returncode != 0:
        return f"cannot load an egress filter into a network namespace: {proc.stderr.decode(errors='replace')[:300]}"
    return "ok"


# -- no user namespaces inside the sandbox ------------------------------------------------------------
CLONE_NEWUSER = 0x10000000
SCMP_ACT_ALLOW = 0x7FFF0000
#: libseccomp's SCMP_ACT_ERRNO(x) is this | x (an errno below 0x10000)
SCMP_ACT_ERRNO = 0x00050000
SCMP_CMP_MASKED_EQ = 7


def user_namespace_filter() -> int:
    """A sealed memfd holding the BPF program bwrap loads (``--seccomp``) before it runs the
    command: ``unshare(2)`` and ``clone(2)`` asking for ``CLONE_NEWUSER`` fail with EPERM, and
    ``clone3(2)``, whose flags sit in memory a filter cannot read, with ENOSYS (libc then falls back
    to ``clone``). A user namespace would hand the command a full set of capabilities over a
    namespace of its own: the way into many kernel bugs, which a case has no use for.

    libseccomp (Debian ``libseccomp2``) compiles it, called through ctypes so this helper stays one
    standard-library file; it kills a process calling through another architecture (a 32-bit
    binary on x86_64), so the filter cannot be walked around (docs/operations.md)."""
    from ctypes import CDLL, POINTER, Structure, c_char_p, c_int, c_uint, c_uint32, c_uint64, c_void_p, pointer

    class ArgCmp(Structure):
        _fields_ = [("arg", c_uint), ("op", c_int), ("a", c_uint64), ("b", c_uint64)]

    try:
        lib = CDLL("libseccomp.so.2", use_errno=True)
    except OSError:
        raise Refused(
            "libseccomp is not installed: cases cannot run without their syscall filter (apt install libseccomp2)"
        ) from None
    lib.seccomp_init.restype = c_void_p
    lib.seccomp_init.argtypes = [c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [c_char_p]
    lib.seccomp_rule_add_array.argtypes = [c_void_p, c_uint32, c_int, c_uint, POINTER(ArgCmp)]
    lib.seccomp_export_bpf.argtypes = [c_void_p, c_int]
    lib.seccomp_release.argtypes = [c_void_p]
    context = lib.seccomp_init(SCMP_ACT_ALLOW)
    if not context:
        raise Refused("libseccomp could not make a filter")
    fd = os.memfd_create("gridgate-seccomp", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        new_user = ArgCmp(0, SCMP_CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER)
        rules = [("unshare", errno.EPERM, new_user), ("clone", errno.EPERM, new_user), ("clone3", errno.ENOSYS, None)]
        for name, answer, condition in rules:
            number = lib.seccomp_syscall_resolve_name(name.encode())
            if number < 0:
                continue  # not a system call on this architecture
            conditions = pointer(condition) if condition is not None else None
            if lib.seccomp_rule_add_array(
                context, SCMP_ACT_ERRNO | answer, number, int(condition is not None), conditions
            ):
                raise Refused(f"libseccomp refused the rule for {name}")
        if lib.seccomp_export_bpf(context, fd) != 0:
            raise Refused("libseccomp could not write the filter")
    except BaseException:
        os.close(fd)
        raise
    finally:
        lib.seccomp_release(context)
    # Sealed: nothing that inherits the fd before bwrap reads it can change the program.
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


# -- the sandbox's command line ----------------------------------------------------------------------
def _bind_system(args: list[str], *, network: bool) -> None:
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    args += ["--perms", "0755", "--dir", "/etc"]  # bwrap makes missing parents 0700: the account could not enter
    for name in ETC_ENTRIES:
        if name == "resolv.conf" and network:
            args += ["--perms", "0644", "--ro-bind-data", str(RESOLV_FD), "/etc/resolv.conf"]
        else:
            args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]


def _dirs(args: list[str], path: Path, below: Path | None = None) -> None:
    """Create ``path``'s ancestors (below ``below``) 0755 in the sandbox, so the account can
    reach its working directory by its absolute path too."""
    for parent in reversed(path.parents):
        if parent == Path("/") or (below is not None and not parent.is_relative_to(below)) or parent == below:
            continue
        args += ["--perms", "0755", "--dir", str(parent)]


def switch_to(entry) -> list[str]:
    """The command prefix that becomes ``entry``'s account (its groups from /etc/group) with no
    capability left, not even in the bounding set."""
    become = [f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--init-groups"]
    return ["/usr/bin/setpriv", *become, "--inh-caps=-all", "--bounding-set=-all", "--"]


def sandbox_argv(
    config: Config, case: str, entry, env: dict, *, network: bool, shared: bool, tmp_bytes: int, seccomp: bool = False
) -> list[str]:
    """The command line that runs the case's command (fd 3) as ``entry``'s account in its
    sandbox (R-CASE-8). Its working directory and the campaign's shared inputs are bound from the
    fds this helper opened (``--bind-fd``, which also closes them: no handle on the host's tree
    reaches the command), never from a path the service could swap for a link. Root's step inside
    the sandbox (``setpriv``) runs with an empty environment: the case's variables (``LD_PRELOAD``
    would be one) are set by ``env -i`` after the switch, as the account. With the network, bwrap
    reports on fd 4 and waits on fd 5; with ``seccomp`` it loads the filter on fd 9."""
    variables = [f"{name}={value}" for name, value in sorted(env.items())]
    case_env = ["/usr/bin/env", "-i", "--default-signal=TERM", *variables]
    work = Path(config.cases_root, case, ".run", "work")
    # Into the working directory as the account (root without CAP_DAC_OVERRIDE may not enter it).
    inner = [*case_env, "/bin/sh", "-c", 'cd "$0" && exec /bin/sh "$1"', str(work), COMMAND_IN_SANDBOX]
    bwrap = shutil.which("bwrap", path=DEFAULT_PATH)
    if bwrap is None:
        if entry is not None:
            raise Refused("bubblewrap (bwrap) is not installed: cases cannot run in a sandbox (apt install bubblewrap)")
        # A trusted single-user pool without bubblewrap (a developer's laptop): the service's own
        # account, a cleared environment, no sandbox, the host's network (docs/operations.md).
        return ["/bin/sh", "-c", 'cd "$0" && exec "$@"', str(work), *case_env, "/bin/sh", f"/proc/self/fd/{COMMAND_FD}"]
    args = [bwrap, "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent"]
    # Never the host's network namespace, whose loopback holds the database.
    args.append("--unshare-net")
    if network:
        args += ["--info-fd", str(INFO_FD), "--block-fd", str(BLOCK_FD)]
    _bind_system(args, network=network)
    args += ["--proc", "/proc", "--dev", "/dev"]
    # Private and bounded: tmpfs pages count against the case's memory anyway.
    args += ["--perms", "1777", "--size", str(tmp_bytes), "--tmpfs", "/tmp"]  # noqa: S108 - private
    args += ["--perms", "0755", "--dir", str(Path(COMMAND_IN_SANDBOX).parent)]
    args += ["--perms", "0444", "--ro-bind-data", str(COMMAND_FD), COMMAND_IN_SANDBOX]
    # Of the cases root, only this case's working directory exists in the sandbox.
    root = Path(config.cases_root)
    _dirs(args, root)
    args += ["--perms", "0755", "--tmpfs", str(root)]
    _dirs(args, work, below=root)
    args += ["--bind-fd", str(WORK_FD), str(work)]
    if shared:
        args += ["--ro-bind-fd", str(SHARED_FD), str(work / "shared")]
    args += ["--chdir", "/", "--clearenv"]
    if seccomp:
        args += ["--seccomp", str(SECCOMP_FD)]
    if entry is not None:
        # bwrap run by root keeps root's capabilities unless told: only those setpriv needs to
        # switch to the account and then clear every set, the bounding set included (dropping a
        # capability from the bounding set takes CAP_SETPCAP: without it the set stayed full).
        args += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        args += ["--cap-add", "CAP_SETPCAP"]
    switch = switch_to(entry) if entry is not None else []
    return [*args, "--", *switch, *inner]


# -- the supervisor ------------------------------------------------------------------------------
def disk_usage(dir_fd: int, *fds: int) -> int:
    """Bytes the tree under ``dir_fd`` and the open files ``fds`` hold on disk (allocated
    blocks: a sparse file costs what it stores); symlinks are never followed."""
    total = sum(os.fstat(fd).st_blocks * 512 for fd in fds)
    for _rel, fd, filenames in walk(dir_fd):
        total += os.fstat(fd).st_blocks * 512
        for name in filenames:
            with contextlib.suppress(OSError):
                total += os.stat(name, dir_fd=fd, follow_symlinks=False).st_blocks * 512
    return total


def _write_at(dir_fd: int, name: str, text: str) -> None:
    """A control file of the run directory, written anew and renamed into place (mode 0644: the
    service reads it), never through a link."""
    part = f".{name}.part"
    with os.fdopen(_new_file(dir_fd, part, mode=0o644), "w") as handle:
        handle.write(text + "\n")
    os.replace(part, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def _new_file(dir_fd: int, name: str, owner: tuple[int, int] | None = None, mode: int = 0o600) -> int:
    """``name`` made anew (anything by that name, a link included, goes first), handed to
    ``owner`` when given."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    if owner is not None:
        os.fchown(fd, *owner)
    return fd


class Supervisor:
    """Runs the sandbox and stays beside it until it ends: the cgroup, the rlimits, the wall time
    and disk bound, slirp4netns, and the files that say how it ended (``limit``, then
    ``exit_status``). Holds ``lock`` (flock) for its whole life: that is how the service, which
    cannot see root's processes everywhere, tells it is alive. SIGUSR1 stops the command."""

    def __init__(self, plan: dict, fds: dict[int, int], rdir_fd: int, work_fd: int, cgroup: Cgroup | None):
        self.plan = plan
        self.fds = fds
        self.rdir_fd = rdir_fd
        self.work_fd = work_fd
        self.cgroup = cgroup
        self.stop_requested = False
        self.child = 0
        self.slirp = None
        self.reason = None

    def start(self) -> None:
        fds = dict(self.fds)
        network = self.plan["network"] and "bwrap" in os.path.basename(self.plan["argv"][0])
        if network:
            info_r, fds[INFO_FD] = os.pipe2(os.O_CLOEXEC)
            fds[BLOCK_FD], block_w = os.pipe2(os.O_CLOEXEC)
        # Above every target number first, so no dup2 below overwrites a source not yet moved.
        high = {target: fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 20) for target, fd in fds.items()}
        if network:
            os.close(fds[INFO_FD])
            os.close(fds[BLOCK_FD])
        pid = os.fork()
        if pid == 0:  # the sandbox's process
            try:
                if self.cgroup is not None:
                    self.cgroup.enter(os.getpid())
                for name, value in self.plan["rlimits"].items():
                    resource.setrlimit(getattr(resource, f"RLIMIT_{name}"), (value, value))
                signal.signal(signal.SIGUSR1, signal.SIG_DFL)
                for target, fd in high.items():
                    os.dup2(fd, target)  # dup2 clears close-on-exec on the copy
                os.closerange(max(high) + 1, os.sysconf("SC_OPEN_MAX"))  # the targets: 0 … 9
                argv = self.plan["argv"]
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
            with contextlib.suppress(ValueError, KeyError):  # not all of it yet: read on
                child_pid = int(json.loads(data)["child-pid"])
        os.close(info_r)
        if child_pid is None:
            os.close(block_w)
            return  # bwrap failed before creating the sandbox: its exit status says so
        ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
        self.exit_r, self.exit_w = os.pipe2(os.O_CLOEXEC)
        argv = [shutil.which("slirp4netns", path=DEFAULT_PATH) or "slirp4netns", "--configure", "--mtu=65520"]
        argv.append("--disable-host-loopback")  # the host's loopback holds the database
        # It parses the case's packets as root: its own mount namespace with every capability but
        # binding low ports dropped, and a syscall filter.
        argv += ["--enable-sandbox", "--enable-seccomp", f"--ready-fd={ready_w}", f"--exit-fd={self.exit_r}"]
        argv += [str(child_pid), "tap0"]
        try:
            self.slirp = subprocess.Popen(
                argv,
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
        if ok:
            # Before the command starts (bwrap waits on the block fd): link-local, private and
            # the host's own addresses out of reach, unless the pool lists them.
            problem = load_egress_filter(child_pid, self.plan.get("allowed_networks", []))
            if problem:
                self.plan["messages"]["network"] = (
                    f"the case's egress filter could not be set up ({problem}): ask an operator"
                )
                ok = False
        if not ok:
            self._limit("network")
            self.stop_requested = True
        else:
            os.write(block_w, b"1")
        os.close(block_w)

    def _limit(self, reason: str) -> None:
        message = self.plan["messages"].get(reason, reason)
        _write_at(self.rdir_fd, "limit", json.dumps({"reason": reason, "message": message}))
        self.reason = reason

    def _exited(self):
        pid, status = os.waitpid(self.child, os.WNOHANG)
        return os.waitstatus_to_exitcode(status) if pid else None

    def stop(self) -> int:
        """SIGTERM to the command (its process group and cgroup), SIGKILL after the grace."""
        with contextlib.suppress(OSError):
            os.killpg(os.getpgid(0), signal.SIGTERM)  # we and bwrap ignore it; the command does not
        if self.cgroup is not None:
            self.cgroup.signal(signal.SIGTERM)
        deadline = time.monotonic() + float(self.plan["grace"])
        while time.monotonic() < deadline:
            if (code := self._exited()) is not None:
                return code
            time.sleep(0.05)
        with contextlib.suppress(OSError):
            os.kill(self.child, signal.SIGKILL)  # bwrap: its pid namespace goes with it
        if self.cgroup is not None:
            self.cgroup.signal(signal.SIGKILL)
        return os.waitstatus_to_exitcode(os.waitpid(self.child, 0)[1])

    def watch(self) -> int:
        """Wait for the command, stopping it at the first bound it crosses."""
        started = time.monotonic()
        wall = float(self.plan["wall_seconds"])
        disk = self.plan["disk_bytes"]
        disk_every = float(self.plan["disk_interval"])
        next_disk = started + disk_every
        while (code := self._exited()) is None:
            now = time.monotonic()
            if self.stop_requested:
                return self.stop()  # a cancel (or a failed network set-up): no bound to record
            if now - started >= wall:
                self._limit("wall_time")
            elif self.cgroup is not None and self.cgroup.oom_kills():
                self._limit("memory")
            elif self.cgroup is not None and self.cgroup.forks_refused():
                self._limit("tasks")
            elif now >= next_disk:
                next_disk = now + disk_every
                if disk_usage(self.work_fd, self.fds[1], self.fds[2]) > disk:
                    self._limit("disk")
            if self.reason:
                return self.stop()
            time.sleep(0.2)
        # Ended on its own: an OOM kill or a refused fork along the way still fails the case,
        # whatever the shell's last command returned (as Slurm records OUT_OF_MEMORY).
        if self.cgroup is not None and self.cgroup.oom_kills():
            self._limit("memory")
        elif self.cgroup is not None and self.cgroup.forks_refused():
            self._limit("tasks")
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
        _write_at(self.rdir_fd, "exit_status", str(code if code >= 0 else 128 - code))


# -- verbs ----------------------------------------------------------------------------------------
def start(config: Config, request: dict) -> dict:
    """Check the request, hand the working directory over, make the cgroup, open everything the
    sandbox needs, then detach the supervisor; answers its pid once it holds its lock."""
    case = case_id(request)
    entry = account(config, request)
    env = request.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and ENV_NAME.fullmatch(k) for k in env):
        raise Refused("env must map variable names to text")
    env = {name: _text(value, f"the variable {name}") for name, value in env.items()}
    # slirp4netns plumbs a namespace root made; unprivileged (a trusted laptop pool) the sandbox
    # keeps no network at all rather than the host's.
    network = bool(request.get("network")) and os.geteuid() == 0
    bounds = request.get("bounds") or {}
    memory = _positive_int(bounds, "memory_bytes")
    tasks = _positive_int(bounds, "tasks", 1 << 22)
    disk = _positive_int(bounds, "disk_bytes")
    cpu = bounds.get("cpu")
    if isinstance(cpu, bool) or not isinstance(cpu, int | float) or not 0 < cpu <= 65536:
        raise Refused("bounds.cpu must be a number of cores above 0")
    messages = request.get("messages") or {}
    if not isinstance(messages, dict):
        raise Refused("messages must be an object")
    messages = {str(key): _text(value, "a message")[:2000] for key, value in messages.items()}
    allowed = request.get("allowed_networks") or []
    if not isinstance(allowed, list) or len(allowed) > 256:
        raise Refused("allowed_networks must be a list of at most 256 networks")
    try:
        allowed = [str(ipaddress.ip_network(item)) for item in allowed if isinstance(item, str)]
    except ValueError as exc:
        raise Refused(f"allowed_networks: {exc}") from None
    plan = {
        "network": network,
        "allowed_networks": allowed,
        "wall_seconds": _positive_int(request, "wall_seconds"),
        "grace": _positive_int(request, "grace", 3600, minimum=0),
        "disk_interval": _positive_int(request, "disk_interval", 3600),
        "disk_bytes": disk,
        "messages": messages,
        "rlimits": {"FSIZE": disk, "CORE": 0, **({"NPROC": config.nproc} if entry is not None else {})},
    }
    with contextlib.ExitStack() as opened:
        rdir_fd = _closing(opened, run_dir(config, request))
        # First, before anything changes: one supervisor per run directory. The lock stays with
        # the open file the supervisor inherits, held from here to its end.
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        lock = _closing(opened, os.open("lock", flags, 0o644, dir_fd=rdir_fd))
        info = os.fstat(lock)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            raise Refused("the run directory's lock is not a single regular file")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Refused("this case is running already") from None
        work_fd = _closing(opened, os.open("work", _DIR, dir_fd=rdir_fd))
        if entry is not None:
            give_tree(work_fd, entry, service_uid=config.service_uid)
        command_fd = open_regular("command.sh", dir_fd=rdir_fd)
        if command_fd is None:
            raise Refused("the run directory holds no command.sh (a single regular file)")
        _closing(opened, command_fd)
        fds = {COMMAND_FD: command_fd, WORK_FD: work_fd}
        shared = request.get("shared_campaign")
        if shared is not None:
            if not isinstance(shared, str) or not CASE_ID.fullmatch(shared):
                raise Refused("shared_campaign must be a campaign's UUID")
            fds[SHARED_FD] = _closing(opened, open_dir(config.cases_root, "campaigns", shared, "shared"))
        if network:
            fds[RESOLV_FD] = _closing(opened, os.memfd_create("resolv.conf", os.MFD_CLOEXEC))
            os.write(fds[RESOLV_FD], SLIRP_RESOLV)
            os.lseek(fds[RESOLV_FD], 0, os.SEEK_SET)
        service = (config.service_uid, config.service_gid)
        fds[0] = _closing(opened, os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
        fds[1] = _closing(opened, _new_file(rdir_fd, "stdout", service))
        fds[2] = _closing(opened, _new_file(rdir_fd, "stderr", service))
        for name in ("exit_status", "limit"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=rdir_fd)
        seccomp = shutil.which("bwrap", path=DEFAULT_PATH) is not None
        if seccomp:
            fds[SECCOMP_FD] = _closing(opened, user_namespace_filter())
        plan["argv"] = sandbox_argv(
            config, case, entry, env, network=network, shared=shared is not None, tmp_bytes=memory, seccomp=seccomp
        )
        cgroup = None
        if entry is not None and config.cgroup != "off":
            cgroup = Cgroup(**create_cgroup(config.cgroup, f"case-{case}", memory_bytes=memory, tasks=tasks, cpu=cpu))
        return {"pid": _detach(plan, fds, rdir_fd, work_fd, cgroup)}


def _detach(plan, fds, rdir_fd, work_fd, cgroup) -> int:
    """Double fork: the supervisor is reparented to init, so the process that asked for it (a
    worker, a web process) is never its parent, and leads a session and process group of its own
    (its pid is the group's id: a cancel's last resort kills that group). Its pid comes back once
    it holds the lock."""
    ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
    first = os.fork()
    if first == 0:
        try:
            os.close(ready_r)
            if os.fork() != 0:
                os._exit(0)
            os.setsid()
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a cancel's SIGTERM is for the command
            supervisor = Supervisor(plan, fds, rdir_fd, work_fd, cgroup)

            def stop_now(signum, frame):
                supervisor.stop_requested = True

            signal.signal(signal.SIGUSR1, stop_now)
            os.fchdir(rdir_fd)  # how ``stop`` recognises it: root, in this run directory
            for fd in (0, 1, 2):
                os.dup2(fds[0], fd)  # nothing of the caller's pipes: it waits for none of this
            os.write(ready_w, str(os.getpid()).encode())
            os.close(ready_w)
            try:
                supervisor.start()
                code = supervisor.watch()
            except Exception as exc:  # the watch itself broke: the case fails saying so
                failure = {"reason": "supervisor", "message": f"the case could not run: {exc}"}
                _write_at(rdir_fd, "limit", json.dumps(failure))
                code = 1
                if supervisor.child:
                    with contextlib.suppress(OSError):
                        os.kill(supervisor.child, signal.SIGKILL)
                        os.waitpid(supervisor.child, 0)
            supervisor.finish(code)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.waitpid(first, 0)
    answer = b""
    while chunk := os.read(ready_r, 64):
        answer += chunk
    os.close(ready_r)
    if not answer:
        raise Refused("the supervisor did not start")
    return int(answer)  # the lock is the supervisor's now: closing our fd leaves it held


def _closing(opened: contextlib.ExitStack, fd: int) -> int:
    """``fd``, closed when ``opened`` closes (at the end of a verb, however it ends)."""
    opened.callback(os.close, fd)
    return fd


def supervisor_pid(rdir_fd: int) -> int | None:
    """The pid of the live supervisor of this run directory: read from ``pid`` (the service's
    file), and trusted only for a root process of this helper whose working directory is this
    very directory (compared by inode: the service cannot point it at another process)."""
    try:
        with os.fdopen(os.open("pid", _READ, dir_fd=rdir_fd)) as handle:
            pid = int(handle.read(32).strip())
    except (OSError, ValueError):
        return None
    here = os.fstat(rdir_fd)
    try:
        there = os.stat(f"/proc/{pid}/cwd")
        status = Path(f"/proc/{pid}/status").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    uids = next((line.split()[1:] for line in status.splitlines() if line.startswith("Uid:")), [])
    ours = os.fsencode(os.path.abspath(__file__)) in cmdline and b"start" in cmdline
    if (there.st_dev, there.st_ino) != (here.st_dev, here.st_ino) or uids[:1] != [str(os.geteuid())] or not ours:
        return None
    return pid


def stop(config: Config, request: dict) -> dict:
    """A cancel: SIGUSR1 to the case's supervisor, which stops the command (SIGTERM, the grace,
    SIGKILL) and records its end; SIGKILL to its whole group if it does not end in time."""
    grace = _positive_int(request, "grace", 3600, minimum=0)
    with contextlib.ExitStack() as opened:
        try:
            rdir_fd = _closing(opened, run_dir(config, request))
        except Refused:
            # The run directory is gone (removed by hand) or not the service's: the case's cgroup
            # still holds its processes, and taking them takes the supervisor's child with them.
            if os.geteuid() == 0 and config.cgroup != "off":
                remove_cgroup(config.cgroup, f"case-{case_id(request)}")
            return {"stopped": False}
        pid = supervisor_pid(rdir_fd)
        if pid is None:
            return {"stopped": False}
        os.kill(pid, signal.SIGUSR1)
        deadline = time.monotonic() + grace + 10
        while time.monotonic() < deadline and supervisor_pid(rdir_fd) == pid:
            time.sleep(0.05)
        if supervisor_pid(rdir_fd) == pid:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)  # the supervisor leads its own group
            if config.cgroup != "off":
                remove_cgroup(config.cgroup, f"case-{case_id(request)}")
        return {"stopped": True}


def glob_matches(rel: str, globs: list[str]) -> bool:
    """The core's observability globs (fnmatch: ``*`` also crosses ``/``), plus Gridgate's
    progress marker: a case's live files, for every backend."""
    return any(fnmatch.fnmatch(rel, pattern) for pattern in list(globs or []) + [PROGRESS_FILE])


def bring_back(what, work_fd, target_fd, owner, globs, manifest, max_bytes, keep=None) -> list[str]:
    """Copy the ``results`` or the ``live`` files (``what``) of a case's working directory
    ``work_fd`` into ``target_fd``, handed to ``owner``; the paths copied. :func:`collect` and the
    Run:AI backend both bring files back so. The case's command chose what lies there: only
    regular files with one name are read, reached without following a link, and ``keep(rel,
    info)``, when given, vets each by its ``fstat``. Live files match ``globs``; results are what
    is not an unchanged input (``manifest``), never more than ``max_bytes`` on disk."""
    copied, stored = [], 0
    skip = NOT_RESULTS if what == "results" else ("shared",)
    for rel, dir_fd, name in untrusted_files(work_fd, skip):
        if what == "live" and not glob_matches(rel, globs):
            continue
        fd = open_regular(name, dir_fd=dir_fd)
        if fd is None:
            continue
        try:
            info = os.fstat(fd)
            if keep is not None and not keep(rel, info):
                continue
            if what == "results":
                # Only an input can be unchanged: a new file is never read twice.
                if rel in manifest and manifest[rel] == sha256_fd(fd):
                    continue
                stored += info.st_blocks * 512
                if max_bytes is not None and stored > max_bytes:
                    raise TooLarge(
                        f"the results hold more than the case's storage limit of {human_size(max_bytes)}: "
                        f"{rel!r} and what follows it were not brought back"
                    )
            try:
                write_into(target_fd, rel, fd, owner)
            except OSError:
                if what == "results":
                    raise
                continue  # a live copy that cannot land (a directory there): the next sync tries
        finally:
            os.close(fd)
        copied.append(rel)
    return copied


def collect(config: Config, request: dict) -> dict:
    """Copy the case's results (what the command created or changed: not its unchanged inputs,
    not ``shared/`` or ``.gridgate/``) or its live files (the globs and the progress marker)
    from its working directory into ``<case>/results`` or ``<case>/live``, the service's. Never
    more than ``max_bytes`` of results on disk. After the results, the working directory goes."""
    case = case_id(request)
    what = request.get("what")
    if what not in ("results", "live"):
        raise Refused("what must be results or live")
    globs = request.get("globs") or []
    if not isinstance(globs, list) or not all(isinstance(g, str) for g in globs):
        raise Refused("globs must be a list of patterns")
    max_bytes = _positive_int(request, "max_bytes") if request.get("max_bytes") is not None else None
    service = (config.service_uid, config.service_gid)
    with contextlib.ExitStack() as opened:
        rdir_fd = _closing(opened, run_dir(config, request))
        if what == "results" and "results_fetched" in os.listdir(rdir_fd):
            return {"copied": []}
        try:
            work_fd = _closing(opened, os.open("work", _DIR, dir_fd=rdir_fd))
        except OSError:
            raise Refused("the working directory is gone: results cannot be fetched") from None
        target_fd = _closing(opened, open_dir(config.cases_root, case, what, create=True, owner=service))
        manifest = {}
        if what == "results":
            manifest_fd = open_regular("manifest.json", dir_fd=rdir_fd)
            if manifest_fd is None:
                raise Refused("the run directory holds no inputs manifest")
            with os.fdopen(manifest_fd) as handle:
                try:
                    manifest = json.load(handle)
                except ValueError:
                    raise Refused("the inputs manifest is not valid JSON") from None
        uid = os.fstat(work_fd).st_uid

        def owned(rel: str, info: os.stat_result) -> bool:
            # Only what the case's account owns comes back: on a shared file system it could move
            # into work/ another account's file from a directory both may write.
            return info.st_uid == uid

        try:
            copied = bring_back(what, work_fd, target_fd, service, globs, manifest, max_bytes, keep=owned)
        except TooDeep as exc:
            raise TooLarge(f"the working directory is not brought back: {exc}") from None
        if what == "results":
            # Between the copy and the removal: a retry (an outcome not recorded) finds it done.
            os.close(_new_file(rdir_fd, "results_fetched", service))
            remove_tree(rdir_fd, "work")
        return {"copied": copied}


def human_size(n: int) -> str:
    return f"{n / (1 << 30):g} GB" if n >= 1 << 30 else f"{n / (1 << 20):g} MB"


def clean(config: Config, request: dict) -> dict:
    """The case's working directory and any cgroup left behind go (``manage.py cleanup``)."""
    case = case_id(request)
    with contextlib.ExitStack() as cleanup:
        if os.geteuid() == 0 and config.cgroup != "off":
            cleanup.callback(remove_cgroup, config.cgroup, f"case-{case}")  # last, whatever happens
        try:
            rdir_fd = _closing(cleanup, run_dir(config, request))
        except Refused:
            return {}  # nothing left to clean (or not the service's: not ours to touch)
        remove_tree(rdir_fd, "work")
    return {}


def sbatch(config: Config, request: dict) -> dict:
    """Submit a Slurm case as its account: its working directory becomes the account's, its
    output files the account's (readable by the service's group, which drains them), and its job
    script, read here through an fd (never a path the service could swap for a link), goes on
    stdin to ``sbatch`` run as that account. The script is the account's once sbatch has read
    it."""
    entry = account(config, request)
    if entry is None:
        raise Refused("a Slurm case runs as an account of its own")
    with contextlib.ExitStack() as opened:
        rdir_fd = _closing(opened, run_dir(config, request))
        work_fd = _closing(opened, os.open("work", _DIR, dir_fd=rdir_fd))
        give_tree(work_fd, entry, service_uid=config.service_uid)
        for name in ("stdout", "stderr"):
            os.close(_new_file(rdir_fd, name, (entry.pw_uid, config.service_gid), 0o640))
        script_fd = open_regular("job.sh", dir_fd=rdir_fd)
        if script_fd is None:
            raise Refused("the run directory holds no job.sh (a single regular file)")
        _closing(opened, script_fd)
        script = os.read(script_fd, MAX_TEXT + 1)
        if len(script) > MAX_TEXT:
            raise Refused("the job script is too long")
        try:
            # sbatch runs as the account itself (MUNGE vouches for it), not as root with --uid:
            # root's sbatch would judge the script's #SBATCH lines (a partition, --priority, a
            # negative --nice) with root's authority.
            proc = subprocess.run(
                [*switch_to(entry), "sbatch", "--parsable"],
                input=script,
                cwd="/",
                capture_output=True,
                timeout=_positive_int(request, "timeout", 600),
                # PATH and the configured slurm.conf, nothing of the caller's (a slurm.conf of the
                # caller's choosing would load plugins of its choosing).
                env={"PATH": DEFAULT_PATH, **({"SLURM_CONF": config.slurm_conf} if config.slurm_conf else {})},
                check=False,
            )
        except FileNotFoundError:
            raise Refused("sbatch is not installed on this host") from None
        except subprocess.TimeoutExpired:
            return {"timeout": True}
        os.fchown(script_fd, entry.pw_uid, entry.pw_gid)
        return {
            "returncode": proc.returncode,
            "stdout": proc.stdout.decode(errors="replace"),
            "stderr": proc.stderr.decode(errors="replace"),
        }


def version(config: Config, request: dict) -> dict:
    """The protocol, whether this helper runs as root, and (asked by doctor) whether it can make
    and remove a probe cgroup with the memory and pids controllers."""
    answer = {"protocol": PROTOCOL, "cases_root": config.cases_root, "root": os.geteuid() == 0}
    try:
        os.close(user_namespace_filter())
        answer["seccomp"] = "ok"
    except Refused as exc:
        answer["seccomp"] = str(exc)
    if request.get("probe_egress") and os.geteuid() == 0:
        answer["egress"] = egress_probe()
    if request.get("probe_cgroup") and os.geteuid() == 0 and config.cgroup != "off":
        name = f"doctor-{os.getpid()}"
        try:
            create_cgroup(config.cgroup, name, memory_bytes=1 << 30, tasks=16, cpu=1)
            remove_cgroup(config.cgroup, name)
            answer["cgroup"] = "ok"
        except CgroupError as exc:
            answer["cgroup"] = str(exc)
    return answer


VERBS = {"start": start, "stop": stop, "collect": collect, "clean": clean, "sbatch": sbatch, "version": version}


def main(argv: list[str]) -> int:
    def answer(body: dict, code: int = 0) -> int:
        sys.stdout.write(json.dumps(body))
        sys.stdout.flush()
        return code

    if len(argv) != 2 or argv[1] not in VERBS:
        return answer({"error": f"usage: {os.path.basename(argv[0])} {{{'|'.join(VERBS)}}} < request.json"}, 2)
    try:
        request = json.loads(sys.stdin.read(4 * MAX_TEXT))
        if not isinstance(request, dict):
            raise Refused("the request is not a JSON object")
        if request.get("version") != PROTOCOL:
            raise Refused(
                f"this helper speaks protocol {PROTOCOL}, the request {request.get('version')!r}: install the "
                "helper from the same checkout as the service (docs/deployment.md)"
            )
        config = load_config(request)
        try:
            return answer(VERBS[argv[1]](config, request))
        finally:
            close_roots()
    except TooLarge as exc:
        return answer({"error": str(exc), "too_large": True}, 2)
    except Refused as exc:
        return answer({"error": str(exc)}, 2)
    except Exception as exc:  # noqa: BLE001 - whatever broke, the caller gets an answer, not a traceback
        return answer({"error": f"{type(exc).__name__}: {exc}"}, 2)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
