"""File plumbing of the service's side for the backends whose "remote" is a filesystem (local,
Slurm).

A run directory holds ``work/`` (a scratch copy of the case inputs, the command's working
directory), ``stdout``/``stderr`` and ``manifest.json`` (the inputs' hashes, so results are
exactly the files the command created or changed). The service prepares it; what reads or
changes the case account's files (handing ``work/`` over, bringing results and live files back)
is the privileged helper's (``apps/backends/privileged.py``), which follows no symlink out of a
tree (R-CASE-7): a command that links ``/etc/passwd`` into its directory gets nothing back for it.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import math
import os
import shutil
import stat
from pathlib import Path

from django.conf import settings

from apps.backends.base import BackendError

# One definition of each, the helper's (it imports nothing of the project).
from apps.backends.privileged import DEFAULT_PATH, NOT_RESULTS, PROGRESS_FILE, human_size, open_regular

__all__ = ["DEFAULT_PATH", "NOT_RESULTS", "PROGRESS_FILE", "open_regular"]

#: the only worker environment variables a case command inherits (R-BACK-1: the worker's
#: environment holds provider tokens, SECRET_KEY, DATABASE_URL… and none of it may reach a case).
INHERITED_ENVIRONMENT = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")


def _hash(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def walk_files(root: Path):
    """Regular files under ``root`` as (relative posix path, path); symlinks are skipped."""
    if not root.is_dir():
        return
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        rel_dir = Path(dirpath).relative_to(root)
        dirnames[:] = sorted(d for d in dirnames if not (Path(dirpath) / d).is_symlink())
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if path.is_file() and not path.is_symlink():
                yield (rel_dir / name).as_posix(), path


def open_for_write(path: Path, flags: int) -> int:
    """Open a file the service writes in a workspace (0600 if new), never through a symlink planted
    there (R-CASE-8; the command's own tree is read by the privileged helper, through fds)."""
    return os.open(path, flags | os.O_NOFOLLOW, 0o600)


def write_private(path: Path, data: bytes = b"") -> None:
    """Write a control file of a run directory (``job.sh``, ``manifest.json``, ``stdout``…) as a
    new file, mode 0600, the service's (a job script holds the user's command, which may carry a
    secret). Created with ``O_EXCL | O_NOFOLLOW`` after removing any old one: never written through
    a symlink, nor into an earlier file that another account may own or still hold open. The caller
    hands it to the job's account when that account must own it."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def unsafe_parent(directory: Path) -> str | None:
    """Why the service must not create run directories in ``directory``, or None. Others may
    write there and no sticky bit stops them renaming our directory away (and a symlink into its
    place) between our checks and our writes (R-CASE-8). Used by the submit and by ``doctor``."""
    info = os.stat(directory)
    writable_by_others = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if info.st_uid != os.geteuid() and writable_by_others and not info.st_mode & stat.S_ISVTX:
        return (
            f"{directory} is writable by other accounts without the sticky bit: make it 1777 "
            "(as /scratch is) or the service's own (R-CASE-8)"
        )
    return None


def service_run_dir(path: Path, mode: int) -> None:
    """Create ``path`` as the service's own directory with ``mode``, or reuse it only if it already
    is one (a submit retried). R-CASE-8: a run directory under a shared ``working_root`` may have
    been planted by a user who knows their case id: a symlink (to another user's files, or
    anywhere root may write) or a directory they own (whose ``job.sh`` they could swap) is refused,
    never followed or adopted. ``working_root`` itself must be sticky (1777, as /scratch is) or the
    service's, so nobody renames the checked directory away (docs/backends.md)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    problem = unsafe_parent(path.parent)
    if problem:
        raise BackendError(problem)
    try:
        path.mkdir(mode=mode)
    except FileExistsError:
        pass
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)  # a symlink: OSError (ELOOP)
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            raise BackendError(f"{path} exists and is not the service's: refusing to use it (R-CASE-8)")
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def prepare_run_dir(run_dir: Path, inputs: Path, shared_dir: Path | None, *, shared="link") -> Path:
    """Copy the inputs into ``run_dir/work`` (a scratch copy: the case's ``inputs/`` stay as
    uploaded) and record their hashes. Returns the working directory.

    ``shared``: how the campaign's shared inputs appear as ``work/shared``: ``"link"`` (a symlink,
    for a command that can reach the cases root), ``"copy"`` (a command running as a user account
    cannot, R-CASE-8) or ``"mount"`` (the sandbox binds it there). The tree is the service's: the
    privileged helper hands it to the case's account when it starts the case.
    """
    work = run_dir / "work"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    manifest = {}
    for rel, path in walk_files(inputs):
        target = work / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
        manifest[rel] = _hash(target)
    if shared_dir is not None and shared_dir.is_dir():
        if shared == "link":
            (work / "shared").symlink_to(shared_dir.resolve(), target_is_directory=True)
        elif shared == "copy":
            shutil.copytree(shared_dir, work / "shared", symlinks=False)
        else:
            (work / "shared").mkdir()
    (work / ".gridgate").mkdir(exist_ok=True)
    # The service's record of what the inputs were: only the service reads it.
    write_private(run_dir / "manifest.json", json.dumps(manifest, sort_keys=True).encode())
    return work


def base_environment(names=INHERITED_ENVIRONMENT) -> dict[str, str]:
    """The harmless part of the worker's environment (never a credential, R-BACK-1)."""
    env = {name: os.environ[name] for name in names if os.environ.get(name)}
    env.setdefault("PATH", DEFAULT_PATH)
    return env


def case_environment(spec) -> dict[str, str]:
    """A case command's whole environment: a minimal PATH, the launch specification's
    environment and ``GRIDGATE_CASE_ID``; nothing from the worker, not even its PATH or HOME
    (R-BACK-1, R-CASE-8)."""
    env = {"PATH": DEFAULT_PATH}
    env.update({str(name): str(value) for name, value in (spec.environment or {}).items()})
    env["GRIDGATE_CASE_ID"] = spec.case_id
    return env


def log_cap_bytes() -> int:
    """How much of each of a case's logs is kept (``GRIDGATE_CASE_MAX_LOG_MB``)."""
    return settings.GRIDGATE_CASE_MAX_LOG_MB * 1024 * 1024


def truncation_note(cap: int) -> bytes:
    limit = human_size(cap)
    note = f"[gridgate: the log reached its limit of {limit} (GRIDGATE_CASE_MAX_LOG_MB): the rest was not kept]"
    return f"\n{note}\n".encode()


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data``. A regular file takes a short write when its disk fills up: the rest
    must be written or reported, never skipped (a log would silently miss its middle). An error
    after part of it was written carries ``written``, how much went in."""
    view, done = memoryview(data), 0
    while done < len(data):
        try:
            count = os.write(fd, view[done:])
        except OSError as exc:
            exc.written = done
            raise
        if count == 0:
            error = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            error.written = done
            raise error
        done += count


def _append_capped(log_fd: int, data: bytes, cap: int) -> int:
    """Append ``data`` to the open log without passing ``cap``; the write that reaches it is cut
    there and followed by a note, once. Returns how much of ``data`` was taken."""
    size = os.fstat(log_fd).st_size
    if size >= cap:
        return 0
    taken = data[: cap - size]
    write_all(log_fd, taken)
    if size + len(taken) >= cap:
        write_all(log_fd, truncation_note(cap))
    return len(taken)


def append_log(log: Path, data: bytes, *, cap: int) -> None:
    """R-CASE-5: append an output delta to a workspace log, never past its cap and never through
    a symlink (R-CASE-8: a log replaced by a link fails the poll with ELOOP instead)."""
    if not data:
        return
    fd = open_for_write(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _append_capped(fd, data, cap)
    finally:
        os.close(fd)


def drain_log(source: Path, log: Path, *, cap: int, limit: int | None = 4 << 20) -> None:
    """Append what ``source`` holds past the size of ``log`` (the workspace log) to it, in 1 MiB
    chunks, at most ``limit`` bytes this call (``None``: to the end, for the last poll of a
    finished job) and never past ``cap``: a gigabyte of output costs a worker a chunk of memory,
    not a gigabyte.

    The offset lives on disk, not in memory, so a restarted worker resumes exactly where the last
    one stopped; the log is locked while it is read and written, so two workers draining at once
    never append one stretch twice. Neither file is read or written through a symlink (R-CASE-8).
    """
    fd = open_for_write(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        offset = os.fstat(fd).st_size
        if offset >= cap:
            return
        src = open_regular(source)
        if src is None:
            return
        try:
            budget = math.inf if limit is None else limit
            while budget > 0:
                chunk = os.pread(src, int(min(1 << 20, budget)), offset)
                if not chunk:
                    break
                taken = _append_capped(fd, chunk, cap)
                offset += taken
                budget -= len(chunk)
                if taken < len(chunk):
                    break  # the cap is reached
        finally:
            os.close(src)
    finally:
        os.close(fd)


def read_progress(path: Path) -> float | None:
    fd = open_regular(path)
    if fd is None:
        return None
    try:
        with os.fdopen(fd, "rb") as handle:
            value = float(handle.read(64).decode("ascii", "replace").strip().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if math.isnan(value) or value < 0:  # ignore a garbled marker
        return None
    return min(value, 1.0)
