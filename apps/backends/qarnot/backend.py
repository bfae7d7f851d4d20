"""The Qarnot backend: docker tasks on Qarnot's cloud through the qarnot SDK (R-BACK-3).

Qarnot's quirks (each met on a real account: docs/backends.md, "qarnot") are absorbed here so
the core never sees them, each explained where it is handled; the connection and what the SDK's
errors mean are in ``client.py``.
"""

from __future__ import annotations

import copy
import fcntl
import hashlib
import logging
import math
import os
import re
import shlex
from pathlib import Path

from apps.backends import files
from apps.backends.base import (
    AlreadyFinished,
    BackendError,
    BackendState,
    BackendStatus,
    Choice,
    JobRef,
    LaunchOption,
    SubmitSpec,
    SubmitUncertain,
    duration_seconds,
)
from apps.backends.privileged import glob_matches
from apps.backends.qarnot.client import MB, Session, _sdk
from apps.backends.qarnot.doctor import QarnotDoctor
from apps.backends.remote.backend import state_map
from apps.backends.remote_common import (
    LIVE_MAX_BYTES,
    confined_target,
    download_atomically,
    globs_to_regex,
    load_state,
    safe_relative,
    save_state,
    state_dir,
)

logger = logging.getLogger(__name__)

STATE_DIR = ".qarnot"
SHARED_MARKER = ".gridgate-complete"

#: part sizes S3 uploaders use (boto3 and the AWS CLI: 8 MiB): a multipart ETag is checked
#: against the local file with each size that gives its number of parts
PART_SIZES_MB = (8, 5, 16, 15, 32, 64, 100, 128, 256, 512)

map_state = state_map(
    {
        BackendStatus.PENDING: ("UnSubmitted", "Submitted", "PartiallyDispatched", "FullyDispatched"),
        BackendStatus.RUNNING: (
            "PartiallyExecuting",
            "FullyExecuting",
            "UploadingResults",
            "DownloadingResults",
            "PendingCancel",
        ),
        BackendStatus.SUCCEEDED: ("Success",),
        BackendStatus.FAILED: ("Failure",),
        BackendStatus.CANCELLED: ("Cancelled", "PendingDelete", "Deleted"),
    }
)
SCHEDULING = {"flex": "Flex", "ondemand": "OnDemand", "reserved": "Reserved"}
#: launch-option ranges for the synthesised core constraint (ranks × threads, R-BACK-3)
MAX_RANKS = 1024
MAX_THREADS = 256


def bucket_names(case_id: str) -> tuple[str, str]:
    """The case's inputs bucket and its results (and snapshots) bucket."""
    return f"gg-{case_id}-in", f"gg-{case_id}-out"


def shared_bucket_name(shared_dir: Path) -> str:
    """A campaign's shared inputs, uploaded once under ``shared/`` (the task sees them where a
    local run does) and never downloaded back."""
    return f"gg-campaign-{shared_dir.parent.name}"


def case_tag(case_id: str) -> str:
    return f"gridgate-case-{case_id}"


class QarnotBackend(QarnotDoctor):
    # -- submission --------------------------------------------------------------------------
    def find_in(self, session: Session, case_id: str) -> str | None:
        with session.guard("task lookup"):
            for task in session.conn.all_tasks(summary=False, tags=[case_tag(case_id)]):
                if task.name == case_id and task.uuid:
                    return task.uuid
        return None

    def _scheduling(self, options: dict):
        value = options.get("scheduling")
        if value in (None, ""):
            return None
        name = SCHEDULING.get(str(value).replace("-", "").replace("_", "").lower())
        if name is None:
            raise BackendError(f"unknown scheduling type {value!r}: choose one of {', '.join(SCHEDULING.values())}")
        st = _sdk().scheduling_type
        return {"Flex": st.FlexScheduling, "OnDemand": st.OnDemandScheduling, "Reserved": st.ReservedScheduling}[name]()

    def _cores(self, spec: SubmitSpec) -> int:
        ranks, threads = spec.launch_options.get("ranks"), spec.launch_options.get("threads")
        if isinstance(ranks, int) and ranks > 0:
            return ranks * (threads if isinstance(threads, int) and threads > 0 else 1)
        return max(1, math.ceil(float(spec.resources.get("cpu") or 1)))

    def _catalogue(self, session: Session) -> list:
        with session.guard("hardware-constraint catalogue"):
            return list(session.conn.all_hardware_constraints())

    def _constraints(self, session: Session, spec: SubmitSpec) -> list:
        """The synthesised core constraint only if the catalogue lists it (Qarnot refuses the
        whole task otherwise); the node type must be a catalogue key."""
        hw = _sdk().hardware_constraint
        node_type = spec.launch_options.get("node_type")
        try:
            catalogue = self._catalogue(session)
        except BackendError as exc:
            if node_type:
                raise
            logger.info("case %s: no catalogue (%s); no core constraint sent", spec.case_id, exc)
            return []
        out = []
        cores = self._cores(spec)
        if any(isinstance(c, hw.MinimumCoreHardware) and c._core_count == cores for c in catalogue):
            out.append(hw.MinimumCoreHardware(cores))
        if node_type:
            keys = [c._specification_key for c in catalogue if isinstance(c, hw.SpecificHardware)]
            if node_type not in keys:
                raise BackendError(f"unknown node type {node_type!r}: choose one of {', '.join(keys) or 'none'}")
            out.append(hw.SpecificHardware(node_type))
        return out

    def _bucket_exists(self, session: Session, name: str) -> bool:
        import botocore.exceptions

        try:
            session.s3.head_bucket(Bucket=name)
            return True
        except botocore.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchBucket", "NotFound"):
                return False
            raise BackendError(session.said("bucket check", exc)) from None

    def _object_exists(self, session: Session, bucket: str, key: str) -> bool:
        import botocore.exceptions

        try:
            session.s3.head_object(Bucket=bucket, Key=key)
            return True
        except botocore.exceptions.ClientError:
            return False

    def plan(self, session: Session, spec: SubmitSpec) -> dict:
        """What this launch will upload and create, checked before anything is spent: Qarnot has no
        quota exception, a full bucket or storage quota would surface mid-upload."""
        inputs = list(files.walk_files(spec.inputs_dir))
        shared, shared_bucket = [], None
        if spec.shared_dir is not None and spec.shared_dir.is_dir():
            shared_bucket = shared_bucket_name(spec.shared_dir)
            with session.guard("shared-inputs check"):
                done = self._object_exists(session, shared_bucket, SHARED_MARKER)
            if not done:
                shared = list(files.walk_files(spec.shared_dir))
        total = sum(path.stat().st_size for _rel, path in inputs + shared)
        limit = int(session.remote.get("max_upload_mb") or 512)
        if total > limit * MB:
            raise BackendError(
                f"this launch would upload {total / MB:.1f} MB, more than the pool's max_upload_mb ({limit} MB)"
            )
        names = list(bucket_names(spec.case_id)) + ([shared_bucket] if shared_bucket else [])
        with session.guard("account check"):
            new = [name for name in names if not self._bucket_exists(session, name)]
            info = session.conn.user_info
        limited = info.max_bucket is not None and info.max_bucket >= 0 and (info.bucket_count or 0) >= 0
        if limited and (info.bucket_count or 0) + len(new) > info.max_bucket:
            raise BackendError(
                f"the Qarnot account has room for {max(0, info.max_bucket - info.bucket_count)} more bucket(s) "
                f"and this launch needs {len(new)}: delete old buckets first"
            )
        quota, used = info.quota_bytes_bucket, info.used_quota_bytes_bucket
        if quota is not None and quota >= 0 and used is not None and used + total > quota:
            raise BackendError(
                f"the Qarnot storage quota has {max(0, quota - used) / MB:.1f} MB left and this launch "
                f"uploads {total / MB:.1f} MB: free storage first"
            )
        return {"inputs": inputs, "shared": shared, "shared_bucket": shared_bucket}

    def _upload(self, session: Session, spec: SubmitSpec, bucket: str, entries, prefix: str = "") -> dict[str, str]:
        """Upload files; returns {key: md5} (S3's ETag of a single-part upload)."""
        with session.guard(f"creation of bucket {bucket}"):
            session.conn.create_bucket(bucket)
        md5s = {}
        for rel, path in entries:
            spec.heartbeat()  # renew the launch lease between uploads (R-CASE-1)
            key = prefix + rel
            with session.guard(f"upload of {key}"):
                # A full quota surfaces here as a botocore ClientError: reported, and the case fails
                # before any task exists, so nothing runs (or bills) half-prepared.
                session.s3.upload_file(str(path), bucket, key)
            md5s[key] = hashlib.md5(path.read_bytes(), usedforsecurity=False).hexdigest()
        return md5s

    def submit_as(self, session: Session, spec: SubmitSpec) -> str:
        scheduling = self._scheduling(spec.launch_options)  # unknown value: fails before any upload
        plan = self.plan(session, spec)
        constraints = self._constraints(session, spec)
        in_name, out_name = bucket_names(spec.case_id)
        manifest = self._upload(session, spec, in_name, plan["inputs"])
        resources = [in_name]
        if plan["shared_bucket"]:
            if plan["shared"]:
                self._upload(session, spec, plan["shared_bucket"], plan["shared"], prefix="shared/")
                with session.guard("shared-inputs marker"):
                    session.s3.put_object(Bucket=plan["shared_bucket"], Key=SHARED_MARKER, Body=b"ok\n")
            resources.append(plan["shared_bucket"])
        with session.guard("creation of the results bucket"):
            session.conn.create_bucket(out_name)
        save_state(spec.workspace, STATE_DIR, "manifest.json", manifest)

        regex = globs_to_regex(spec.observability_globs)
        task = self._task_for(session, spec, resources, out_name, constraints, scheduling, regex)
        spec.heartbeat()  # last check that the launch is still ours before the task exists
        answered: list[int] = []
        try:
            self._post(session, task, answered)
        except Exception as exc:
            status = answered[0] if answered else None
            error = session.said("task submission", exc)
            if isinstance(exc, _sdk().exceptions.MaxTaskException):
                # 403 "maximum number of tasks reached": nothing was created and the refusal is
                # temporary: retried later as an uncertain submission (its find finds nothing).
                raise SubmitUncertain(f"{error}; the launch will be retried when a task slot frees up") from None
            # A failure after the task was accepted (no status recorded) may have created it too.
            find = lambda: task.uuid or self.find_in(session, spec.case_id)  # noqa: E731
            return self.refused_or_adopted(BackendError(error), status, find, spec, "task")
        try:
            with session.guard("periodic snapshot"):
                # After submit, with the whitelist passed explicitly: called before submit the SDK
                # keeps only the interval and the snapshot would bring back every file.
                task.snapshot(int(session.remote.get("snapshot_interval") or 60), whitelist=regex)
        except BackendError as exc:
            logger.warning("case %s: periodic snapshot not started: %s", spec.case_id, exc)
        if not task.uuid:
            raise BackendError("Qarnot accepted the task without giving its uuid")
        return task.uuid

    def _task_for(self, session: Session, spec: SubmitSpec, resources, out_name, constraints, scheduling, regex):
        """The task, every setter applied (most refuse once the task has a uuid)."""
        with session.guard("task preparation"):
            task = session.conn.create_task(spec.case_id, session.remote.get("profile"), 1)
            task.tags = [case_tag(spec.case_id)]
            constants = {name: str(value) for name, value in spec.environment.items()}
            constants["GRIDGATE_CASE_ID"] = spec.case_id
            image = session.remote.get("docker_image")
            if image:
                repo, _, tag = image.rpartition(":") if ":" in image.rsplit("/", 1)[-1] else (image, "", "")
                constants["DOCKER_REPO"] = repo
                constants["DOCKER_TAG"] = tag or "latest"
            constants["DOCKER_CMD"] = "/bin/sh -c " + shlex.quote("mkdir -p .gridgate && " + spec.command)
            task.constants = constants
            task.resources = [session.conn.retrieve_bucket(name) for name in resources]
            task.results = session.conn.retrieve_bucket(out_name)
            # Shared inputs (and their completeness marker) never come back with results.
            task.results_blacklist = f"^(shared/|{re.escape(SHARED_MARKER)}$)"
            task.hardware_constraints = constraints
            if scheduling is not None:
                task.scheduling_type = scheduling
            # Must be set before submit: the periodic snapshot filter below does not stick otherwise.
            task.snapshot_whitelist = regex
        return task

    @staticmethod
    def _post(session: Session, task, answered: list[int]) -> None:
        """``task.submit()`` once. The SDK retries a POST that answered 429/5xx: for POST /tasks a
        retry can create a second task (the first request may have created one before failing).
        Submit through a copy of the connection with retries off; ``answered`` gets the status."""
        submit_conn = copy.copy(session.conn)
        submit_conn._retry_count = 0
        post = submit_conn._post

        def recording_post(url, json=None, **kwargs):
            response = post(url, json=json, **kwargs)
            answered.append(response.status_code)
            return response

        submit_conn._post = recording_post
        task._connection = submit_conn
        try:
            task.submit()
        finally:
            task._connection = session.conn

    # -- observation -----------------------------------------------------------------------
    def _task(self, session: Session, uuid: str):
        # An unknown uuid (MissingTaskException) is a failed poll, never a failure (R-CASE-3).
        with session.guard(f"lookup of task {uuid}"):
            return session.conn.retrieve_task(uuid)

    def poll(self, job: JobRef) -> BackendState:
        session = self.session(job)
        task = self._task(session, job.remote_id)
        status = map_state(task.state)
        fresh_out = fresh_err = ""
        if status != BackendStatus.PENDING:
            with session.guard("output fetch"):
                # fresh_* are POSTs answering what was written since the previous call: spooled
                # at once, so whoever reads them, the output reaches the log (R-CASE-5).
                fresh_out = task.fresh_stdout() or ""
                fresh_err = task.fresh_stderr() or ""
        stdout = _spooled_delta(job.workspace, "stdout", fresh_out)
        stderr = _spooled_delta(job.workspace, "stderr", fresh_err)
        message = ""
        if status == BackendStatus.FAILED:
            errors = self._failure_details(session, job.remote_id)
            message = f"Qarnot task {job.remote_id} failed" + (f": {errors}" if errors else "")
        cores = task.running_core_count if isinstance(task.running_core_count, int) else None
        return BackendState(
            status=status,
            stdout_delta=stdout,
            stderr_delta=stderr,
            execution_time=duration_seconds(task.execution_time or "", "."),
            cores=cores or None,
            message=message,
        )

    def _failure_details(self, session: Session, uuid: str) -> str:
        """Why a task failed: Qarnot reports it per instance in ``completedInstances[*].error``
        (the SDK drops that field) plus task-level ``errors``. One more GET, once per failed task."""
        qarnot = _sdk()
        try:
            with session.guard(f"lookup of task {uuid}"):
                response = session.conn._get(qarnot.get_url("task update", uuid=uuid))
                qarnot.raise_on_error(response)
                body = response.json()
        except BackendError as exc:
            logger.info("task %s: failure details unavailable: %s", uuid, exc)
            return ""
        details = []
        for instance in body.get("completedInstances") or []:
            error = instance.get("error") or {}
            if instance.get("state") != "Failure" and not error:
                continue
            text = error.get("message") or f"ended {instance.get('state')}"
            code = f" [{error['code']}]" if error.get("code") else ""
            details.append(f"instance {instance.get('instanceId')}: {text}{code}")
        details += [str(e.get("message")) for e in body.get("errors") or [] if e.get("message")]
        return session.scrub("; ".join(details))[:1000]

    def _objects(self, session: Session, bucket: str):
        with session.guard(f"listing of bucket {bucket}"):
            paginator = session.s3.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=bucket):
                yield from page.get("Contents", []) or []

    def _get(self, session: Session, bucket: str, key: str, target: Path) -> None:
        def fetch(tmp: str):
            session.guarded(f"download of {key}", lambda: session.s3.download_file(bucket, key, tmp))

        download_atomically(target, fetch)

    def sync(self, job: JobRef, globs: list[str]) -> None:
        """Only new or changed whitelisted objects (by ETag) come down while the task runs: the
        SDK's ``download_results`` would fetch the whole bucket again on every poll."""
        session = self.session(job)
        _in, out_name = bucket_names(job.case_id)
        live = job.workspace / "live"
        seen = load_state(job.workspace, STATE_DIR, "live.json")
        for item in self._objects(session, out_name):
            key = safe_relative(item.get("Key", ""))
            if key is None or key.startswith("shared/") or not glob_matches(key, globs):
                continue
            if int(item.get("Size") or 0) > LIVE_MAX_BYTES:
                continue
            etag = str(item.get("ETag", "")).strip('"')
            target = confined_target(live, key)
            if target is None or (seen.get(key) == etag and target.exists()):
                continue
            self._get(session, out_name, key, target)
            seen[key] = etag
        save_state(job.workspace, STATE_DIR, "live.json", seen)

    def fetch_final(self, job: JobRef) -> None:
        """The case's own results bucket only: never the shared inputs, never unchanged inputs."""
        session = self.session(job)
        _in, out_name = bucket_names(job.case_id)
        manifest = load_state(job.workspace, STATE_DIR, "manifest.json")
        results = job.workspace / "results"
        results.mkdir(parents=True, exist_ok=True)
        for item in self._objects(session, out_name):
            key = safe_relative(item.get("Key", ""))
            if key is None or key.split("/", 1)[0] in files.NOT_RESULTS or key == SHARED_MARKER:
                continue
            if key in manifest and _unchanged_input(job.workspace / "inputs" / key, manifest[key], item):
                continue  # an input returned unchanged is not a result
            target = confined_target(results, key)
            if target is not None:
                self._get(session, out_name, key, target)

    def cancel(self, job: JobRef) -> None:
        """Abort straight away. Qarnot refuses the abort of a task that is no longer running (403
        "Invalid operation on non-running task", ``UnauthorizedException``): the task's state,
        read again, says whether it had ended (R-CASE-6); the message is never parsed."""
        qarnot = _sdk()
        session = self.session(job)
        task = self._task(session, job.remote_id)
        try:
            task.abort()
            return
        except qarnot.exceptions.MissingTaskException:
            raise AlreadyFinished(f"Qarnot task {job.remote_id} no longer exists") from None
        except qarnot.exceptions.UnauthorizedException as exc:
            refused = BackendError(session.said("abort", exc))
        except Exception as exc:
            raise BackendError(session.said("abort", exc)) from None
        if map_state(self._task(session, job.remote_id).state) in BackendStatus.TERMINAL:
            raise AlreadyFinished(f"Qarnot task {job.remote_id} already ended")
        raise refused

    def purge(self, job: JobRef) -> None:
        """The case's buckets (inputs, results) and its task record; a campaign's shared bucket
        serves other cases and stays. Idempotent: what is already gone is skipped."""
        qarnot = _sdk()
        session = self.session(job)
        for name in bucket_names(job.case_id):
            if not self._bucket_exists(session, name):
                continue
            with session.guard(f"deletion of bucket {name}"):
                keys = [{"Key": item["Key"]} for item in self._objects(session, name) if item.get("Key")]
                for start in range(0, len(keys), 1000):  # S3 deletes at most 1000 keys per call
                    session.s3.delete_objects(Bucket=name, Delete={"Objects": keys[start : start + 1000]})
                session.s3.delete_bucket(Bucket=name)
        if job.remote_id:
            try:
                with session.guard(f"deletion of task {job.remote_id}"):
                    session.conn.retrieve_task(job.remote_id).delete()
            except BackendError:
                try:
                    session.conn.retrieve_task(job.remote_id)
                except qarnot.exceptions.MissingTaskException:
                    return  # already deleted
                except Exception:  # noqa: S110 - the original error below says it better
                    pass
                raise

    # -- launch form and doctor ----------------------------------------------------------------
    def fixed_options(self, session: Session, *, node_types=()) -> list[LaunchOption]:
        """Scheduling choices are static; node types come from the catalogue, which is per account
        (none offered until the user of a per-user pool connects: the core constraint still
        applies). R-BACK-3: ranks × threads size the core constraint, as ranges (R-BACK-6)."""
        return [
            LaunchOption("scheduling", "Scheduling", [Choice(v, v) for v in SCHEDULING.values()], default="Flex"),
            LaunchOption("node_type", "Node type", [Choice(k, k) for k in node_types]),
            LaunchOption("ranks", "MPI ranks", [], None, minimum=1, maximum=MAX_RANKS),
            LaunchOption("threads", "Threads per rank", [], None, minimum=1, maximum=MAX_THREADS),
        ]

    def asked_options(self, session: Session) -> list[LaunchOption]:
        hw = _sdk().hardware_constraint
        keys = [c._specification_key for c in self._catalogue(session) if isinstance(c, hw.SpecificHardware)]
        return self.fixed_options(session, node_types=keys)


def _spooled_delta(workspace: Path, stream: str, fresh: str) -> str:
    """Append ``fresh`` (consumed from Qarnot) to the stream's spool and return what the
    workspace log does not hold yet. ``<stream>.base`` is the log's size when the spool was last
    trimmed; what the log gained since then was delivered and is dropped from the spool. A
    caller that discards its answer leaves the spool as is: the next poll returns it again."""
    folder = state_dir(workspace, STATE_DIR)  # 0700: the spool holds the job's output
    log = workspace / f"{stream}.log"
    base_file = folder / f"{stream}.base"
    spool_fd = files.open_for_write(folder / f"{stream}.spool", os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW)
    with os.fdopen(spool_fd, "a+b") as spool:
        fcntl.flock(spool, fcntl.LOCK_EX)  # a poll pass and a cancel request may read at once
        try:
            log_size = log.stat().st_size
        except FileNotFoundError:
            log_size = 0
        try:
            base = int(base_file.read_text())
        except (OSError, ValueError):
            base = log_size  # first use: everything before was delivered
        spool.seek(0)
        data = spool.read() + fresh.encode("utf-8", "surrogateescape")
        rest = data[max(0, log_size - base) :]
        if rest != data or fresh:
            spool.seek(0)
            spool.truncate()
            spool.write(rest)
        files.write_private(base_file, str(log_size).encode())
    return rest.decode("utf-8", "surrogateescape")


def _unchanged_input(path: Path, md5: str, item: dict) -> bool:
    """Whether the results object ``item`` is the input at ``path`` (uploaded with MD5 ``md5``),
    unchanged. A multipart ETag is ``md5(part md5s)-N``: recomputed here from the local file."""
    etag = str(item.get("ETag", "")).strip('"')
    if etag == md5:
        return True
    digest, dash, count = etag.partition("-")
    if not dash or not count.isdigit() or not path.is_file():
        return False
    size = path.stat().st_size
    if int(item.get("Size") or -1) != size:
        return False
    for part_mb in PART_SIZES_MB:
        part = part_mb * MB
        if math.ceil(size / part) != int(count):
            continue
        parts = hashlib.md5(usedforsecurity=False)
        with path.open("rb") as handle:
            while chunk := handle.read(part):
                parts.update(hashlib.md5(chunk, usedforsecurity=False).digest())
        if parts.hexdigest() == digest:
            return True
    return False
