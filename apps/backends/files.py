"""File plumbing shared by the backends whose "remote" is a filesystem (local, Slurm).

A run directory holds ``work/`` (a scratch copy of the case inputs, the command's working
directory), ``stdout``/``stderr`` and ``manifest.json`` (the inputs' hashes, so results are
exactly the files the command created or changed). Symlinks are never followed out of a tree
(R-CASE-7): a command that links ``/etc/passwd`` into its directory gets nothing back for it.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shutil
from pathlib import Path

from apps.backends.base import BackendError

PROGRESS_FILE = ".gridgate/progress"
#: the only worker environment variables a case command inherits (R-BACK-1: the worker's
#: environment holds provider tokens, SECRET_KEY, DATABASE_URL… and none of it may reach a case).
INHERITED_ENVIRONMENT = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
#: top-level names of a working directory that are never results: the campaign's shared inputs
#: (R-CASE-6 of campaigns: never downloaded back) and Gridgate's own control files.
NOT_RESULTS = ("shared", ".gridgate")


def _hash(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def walk_files(root: Path, *, skip_top: tuple[str, ...] = ()):
    """Regular files under ``root`` as (relative posix path, path); symlinks are skipped."""
    if not root.is_dir():
        return
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        rel_dir = Path(dirpath).relative_to(root)
        if rel_dir == Path("."):
            dirnames[:] = [d for d in dirnames if d not in skip_top]
        dirnames[:] = sorted(d for d in dirnames if not (Path(dirpath) / d).is_symlink())
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if path.is_symlink() or not path.is_file():
                continue
            rel = (rel_dir / name).as_posix()
            if rel_dir == Path(".") and name in skip_top:
                continue
            yield rel, path


def prepare_run_dir(run_dir: Path, inputs: Path, shared_dir: Path | None) -> Path:
    """Copy the inputs into ``run_dir/work`` (a scratch copy: the case's ``inputs/`` stay as
    uploaded) and record their hashes. Returns the working directory."""
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
        (work / "shared").symlink_to(shared_dir.resolve(), target_is_directory=True)
    (work / ".gridgate").mkdir(exist_ok=True)
    (run_dir / "manifest.json").write_text(json.dumps(manifest, sort_keys=True))
    return work


def copy_results(run_dir: Path, results: Path) -> list[str]:
    """Copy every file the command created or changed into ``results/``; idempotent on retry.

    Each file is written to a temporary name and renamed, so a failure midway leaves complete
    files only, and the caller's retry rewrites the rest.
    """
    work = run_dir / "work"
    if not work.is_dir():
        raise BackendError(f"the working directory {work} is gone: results cannot be fetched")
    try:
        manifest = json.loads((run_dir / "manifest.json").read_text())
    except (OSError, ValueError) as exc:
        raise BackendError(f"cannot read the inputs manifest of {run_dir}: {exc}") from None
    results.mkdir(parents=True, exist_ok=True)
    copied = []
    for rel, path in walk_files(work, skip_top=NOT_RESULTS):
        if manifest.get(rel) == _hash(path):
            continue
        target = results / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.part")
        shutil.copyfile(path, tmp)
        os.replace(tmp, target)
        copied.append(rel)
    return copied


def sync_live(work: Path, live: Path, globs: list[str]) -> list[str]:
    """Copy the files matching ``globs`` (relative to the working directory) and the progress
    marker into ``live/``."""
    patterns = list(globs or []) + [PROGRESS_FILE]
    copied = []
    for rel, path in walk_files(work, skip_top=("shared",)):
        if not any(fnmatch.fnmatch(rel, pattern) for pattern in patterns):
            continue
        target = live / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.part")
        shutil.copyfile(path, tmp)
        os.replace(tmp, target)
        copied.append(rel)
    return copied


def base_environment(names=INHERITED_ENVIRONMENT) -> dict[str, str]:
    """The harmless part of the worker's environment (never a credential, R-BACK-1)."""
    env = {name: os.environ[name] for name in names if os.environ.get(name)}
    env.setdefault("PATH", DEFAULT_PATH)
    return env


def case_environment(spec) -> dict[str, str]:
    """A case command's whole environment: :func:`base_environment`, the launch specification's
    environment and ``GRIDGATE_CASE_ID``; nothing else from the worker."""
    env = base_environment()
    env.update({str(name): str(value) for name, value in (spec.environment or {}).items()})
    env["GRIDGATE_CASE_ID"] = spec.case_id
    return env


def read_delta(source: Path, already: Path, *, limit: int | None = 4 << 20) -> str:
    """Bytes of ``source`` past the size of ``already`` (the workspace log the core appends to).

    The offset lives on disk, not in memory, so a restarted worker resumes exactly where the
    last one stopped. ``surrogateescape`` round-trips bytes that are not UTF-8 (and a character
    cut at the boundary) unchanged. ``limit`` bounds one read (a chatty job is caught up over
    several polls); ``None`` drains everything, for the last poll of a finished job (R-CASE-5).
    """
    try:
        offset = already.stat().st_size
    except FileNotFoundError:
        offset = 0
    try:
        with source.open("rb") as handle:
            handle.seek(offset)
            data = handle.read() if limit is None else handle.read(limit)
    except FileNotFoundError:
        return ""
    return data.decode("utf-8", "surrogateescape")


def read_progress(path: Path) -> float | None:
    try:
        value = float(path.read_text().strip().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if value != value or value < 0:  # NaN or negative: ignore a garbled marker
        return None
    return min(value, 1.0)
