"""The FirecREST backend: Slurm jobs on an HPC system through the FirecREST v2 API (pyfirecrest).
docs/backends.md, "firecrest", lists the quirks absorbed here; the ones that shape this module:

- **Remote id = ``<job id>@<system>``**: a class may override the system (``system_name``), and
  the poll pass only has the pool's remote, so the id carries the system it was submitted to.
- **Job name = case id**: ``find`` looks the job up by name before every submission, and so does
  a submission whose answer was lost, so a retried launch adopts its job (R-CASE-1).
- **One job listing per (system, credential) per pass** (R-BACK-4): every case is picked out of
  it by job id; one missing from it is looked up alone, and not knowing it yet is a failed poll,
  never a failure (R-CASE-3).
- **Output deltas** (R-CASE-5) come from ``ops/tail`` at the byte offset the workspace log
  already has, so a restarted worker resumes exactly where the last one stopped.

Remote layout: ``<working_root>/<case id>/`` holds ``work/`` (inputs, the job's working
directory), ``stdout`` and ``stderr``; a campaign's shared inputs are uploaded once to
``<working_root>/campaigns/<campaign id>/shared/`` and linked as ``work/shared``.
"""

from __future__ import annotations

import io
import posixpath
from pathlib import Path

from apps.backends import files, sbatch
from apps.backends.base import (
    AlreadyFinished,
    BackendError,
    BackendState,
    BackendStatus,
    JobRef,
    LaunchOption,
    LaunchOptions,
    PollsMany,
    SubmitSpec,
    duration_seconds,
)
from apps.backends.firecrest.client import Session, _sdk
from apps.backends.firecrest.doctor import FirecrestDoctor
from apps.backends.privileged import glob_matches
from apps.backends.remote import ProviderError, RemoteSession
from apps.backends.remote_common import (
    LIVE_MAX_BYTES,
    confined_target,
    download_atomically,
    load_state,
    save_state,
)
from apps.backends.slurm import ended, launch_form
from apps.backends.slurm import map_state as slurm_state

FIND_AFTER_TIMEOUT_ATTEMPTS = 3
FIND_AFTER_TIMEOUT_SLEEP = 1.0
MAX_DELTA_CHARS = 4 << 20
MAX_WALK_ENTRIES = 5000
STATE_DIR = ".firecrest"  # hidden in the case workspace: not listed, not a result


def map_state(raw, exit_code=None) -> str:
    """Slurm state(s) → BackendStatus. A list or comma-joined value ends only when every part
    has; then the worst part decides. COMPLETED with a non-zero exit code is a failure."""
    if isinstance(raw, list | tuple):
        words = [str(w) for w in raw]
    else:
        words = str(raw or "").split(",")
    mapped = [slurm_state(word) for word in words if word.strip()]
    if not mapped:
        return BackendStatus.PENDING
    if all(status in BackendStatus.TERMINAL for status in mapped):
        for worst in (BackendStatus.FAILED, BackendStatus.CANCELLED):
            if worst in mapped:
                return worst
        code = _exit_code(exit_code)
        return BackendStatus.SUCCEEDED if code in (None, 0) else BackendStatus.FAILED
    if BackendStatus.RUNNING in mapped or any(status in BackendStatus.TERMINAL for status in mapped):
        return BackendStatus.RUNNING
    return BackendStatus.PENDING


def _exit_code(value) -> int | None:
    try:
        return int(str(value).split(":")[0])  # a number, or Slurm's "code:signal"
    except ValueError:
        return None  # None, "", anything else


def split_remote_id(remote_id: str, default_system: str) -> tuple[str, str]:
    job_id, sep, system = str(remote_id).partition("@")
    return job_id, (system if sep and system else default_system)


class FirecrestBackend(PollsMany, FirecrestDoctor):
    needs = (("working_root", "it has no working directory on the cluster"),)

    def session(self, ref: SubmitSpec | JobRef) -> Session:
        """A submission's system is its class's override, else the pool's; a job's is in its id."""
        if isinstance(ref, SubmitSpec):
            return Session(ref.pool_remote, ref.environment.get("RSC_FIRECREST_SYSTEM_NAME"), ref.identity)
        session = Session(ref.pool_remote, identity=ref.identity)
        session.system = split_remote_id(ref.remote_id, session.system)[1]
        return session

    # -- submission --------------------------------------------------------------------------
    def find_in(self, session: Session, case_id: str) -> str | None:
        firecrest, _ = _sdk()

        def lookup(client):
            try:
                return client.job_info(session.system, name=case_id)
            except firecrest.NotImplementedOnAPIversion:  # API < 2.6 has no name filter: filter here
                return client.job_info(session.system)

        try:
            jobs = RemoteSession.call(session, "job lookup", lookup)  # a function, not one SDK method
        except ProviderError as exc:
            if exc.status == 404:
                return None
            raise
        ids = [str(job.get("jobId")) for job in jobs or [] if job.get("name") == case_id and job.get("jobId")]
        ids = [i for i in ids if i.isdigit()]
        return f"{max(ids, key=int)}@{session.system}" if ids else None

    def job_script(self, spec: SubmitSpec, rdir: str) -> str:
        """R-BACK-4: ``#SBATCH`` lines from the launch specification and the (already allowed)
        launch options, through the renderer the Slurm backend uses too."""
        return sbatch.render(
            job_name=spec.case_id,
            run_dir=rdir,
            batch_directives=spec.batch_directives,
            launch_options=spec.launch_options,
            environment={**spec.environment, "GRIDGATE_CASE_ID": spec.case_id},
            command=spec.command,
            export_none=False,
            make_progress_dir=True,
            wall_seconds=sbatch.wall_seconds(spec),
        )

    def _upload_tree(self, session: Session, local_root: Path, remote_root: str, heartbeat) -> dict[str, list]:
        """Upload every regular file under ``local_root``; returns {rel: [size, sha256]}."""
        manifest = {}
        made = {remote_root}
        account = session.remote.get("account")
        for rel, path in files.walk_files(local_root):
            heartbeat()  # renew the launch lease between uploads (R-CASE-1)
            directory, name = posixpath.split(posixpath.join(remote_root, rel))
            if directory not in made:
                session.call(f"mkdir {directory}", "mkdir", session.system, directory, create_parents=True)
                made.add(directory)
            # pyfirecrest sends files under ~1 MiB to ops/upload and larger ones through the
            # transfer endpoints (S3 staging + a transfer job), blocking until they land.
            session.call(f"upload of {rel}", "upload", session.system, str(path), directory, name, account=account)
            manifest[rel] = [path.stat().st_size, files._hash(path)]
        return manifest

    def _upload_shared(self, session: Session, shared_dir: Path, heartbeat) -> str:
        """A campaign's shared inputs, uploaded once per campaign (a marker says it is complete)."""
        campaign_root = posixpath.join(session.working_root, "campaigns", shared_dir.parent.name)
        target = posixpath.join(campaign_root, "shared")
        marker = posixpath.join(campaign_root, ".gridgate-complete")
        try:
            session.call("stat of the shared-inputs marker", "stat", session.system, marker)
            return target
        except ProviderError as exc:
            if exc.status != 404:
                raise
        session.call(f"mkdir {target}", "mkdir", session.system, target, create_parents=True)
        self._upload_tree(session, shared_dir, target, heartbeat)
        session.call(
            "upload of the shared-inputs marker", "upload", session.system, io.BytesIO(b"ok\n"), campaign_root,
            ".gridgate-complete", file_size=3,
        )  # fmt: skip
        return target

    def submit_as(self, session: Session, spec: SubmitSpec) -> str:
        rdir = session.run_dir(spec.case_id)
        work = posixpath.join(rdir, "work")
        script = self.job_script(spec, rdir)  # validates launch options before anything is sent
        session.call(f"mkdir {work}", "mkdir", session.system, posixpath.join(work, ".gridgate"), create_parents=True)
        manifest = self._upload_tree(session, spec.inputs_dir, work, spec.heartbeat)
        if spec.shared_dir is not None and spec.shared_dir.is_dir():
            target = self._upload_shared(session, spec.shared_dir, spec.heartbeat)
            try:
                session.call("link of shared/", "symlink", session.system, target, posixpath.join(work, "shared"))
            except ProviderError as exc:
                if exc.status not in (400, 409):  # already linked by an earlier attempt
                    raise
        save_state(spec.workspace, STATE_DIR, "manifest.json", manifest)
        spec.heartbeat()  # last check that the launch is still ours before the job exists
        try:
            answer = session.call("job submission", "submit", session.system, working_dir=work, script_str=script)
        except ProviderError as exc:
            if not exc.maybe_done:
                raise
            # The request may have reached Slurm: adopt the job if it is there (R-CASE-1).
            find = lambda: self.find_in(session, spec.case_id)  # noqa: E731
            pause = FIND_AFTER_TIMEOUT_SLEEP
            return self.adopt_or_uncertain(find, exc, spec, "job", attempts=FIND_AFTER_TIMEOUT_ATTEMPTS, pause=pause)
        job_id = str(answer.get("jobId") or "")
        if not job_id.isdigit():
            raise BackendError(f"FirecREST answered {answer!r} instead of a job id")
        return f"{job_id}@{session.system}"

    # -- observation -----------------------------------------------------------------------
    def poll_many(self, jobs: list[JobRef]) -> dict[str, BackendState | Exception]:
        groups: dict[tuple, tuple[Session, list[JobRef]]] = {}
        for job in jobs:
            session = self.session(job)
            groups.setdefault(session.group_key, (session, []))[1].append(job)
        out: dict[str, BackendState | Exception] = {}
        for session, group in groups.values():
            out.update(self._poll_group(session, group))
        return out

    def _poll_group(self, session: Session, group: list[JobRef], *, output: bool = True):
        try:
            listing = session.call("job listing", "job_info", session.system)  # the one status call
        except BackendError as exc:
            return {job.remote_id: exc for job in group}
        out: dict[str, BackendState | Exception] = {}
        for job in group:
            try:
                entry = _entry_for(listing, job, session.system)
                if entry is None:
                    entry = self._lookup_one(session, job)
                if entry is ALLOCATION:
                    # Only the allocation record is visible: nothing new, not a failed poll. The
                    # core never moves a running case back to pending, so no state regresses.
                    out[job.remote_id] = BackendState(status=BackendStatus.PENDING)
                else:
                    out[job.remote_id] = self._state(session, job, entry, output=output)
            except Exception as exc:  # one bad job must not fail the others' polls
                out[job.remote_id] = exc
        return out

    def _lookup_one(self, session: Session, job: JobRef):
        job_id, _system = split_remote_id(job.remote_id, session.system)
        try:
            entries = session.call(f"lookup of job {job_id}", "job_info", session.system, job_id)
        except ProviderError as exc:
            if exc.status == 404:
                # Right after submit FirecREST may not know the job yet: a failed poll (R-CASE-3).
                raise BackendError(f"FirecREST does not know job {job_id} (yet)") from None
            raise
        entry = _entry_for(entries, job, session.system)
        if entry is None:
            # A job that has just finished can be missing for ~3 s (slurmctld has let it go and
            # accounting has not caught up): a failed poll, never a state (R-CASE-3).
            raise BackendError(f"FirecREST does not list job {job_id} for case {job.case_id} (yet)")
        return entry

    def _state(self, session: Session, job: JobRef, entry: dict, *, output: bool = True) -> BackendState:
        status_info = entry.get("status") or {}
        raw = status_info.get("state")
        exit_code = status_info.get("exitCode")
        status = map_state(raw, exit_code)
        final = status in BackendStatus.TERMINAL
        elapsed = (entry.get("time") or {}).get("elapsed")
        if isinstance(elapsed, str):
            elapsed = duration_seconds(elapsed, "-")
        stdout = stderr = ""
        if status != BackendStatus.PENDING and output:
            try:
                stdout = self._delta(session, job, "stdout", final)
                stderr = self._delta(session, job, "stderr", final)
            except BackendError:
                if final:
                    raise  # the last output must be caught up before the case ends
                stdout = stderr = ""  # caught up at the next poll: the offset lives on disk
        message = ""
        if status == BackendStatus.FAILED:
            words = ",".join(raw) if isinstance(raw, list) else str(raw or "")
            message = ended(entry.get("jobId"), words, exit_code)
            reason = status_info.get("stateReason")
            if reason and reason != "None":
                message += f": {reason}"
        return BackendState(
            status=status,
            stdout_delta=stdout,
            stderr_delta=stderr,
            execution_time=float(elapsed) if isinstance(elapsed, int | float) else None,
            message=message,
        )

    def _delta(self, session: Session, job: JobRef, stream: str, final: bool) -> str:
        """The job's remote ``stream`` file past the bytes the workspace log already has (R-CASE-5).

        The server runs ``tail --bytes=+N``: a 1-based start (``+1`` is the whole file) and
        ``bytes=0`` drops the option (the last 10 lines). So the 0-based offset ``k`` is asked
        as ``k + 1``. The content comes back as text: a multi-byte character cut at the end of
        the file (still being written) arrives as U+FFFD; it is left for the next poll, which
        starts at its first byte, except in the last poll of a finished job."""
        try:
            offset = (job.workspace / f"{stream}.log").stat().st_size
        except FileNotFoundError:
            offset = 0
        remote_path = posixpath.join(session.run_dir(job.case_id), stream)
        try:
            text = session.call(
                "output tail", "tail", session.system, remote_path, num_bytes=offset + 1, exclude_beginning=True
            )
        except ProviderError as exc:
            if exc.status == 404:
                return ""  # Slurm has not created the file yet
            raise
        if isinstance(text, dict):  # some API versions wrap the content
            text = text.get("content", "")
        text = str(text or "")[:MAX_DELTA_CHARS]
        if not final or len(text) == MAX_DELTA_CHARS:
            text = text.rstrip("\ufffd")
        return text

    # -- files --------------------------------------------------------------------------------
    def _walk(self, session: Session, root: str, skip_top: tuple[str, ...]):
        """(rel, remote path, entry) for regular files under ``root``; symlinks are never followed."""
        pending = [("", root)]
        seen = 0
        while pending:
            rel_dir, path = pending.pop()
            for entry in session.call(f"listing of {path}", "list_files", session.system, path, show_hidden=True):
                seen += 1
                if seen > MAX_WALK_ENTRIES:
                    raise BackendError(f"more than {MAX_WALK_ENTRIES} entries under {root}: not walking further")
                name = str(entry.get("name") or "").rsplit("/", 1)[-1]
                if name in ("", ".", ".."):
                    continue
                rel = f"{rel_dir}/{name}" if rel_dir else name
                if not rel_dir and name in skip_top:
                    continue
                kind = str(entry.get("type") or "")
                if kind == "d":
                    pending.append((rel, posixpath.join(path, name)))
                elif kind in ("-", "f", "file"):
                    yield rel, posixpath.join(path, name), entry

    def sync(self, job: JobRef, globs: list[str]) -> None:
        session = self.session(job)
        work = posixpath.join(session.run_dir(job.case_id), "work")
        live = job.workspace / "live"
        seen = load_state(job.workspace, STATE_DIR, "live.json")
        for rel, source, entry in self._walk(session, work, ("shared",)):
            if not glob_matches(rel, globs):
                continue
            size = _size(entry)
            stamp = [size, str(entry.get("lastModified") or "")]
            target = confined_target(live, rel)
            if target is None or size > LIVE_MAX_BYTES:
                continue
            known = seen.get(rel)
            if known and known[:2] == stamp and target.exists():
                # Sizes and one-second mtimes miss a same-size rewrite within a second: the
                # remote checksum decides (one call, no download when unchanged).
                answer = session.call(f"checksum of {rel}", "checksum", session.system, source)
                if isinstance(answer, dict) and answer.get("checksum") == (known[2:] or [None])[0]:
                    continue
            self._download(session, source, target)
            seen[rel] = [*stamp, files._hash(target)]
        save_state(job.workspace, STATE_DIR, "live.json", seen)

    def fetch_final(self, job: JobRef) -> None:
        session = self.session(job)
        work = posixpath.join(session.run_dir(job.case_id), "work")
        manifest = load_state(job.workspace, STATE_DIR, "manifest.json")
        results = job.workspace / "results"
        results.mkdir(parents=True, exist_ok=True)
        for rel, source, entry in self._walk(session, work, files.NOT_RESULTS):
            size = _size(entry)
            known = manifest.get(rel)
            if known and known[0] == size:
                answer = session.call(f"checksum of {rel}", "checksum", session.system, source)
                if isinstance(answer, dict) and answer.get("checksum") == known[1]:
                    continue  # an input the job did not change is not a result
            target = confined_target(results, rel)
            if target is None:
                continue
            self._download(session, source, target)

    def _download(self, session: Session, source: str, target: Path) -> None:
        def fetch(tmp: str):
            session.call(f"download of {source}", "download", session.system, source, tmp)

        try:
            download_atomically(target, fetch)
        except FileNotFoundError:
            raise BackendError(f"{source} vanished during the download") from None

    # -- cancel --------------------------------------------------------------------------------
    def cancel(self, job: JobRef) -> None:
        """Cancel straight away (one call). The real server answers a finished or unknown job
        with 500 and scancel's message ("Job/step already completing or complete", "Invalid job
        id specified"), older ones with 404: the job's state then decides whether it had already
        ended (R-CASE-6); its output is not read here, so the next poll still brings all of it."""
        session = self.session(job)
        job_id = split_remote_id(job.remote_id, session.system)[0]
        try:
            session.call(f"cancel of job {job_id}", "cancel_job", session.system, job_id)
            return
        except ProviderError as exc:
            if exc.status not in (404, 500):
                raise
            refused = exc
        state = self._poll_group(session, [job], output=False)[job.remote_id]
        if isinstance(state, BackendState) and state.status in BackendStatus.TERMINAL:
            raise AlreadyFinished(f"Slurm job {job_id} already ended")
        raise refused

    def purge(self, job: JobRef) -> None:
        """``<working_root>/<case id>`` goes (SPEC §8, ``manage.py cleanup``). Idempotent: when
        the removal is refused, a stat that answers 404 means it was already gone."""
        session = self.session(job)
        rdir = session.run_dir(job.case_id)
        try:
            session.call(f"removal of {rdir}", "rm", session.system, rdir)
        except ProviderError as exc:
            try:
                session.call(f"stat of {rdir}", "stat", session.system, rdir)
            except ProviderError as gone:
                if gone.status == 404:
                    return
            raise exc from None

    # -- launch form and doctor ----------------------------------------------------------------
    def fixed_options(self, session: Session) -> list[LaunchOption]:
        """The pool's own partition (a class's is pinned later) and the time limits."""
        configured = session.remote.get("partition")
        return launch_form([configured] if configured else [], configured)

    def asked_options(self, session: Session) -> list[LaunchOption]:
        configured = session.remote.get("partition")
        partitions = session.call("partition listing", "partitions", session.system)
        names = [str(p.get("name")) for p in partitions or [] if p.get("name")]
        default = configured if configured in names else (names[0] if names else configured)
        return launch_form(names, default)

    def pin_class_overrides(self, answer: LaunchOptions, resource_class) -> LaunchOptions:
        return sbatch.pin_class_time(sbatch.pin_class_partition(answer, resource_class), resource_class)


#: the allocation record FirecREST/sacct shows for a running job (name "allocation", PENDING)
ALLOCATION = object()


def _entry_for(entries, job: JobRef, system: str):
    """The record of ``job`` in a job listing, matched by id (names are not unique and the
    allocation record has none of ours): the entry, ``ALLOCATION`` when only the allocation
    record is there, or None."""
    job_id, _system = split_remote_id(job.remote_id, system)
    mine = [e for e in entries or [] if isinstance(e, dict) and str(e.get("jobId")) == job_id]
    for entry in mine:
        if entry.get("name") in (job.case_id, None):
            return entry
    if any(entry.get("name") == "allocation" for entry in mine):
        return ALLOCATION
    if mine:
        raise BackendError(f"FirecREST job {job_id} is not case {job.case_id}'s job (its name differs)")
    return None


def _size(entry: dict) -> int:
    """A listing's size: the real server sends a string ("12")."""
    try:
        return int(str(entry.get("size") or 0).strip())
    except ValueError:
        return 0
