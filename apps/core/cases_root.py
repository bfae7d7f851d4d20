"""The cases root, ``GRIDGATE_CASES_ROOT``: made 0711 by whichever process needs it first.

It holds every user's workspace. Other accounts on the host may traverse it (a Slurm job running
as its owner reaches its own ``<case>/.run/work/``) but never list it: the case ids it would list
are the names under which each case's files can then be reached (R-CASE-8). Web requests, the
worker heartbeat and ``manage.py doctor`` may each be the first to create it, so they all go
through :func:`ensure_cases_root`. It lives in ``apps.core`` because the heartbeat (core), the
backends and the case workspaces all need it, and core imports neither of the others.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path

from django.conf import settings

ROOT_MODE = 0o711
#: what other accounts must not have on the root: listing it (read) and adding to it (write)
OPEN_TO_OTHERS = stat.S_IRGRP | stat.S_IWGRP | stat.S_IROTH | stat.S_IWOTH


class CasesRootError(OSError):
    """The cases root is open to other accounts and is not the service's to close. An
    ``OSError``: callers that report a cases root they cannot write (the heartbeat, doctor)
    report this one the same way."""


def cases_root() -> Path:
    return Path(settings.GRIDGATE_CASES_ROOT)


def ensure_cases_root() -> Path:
    """The cases root, created 0711 if missing (whatever the umask: a umask of 077 would make it
    0700 and shut out the Slurm jobs that traverse it). An existing root that others may list or
    write is set to 0711 when it is the service's; someone else's raises :class:`CasesRootError`
    naming the fix, rather than leaving every workspace name listable."""
    root = cases_root()
    root.parent.mkdir(parents=True, exist_ok=True)  # the parents keep the umask's mode: traversable
    try:
        root.mkdir(mode=ROOT_MODE)
        created = True
    except FileExistsError:
        created = False
    # The root may be a symlink the operator made (to a shared file system): followed on purpose.
    # Fixed through the fd, so the directory checked is the one changed.
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        mode = stat.S_IMODE(info.st_mode)
        if created or mode & OPEN_TO_OTHERS:
            if info.st_uid != os.geteuid():
                raise CasesRootError(
                    f"the cases root {root} is mode {mode:04o} (other accounts can list every case "
                    f"workspace) and belongs to uid {info.st_uid}, not to the service (uid {os.geteuid()}): "
                    f"run 'chmod 0711 {root}' as its owner, or chown it to the service (R-CASE-8)"
                )
            os.fchmod(fd, ROOT_MODE)
    finally:
        os.close(fd)
    return root


def cases_root_check() -> tuple[bool, str]:
    """``manage.py doctor``'s check: the root exists (now), mode 0711, closed to other accounts."""
    root = cases_root()
    try:
        before = stat.S_IMODE(os.stat(root).st_mode) if root.exists() else None
        ensure_cases_root()
    except OSError as exc:
        return False, str(exc) if isinstance(exc, CasesRootError) else f"{root} cannot be created ({exc})"
    if before is None:
        return True, f"{root} created, mode 0711 (others may traverse it, not list it)"
    if before & OPEN_TO_OTHERS:
        return True, f"{root} was mode {before:04o}, readable by other accounts: now 0711"
    return True, f"{root} is mode {before:04o}: other accounts cannot list it"


# -- free space (a full disk is a clear answer, not a 500) -------------------------------------------
#: the errors of a file system without room: no space left, or the account's quota reached
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in DISK_FULL


def free_bytes() -> int | None:
    """Free bytes for the service on the cases root's file system (``statvfs``'s ``f_bavail``;
    before the root exists, on the directory it will be made in), or None when it cannot be read."""
    path = cases_root()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def min_free_bytes() -> int:
    return settings.GRIDGATE_CASES_MIN_FREE_MB * 1024 * 1024


def low_on_space(free: int | None) -> bool:
    """Below ``GRIDGATE_CASES_MIN_FREE_MB``: new cases are refused, health is degraded."""
    return free is not None and free < min_free_bytes()


def space_check() -> tuple[bool, str]:
    """``manage.py doctor``'s check of the room left under the cases root."""
    root, free = cases_root(), free_bytes()
    if free is None:
        return False, f"{root} cannot be read to measure its free space"
    if low_on_space(free):
        return False, (
            f"{free / 2**20:.0f} MiB free under {root}, below GRIDGATE_CASES_MIN_FREE_MB "
            f"({settings.GRIDGATE_CASES_MIN_FREE_MB} MiB): case launches are refused (507) and health reads "
            "degraded until an operator makes room (cleanup, a larger file system)"
        )
    return True, f"{free / 2**30:.1f} GiB free under {root}"


def writable_ancestor(path: Path) -> Path | None:
    """The first directory above ``path`` (the configured path, and the one it resolves to) that
    the service may write: there it could rename ``path`` away and link another directory in its
    place while the privileged helper, which opens ``path`` as root, works in it. None when every
    one is closed to it, or when the service is root (nothing to gain)."""
    uid = os.geteuid()
    if uid == 0:
        return None
    groups = {os.getegid(), *os.getgroups()}
    absolute = Path(os.path.abspath(path))
    for start in (absolute, Path(os.path.realpath(absolute))):
        for directory in start.parents:
            try:
                info = os.stat(directory)
            except OSError:
                continue
            if (
                info.st_uid == uid
                or (info.st_mode & stat.S_IWGRP and info.st_gid in groups)
                or (info.st_mode & stat.S_IWOTH and not info.st_mode & stat.S_ISVTX)
            ):
                return directory
    return None


def root_parent_check(path: Path | None = None) -> tuple[bool, str]:
    """doctor's check of a root the privileged helper works in (the cases root, a Slurm working
    root): no directory above it is the service's to write."""
    root = cases_root() if path is None else Path(path)
    writable = writable_ancestor(root)
    if writable is not None:
        return False, (
            f"{writable}, above {root}, is writable by the service: it could swap {root} for a link while the "
            f"privileged helper works in it as root. Make it root's (chown root:root {writable}; chmod 0755 "
            f"{writable}) or move the root below a directory of root's, e.g. /var/lib/gridgate (docs/deployment.md)"
        )
    return True, f"no directory above {root} is the service's to write"
