"""Case and campaign workspaces on local disk (R-CASE-5, R-CASE-7).

``GRIDGATE_CASES_ROOT/<case id>/`` holds ``inputs/``, ``live/`` (synced while running),
``results/`` (final), ``stdout.log`` and ``stderr.log``; ``GRIDGATE_CASES_ROOT/campaigns/<id>/shared/``
holds a campaign's shared inputs. Every path that comes from a request goes through
:func:`confined` so nothing outside a workspace is ever read or written.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import uuid
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from django.conf import settings
from django.core.exceptions import ValidationError

from apps.backends import files
from apps.core import cases_root as root_dir
from apps.core.exceptions import Conflict, InsufficientStorage, PayloadTooLarge, Unavailable

log = logging.getLogger(__name__)

LAYOUT_DIRS = ("inputs", "live", "results")
LOGS = {"stdout": "stdout.log", "stderr": "stderr.log"}


def cases_root() -> Path:
    return root_dir.cases_root()


def ensure_cases_root() -> Path:
    """The cases root, 0711 (:func:`apps.core.cases_root.ensure_cases_root`). One the service
    cannot close to other accounts refuses new workspaces (503) rather than create them there;
    the log and ``manage.py doctor`` name the fix."""
    try:
        return root_dir.ensure_cases_root()
    except root_dir.CasesRootError as exc:
        log.error("%s", exc)
        raise Unavailable(
            "Case workspaces cannot be created now: the cases root is misconfigured (an operator must fix it; "
            "'manage.py doctor' says how)."
        ) from None


def no_room(what: str) -> InsufficientStorage:
    """507 for a write the cases disk had no room for, with what is left (its caller has removed
    what it had begun: nothing half-written stays)."""
    free = root_dir.free_bytes() or 0
    log.warning("the cases disk is full (%s bytes free under %s): %s refused", free, cases_root(), what)
    return InsufficientStorage(
        f"The disk that holds case workspaces is full: {what} could not be stored and nothing was kept. "
        "Try again once an operator has made room.",
        free_bytes=free,
    )


def case_dir(case_id) -> Path:
    return cases_root() / str(case_id)


def campaign_shared_dir(campaign_id) -> Path:
    return cases_root() / "campaigns" / str(campaign_id) / "shared"


def create_campaign_dir(campaign_id) -> Path:
    """R-CASE-8: ``campaigns/`` and ``campaigns/<id>/`` are the service's alone (0700), so no
    account on the host reaches another user's shared inputs by guessing a campaign id. Local
    cases see ``shared/`` through the sandbox's read-only bind mount (which does not traverse
    the parents), Slurm cases get a copy owned by their account, remote backends upload it."""
    ensure_cases_root()
    shared = campaign_shared_dir(campaign_id)
    try:
        for directory in (shared.parent.parent, shared.parent):
            directory.mkdir(mode=0o700, exist_ok=True)
            os.chmod(directory, 0o700)  # also a campaigns/ left 0755 by an earlier version
        shared.mkdir(mode=0o755, exist_ok=True)
    except OSError as exc:
        if not root_dir.is_disk_full(exc):
            raise
        shutil.rmtree(shared.parent, ignore_errors=True)
        raise no_room("the campaign's directory") from None
    return shared


def create_case_dir(case_id) -> Path:
    """R-CASE-8: the workspace is the service's: nobody else lists or reads it. The case
    directory itself is only traversable (0711) so a Slurm job running as its owner can reach its
    own run directory (``.run/``) when the pool has no ``working_root``."""
    ensure_cases_root()
    root = case_dir(case_id)
    try:
        root.mkdir(mode=0o711, exist_ok=True)
        for name in LAYOUT_DIRS:
            (root / name).mkdir(mode=0o700, exist_ok=True)
        for name in LOGS.values():
            os.close(files.open_for_write(root / name, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW))
    except OSError as exc:
        if not root_dir.is_disk_full(exc):
            raise
        shutil.rmtree(root, ignore_errors=True)
        raise no_room("the case's workspace") from None
    return root


def confined(root: Path, relative: str) -> Path:
    """R-CASE-7: ``root/relative`` if it stays inside ``root`` once symlinks are resolved.

    Refuses absolute paths, ``..`` components, NUL bytes and any symlink leading out. A backslash
    is an ordinary character of a POSIX name (a command may make ``a\\b``): only uploads refuse
    it (:func:`save_uploads`), since a client's ``C:\\x`` means a directory there.
    """
    if not relative or "\x00" in relative:
        raise ValidationError({"path": ["Invalid path."]})
    pure = PurePosixPath(relative)
    if pure.is_absolute() or any(part == ".." for part in pure.parts):
        raise ValidationError(
            {"path": ["Paths are relative to the case workspace: no '/' prefix, no '..' (R-CASE-7)."]}
        )
    base = root.resolve()
    target = (base / pure).resolve(strict=False)
    if not target.is_relative_to(base):
        raise ValidationError({"path": ["This path leads out of the case workspace (R-CASE-7)."]})
    return target


@dataclass(frozen=True)
class FileListing:
    """The listable files of a workspace from one walk: relative paths in path order, and how
    many files were left out because their names are not UTF-8 text.

    A command names its files as it likes. A name with a newline or another control character
    is listed (JSON escapes it, pages show it through :func:`apps.core.text.printable`, links
    percent-encode it). A name with bytes that are not UTF-8 cannot be written in JSON, a URL
    or a page without being changed into another name, so it is counted in ``unlisted`` and
    not served: the command should rename it."""

    base: Path
    paths: list[str] = field(default_factory=list)
    unlisted: int = 0


def _is_text(path: str) -> bool:
    try:
        path.encode("utf-8")  # a name that is not UTF-8 reads back with lone surrogates
    except UnicodeEncodeError:
        return False
    return True


def file_listing(root: Path) -> FileListing:
    """Regular files of a workspace, in path order, without reading their sizes: a case may hold
    tens of thousands and a page shows a few hundred (:func:`file_entries` reads those). One
    ``scandir`` walk (file types come with the directory entries) and one sort. Hidden top-level
    entries (backend run directories and state, staging), ``.part`` files being copied in, and
    symlinks are not listed."""
    if not root.is_dir():
        return FileListing(base=root)
    base = root.resolve()
    paths, unlisted = [], 0
    pending = [(str(base), "")]
    while pending:
        directory, prefix = pending.pop()
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    if not prefix and entry.name.startswith("."):
                        continue
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            pending.append((entry.path, f"{prefix}{entry.name}/"))
                            continue
                        if not entry.is_file(follow_symlinks=False) or entry.name.endswith(".part"):
                            continue
                    except OSError:  # gone meanwhile
                        continue
                    path = prefix + entry.name
                    if _is_text(path):
                        paths.append(path)
                    else:
                        unlisted += 1
        except OSError:  # a directory removed meanwhile
            continue
    paths.sort()
    return FileListing(base=base, paths=paths, unlisted=unlisted)


def file_entries(listing: FileListing, paths) -> list[dict]:
    """``[{"path", "size"}]`` for ``paths`` of ``listing`` (one page of it); a file that is gone
    or no longer a regular file since the walk is left out."""
    out = []
    for path in paths:
        try:
            info = os.lstat(listing.base / path)
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode):
            out.append({"path": path, "size": info.st_size})
    return out


def list_files(root: Path) -> list[dict]:
    """Every listable file of a small tree, ``[{"path", "size"}]`` in path order (a campaign's
    shared inputs; a case workspace is listed a page at a time)."""
    listing = file_listing(root)
    return file_entries(listing, listing.paths)


def upload_limit_bytes() -> int:
    return settings.GRIDGATE_MAX_UPLOAD_MB * 1024 * 1024


def check_upload_size(size: int) -> None:
    """R-CASE-7: ``size`` bytes of uploads are refused (413 naming the limit) above the limit."""
    if size > upload_limit_bytes():
        raise PayloadTooLarge(f"Uploads are limited to {settings.GRIDGATE_MAX_UPLOAD_MB} MB (GRIDGATE_MAX_UPLOAD_MB).")


def check_content_length(request) -> None:
    """Refuse an oversized request before its body is parsed (R-CASE-7: 413, nothing written)."""
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    check_upload_size(length)


def save_uploads(dest: Path, uploads) -> list[str]:
    """Write uploaded files into ``dest`` all or nothing (R-CASE-7); an existing name is a 409.

    Files are first written to a staging directory beside ``dest`` and moved into place only
    once every one is complete, so an oversized or failing upload leaves nothing half-written.
    """
    uploads = list(uploads or [])
    if not uploads:
        return []
    total = sum(upload.size or 0 for upload in uploads)
    check_upload_size(total)
    names = []
    for upload in uploads:
        name = os.path.basename(upload.name or "")
        if not name or name in {".", ".."} or name.startswith(".") or "\\" in name:
            raise ValidationError({"inputs": [f"Invalid file name {upload.name!r}."]})
        if len(name.encode("utf-8", "surrogatepass")) > 255:  # the filesystem's limit is bytes, not characters
            raise ValidationError({"inputs": [f"File name too long (over 255 bytes): {name[:40]!r}…"]})
        confined(dest, name)
        names.append(name)
    if len(set(names)) != len(names):
        raise ValidationError({"inputs": ["Two uploaded files have the same name."]})
    free = root_dir.free_bytes()
    if free is not None and total > free:  # refused before a byte is written
        raise no_room(f"{len(uploads)} uploaded file(s) of {total} bytes")
    try:
        return _save_staged(dest, names, uploads)
    except OSError as exc:
        if not root_dir.is_disk_full(exc):
            raise
        raise no_room(f"{len(uploads)} uploaded file(s) of {total} bytes") from None


def _save_staged(dest: Path, names: list[str], uploads) -> list[str]:
    dest.mkdir(parents=True, exist_ok=True)
    staging = dest.parent / f".upload-{uuid.uuid4().hex}"
    staging.mkdir()
    try:
        written = 0
        for name, upload in zip(names, uploads, strict=True):
            with (staging / name).open("wb") as handle:
                for chunk in upload.chunks():
                    written += len(chunk)
                    check_upload_size(written)  # the declared size may lie
                    handle.write(chunk)
        # Never overwrite an earlier input silently: link, which fails on an existing name even
        # when two uploads race, and undo this call's links on a refusal.
        placed = []
        try:
            for name in names:
                os.link(staging / name, dest / name)
                placed.append(name)
        except FileExistsError:
            for name in placed:
                (dest / name).unlink(missing_ok=True)
            clash = next(name for name in names if name not in placed)
            raise Conflict(
                f"An input named {clash!r} already exists; inputs are never overwritten: upload it under another name.",
                file=clash,
            ) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return names


def append_logs(root: Path, stdout: str, stderr: str) -> dict[str, list[int]]:
    """R-CASE-5: append output deltas to the workspace logs (bytes round-trip exactly), each log
    kept within ``GRIDGATE_CASE_MAX_LOG_MB``, never through a symlink (R-CASE-8). Returns what a
    full disk kept out, ``{stream: [lines, bytes]}`` (empty when everything went in): a provider's
    delta is not offered twice, so it is counted for :func:`widen_log_gap`'s note."""
    lost = {}
    for stream, text in (("stdout", stdout), ("stderr", stderr)):
        if not text:
            continue
        data = text.encode("utf-8", "surrogateescape")
        try:
            files.append_log(root / LOGS[stream], data, cap=files.log_cap_bytes())
        except OSError as exc:
            if not root_dir.is_disk_full(exc):
                raise
            rest = data[getattr(exc, "written", 0) :]
            lost[stream] = [rest.count(b"\n") + (0 if rest.endswith(b"\n") else 1), len(rest)]
    return lost


def widen_log_gap(gap: dict, now, lost: dict[str, list[int]] | None) -> dict:
    """``gap`` (a case's ``log_gap``) extended to ``now`` with what a full disk kept out: counted
    lines and bytes per log, or (``lost`` None: output the backend copies from its own files, which
    the command could not write either) a stretch whose output may be missing."""
    widened = {"since": gap.get("since") or now.isoformat(), "until": now.isoformat()}
    for stream in LOGS:
        lines, size = gap.get(stream) or [0, 0]
        more = (lost or {}).get(stream) or [0, 0]
        if lines + more[0] or size + more[1]:
            widened[stream] = [lines + more[0], size + more[1]]
    if lost is None or gap.get("uncounted"):
        widened["uncounted"] = True
    return widened


def _when(text: str) -> str:
    from datetime import datetime

    return datetime.fromisoformat(text).strftime("%Y-%m-%d %H:%M:%S UTC")


def write_log_gap_notes(root: Path, gap: dict) -> bool:
    """Write, in each log the gap touched, a line saying what it could not keep and when; True
    once written (the caller clears the gap), False while the disk is still full."""
    when = f"from {_when(gap['since'])} to {_when(gap['until'])}"
    notes = {}
    for stream in LOGS:
        counted = gap.get(stream)
        if counted:
            notes[stream] = (
                f"[gridgate: {counted[0]} line(s) ({counted[1]} bytes) of this log could not be kept: the cases disk "
                f"was full {when}]"
            )
        elif gap.get("uncounted"):
            notes[stream] = f"[gridgate: the cases disk was full {when}: output written meanwhile may be missing here]"
    try:
        for stream, note in notes.items():
            files.append_log(root / LOGS[stream], f"\n{note}\n".encode(), cap=files.log_cap_bytes())
    except OSError as exc:
        if not root_dir.is_disk_full(exc):
            raise
        return False
    return True


def open_file(path: Path):
    """A binary file object on ``path`` if it is a regular file reached without following a
    symlink at its last component (R-CASE-7, R-CASE-8), else None."""
    fd = files.open_regular(path)
    return os.fdopen(fd, "rb") if fd is not None else None


LOG_CHUNK = 1024 * 1024  # most of a log one ``offset`` read returns


def read_from(path: Path, offset: int, limit: int = LOG_CHUNK) -> tuple[str, int]:
    """The log's text from byte ``offset`` (at most ``limit`` bytes, ending on a whole UTF-8
    character) and the offset to read from next: how a client follows a log as it grows
    (``gridgate case logs -f``) without reading it again. A log that is not a regular file reads
    as empty (R-CASE-8)."""
    handle = open_file(path)
    if handle is None:
        return "", offset
    with handle:
        size = os.fstat(handle.fileno()).st_size
        if offset >= size:
            return "", size
        handle.seek(offset)
        data = handle.read(min(limit, size - offset))
    # A multi-byte character cut by the limit (or still being written) is left for the next read.
    for cut in range(min(3, len(data)) + 1):
        try:
            return data[: len(data) - cut].decode("utf-8"), offset + len(data) - cut
        except UnicodeDecodeError:
            continue
    return data.decode("utf-8", "replace"), offset + len(data)  # not UTF-8 text: shown, not stuck on


def tail(path: Path, lines: int) -> str:
    """The last ``lines`` lines of a log, reading at most a bounded block from the end. A log
    that is not a regular file (a planted symlink, R-CASE-8) reads as empty."""
    handle = open_file(path)
    if handle is None:
        return ""
    with handle:
        size = os.fstat(handle.fileno()).st_size
        block = min(size, max(64 * 1024, lines * 512))
        handle.seek(size - block)
        data = handle.read()
    text = data.decode("utf-8", "replace")
    parts = text.splitlines(keepends=True)
    if block < size and parts:
        parts = parts[1:]  # the first line was cut by the block boundary
    return "".join(parts[-lines:]) if lines > 0 else ""


ARCHIVE_CHUNK = 256 * 1024


def archive_stream(root: Path, top: str):
    """The workspace's listed files (:func:`file_listing`: the files the API lists and serves) as a
    gzip-compressed tar, produced while it is sent: bytes come out a chunk at a time, so memory
    stays bounded and nothing is written to disk (no copy of a workspace beside it, which the
    class's ``max_storage`` bounds). Members are ``top/<path>``, regular files only, each read as
    a download is (:func:`confined`, no symlink followed, R-CASE-7/8); a file that changed
    size while being read (a running case) is cut or padded to the size its header announced,
    and one gone meanwhile is left out."""
    import tarfile
    import zlib

    compressor = zlib.compressobj(6, zlib.DEFLATED, 31)  # wbits 31: a gzip stream
    listing = file_listing(root)
    for path in listing.paths:
        try:
            handle = open_file(confined(root, path))
        except ValidationError:
            handle = None
        if handle is None:
            continue
        with handle:
            info = os.fstat(handle.fileno())
            member = tarfile.TarInfo(f"{top}/{path}")
            member.size, member.mtime, member.mode = info.st_size, int(info.st_mtime), 0o644
            header = member.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
            yield compressor.compress(header)
            left = info.st_size
            while left:
                data = handle.read(min(ARCHIVE_CHUNK, left))
                if not data:  # shrank meanwhile: keep the announced size
                    data = b"\0" * min(ARCHIVE_CHUNK, left)
                left -= len(data)
                out = compressor.compress(data)
                if out:
                    yield out
            padding = -info.st_size % tarfile.BLOCKSIZE
            if padding:
                yield compressor.compress(b"\0" * padding)
    yield compressor.compress(b"\0" * (2 * tarfile.BLOCKSIZE))  # end-of-archive marker
    yield compressor.flush()
