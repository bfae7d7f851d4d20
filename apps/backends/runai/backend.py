"""The Run:AI backend: training workloads on a Run:AI cluster through runapy, the Python client of
the Run:AI REST API (docs/backends.md, "runai"). Tokens, retries and timeouts: ``client.py``.

Run:AI has no file API: a case's run directory ``working_root/<case id>`` on Gridgate's hosts is
``host_path/<case id>`` on the cluster's nodes, mounted alone (hostPath) at ``mount_path`` in the
container, so a case sees its own directory and no other. Inputs go in, stdout/stderr and results
come out there.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import stat
from pathlib import Path

from apps.backends import files, privileged
from apps.backends.base import (
    AlreadyFinished,
    BackendError,
    BackendState,
    BackendStatus,
    Choice,
    JobRef,
    LaunchOption,
    LaunchOptions,
    ResultsTooLarge,
    SubmitSpec,
)
from apps.backends.remote import ProviderError
from apps.backends.remote.backend import state_map
from apps.backends.remote_common import LIVE_MAX_BYTES, load_state, save_state
from apps.backends.runai import client
from apps.backends.runai.doctor import RunaiDoctor

logger = logging.getLogger(__name__)

STATE_DIR = ".runai"
NAME_PREFIX = "gg-"  # a Kubernetes name starts with a letter; a case id may start with a digit

#: ``Unknown`` (the cluster lost contact) and any other phase is pending, never a failure
map_phase = state_map(
    {
        BackendStatus.PENDING: ("Pending", "Creating", "Initializing", "Resuming"),
        BackendStatus.RUNNING: ("Running", "Updating", "Degraded", "Stopping", "Terminating", "Deleting"),
        BackendStatus.SUCCEEDED: ("Completed", "Succeeded"),
        BackendStatus.FAILED: ("Failed",),
        BackendStatus.CANCELLED: ("Stopped", "Deleted"),
    }
)
#: fractions of a GPU a launch may ask for (Run:AI's ``gpuPortionRequest``, per device)
GPU_PORTIONS = ("0.1", "0.2", "0.25", "0.3", "0.4", "0.5", "0.6", "0.7", "0.75", "0.8", "0.9")


def workload_name(case_id: str) -> str:
    return f"{NAME_PREFIX}{case_id}"


def run_dir_for(case_id: str, remote: dict) -> Path:
    root = (remote or {}).get("working_root")
    if not root:
        raise BackendError("the pool has no working_root: set the shared volume (working_root and host_path)")
    return Path(root) / case_id


class RunaiBackend(RunaiDoctor):
    needs = (
        ("working_root", "it has no working directory on the cluster"),
        ("image", "it names no container image to run cases in"),
    )

    # -- submission --------------------------------------------------------------------------
    def find_in(self, session: client.Session, case_id: str, *, deleted: bool = False) -> str | None:
        name = workload_name(case_id)
        body = session.call(
            "workload lookup",
            lambda c: client._api().WorkloadsApi(c).get_workloads(deleted=deleted or None, filter_by=[f"name=={name}"]),
        )
        for item in (body or {}).get("workloads") or []:
            if isinstance(item, dict) and item.get("name") == name and item.get("id"):
                return str(item["id"])
        return None

    def _compute(self, spec: SubmitSpec) -> dict:
        """Whole CPUs (never fewer than the class's), its memory as request and limit, its GPUs as
        whole devices or, with ``gpu_portion``, that fraction of each device (R-BACK-6: the option
        is declared only for classes with GPUs, so the quota the class counts is never passed)."""
        cpu = max(1, math.ceil(float(spec.resources.get("cpu") or 1)))
        memory = int(spec.resources.get("memory") or 1)
        compute = {
            "cpuCoreRequest": float(cpu),
            "cpuCoreLimit": float(cpu),
            "cpuMemoryRequest": f"{memory}G",
            "cpuMemoryLimit": f"{memory}G",
        }
        gpus = int(spec.resources.get("gpu") or 0)
        portion = spec.launch_options.get("gpu_portion")
        if portion not in (None, ""):
            if gpus < 1 or str(portion) not in GPU_PORTIONS:
                raise BackendError(
                    f"gpu_portion {portion!r} needs a class with GPUs and one of {', '.join(GPU_PORTIONS)}"
                )
            compute |= {"gpuDevicesRequest": gpus, "gpuRequestType": "portion", "gpuPortionRequest": float(portion)}
        elif gpus:
            compute["gpuDevicesRequest"] = gpus
        return compute

    def _prepare(self, spec: SubmitSpec, remote: dict) -> None:
        """The run directory on the shared volume: ``work/`` (inputs, the campaign's shared inputs
        copied: no link can point outside the one directory the workload mounts), ``job.sh``,
        ``stdout``/``stderr``. The inputs' hashes stay in the workspace, out of the job's reach."""
        rdir = run_dir_for(spec.case_id, remote)
        try:
            files.service_run_dir(rdir, 0o700)
            files.prepare_run_dir(rdir, spec.inputs_dir, spec.shared_dir, shared="copy")
            manifest = json.loads((rdir / "manifest.json").read_text())
            (rdir / "manifest.json").unlink()
            save_state(spec.workspace, STATE_DIR, "manifest.json", manifest)
            # Paths relative to the script's own directory (the mount): the script does not
            # depend on where the volume is mounted.
            script = (
                "#!/bin/sh\n"
                'here=$(cd "$(dirname "$0")" && pwd) || exit 97\n'
                'cd "$here/work" || exit 97\n'
                "mkdir -p .gridgate\n"
                'exec >>"$here/stdout" 2>>"$here/stderr"\n'
                f"{spec.command}\n"
            )
            files.write_private(rdir / "job.sh", script.encode())
            for name in ("stdout", "stderr"):
                files.write_private(rdir / name)
        except OSError as exc:
            raise BackendError(f"cannot prepare {rdir}: {exc}") from None

    @staticmethod
    def _body(spec: SubmitSpec, remote: dict, project: dict, cluster, compute: dict, node_pool) -> dict:
        """The training's creation request: the case's directory alone mounted, one run."""
        mount = remote.get("mount_path") or "/gridgate"
        environment = {str(k): str(v) for k, v in (spec.environment or {}).items()}
        environment["GRIDGATE_CASE_ID"] = spec.case_id
        # Only this case's directory: a case never sees another's files (R-CASE-8).
        volume = {"name": "gridgate-case", "path": f"{remote['host_path'].rstrip('/')}/{spec.case_id}"}
        body = {
            "name": workload_name(spec.case_id),
            "projectId": str(project.get("id")),
            "clusterId": str(cluster),
            "spec": {
                "image": remote["image"],
                "command": "/bin/sh",
                "args": f"{mount}/job.sh",
                "workingDir": f"{mount}/work",
                "environmentVariables": [{"name": k, "value": v} for k, v in sorted(environment.items())],
                "compute": compute,
                # One run: a failed command is a failed case, not six more attempts (the default).
                "backoffLimit": 0,
                "restartPolicy": "Never",
                "storage": {"hostPath": [{**volume, "mountPath": mount, "readOnly": False}]},
            },
        }
        if node_pool:
            body["spec"]["nodePools"] = [node_pool]
        if os.geteuid() != 0:
            # The job writes as the service's account, so its files on the shared volume are the
            # service's to read and no other account's (the run directory is 0700).
            body["spec"]["security"] = {"uidGidSource": "custom", "runAsUid": os.geteuid(), "runAsGid": os.getegid()}
        return body

    def submit_as(self, session: client.Session, spec: SubmitSpec) -> str:
        remote = session.remote
        if not remote.get("image"):
            raise BackendError("the pool names no container image (remote.image): cases cannot run there")
        if not remote.get("host_path"):
            raise BackendError("the pool has no shared volume (working_root and host_path): results cannot come back")
        project_name = spec.launch_options.get("project") or remote.get("project")
        if not project_name:
            raise BackendError("no Run:AI project: set the pool's project or choose one at launch")
        found = client.projects(session, project_name)
        if not found:
            raise BackendError(
                f"Run:AI project {project_name!r} is not visible to this credential: check the pool's project"
            )
        project = found[0]
        cluster = remote.get("cluster_id") or project.get("clusterId")
        if not cluster:
            raise BackendError(f"Run:AI project {project_name!r} names no cluster: set the pool's cluster_id")
        compute = self._compute(spec)
        node_pool = spec.launch_options.get("node_pool") or remote.get("node_pool")
        self._prepare(spec, remote)
        body = self._body(spec, remote, project, cluster, compute, node_pool)
        request = client._sdk()["models"].TrainingCreationRequest.from_dict(body)
        spec.heartbeat()  # last check that the launch is still ours before the workload exists
        try:
            answer = session.call(
                "workload submission", lambda c: client._api().TrainingsApi(c).create_training1(request)
            )
        except ProviderError as exc:
            find = lambda: self.find_in(session, spec.case_id)  # noqa: E731
            if exc.status == 409 and (found := find()):  # a workload of this name exists: ours
                return found
            return self.refused_or_adopted(exc, exc.status, find, spec, "workload")
        workload_id = (answer or {}).get("workloadId") or (answer or {}).get("id")
        if not workload_id:
            raise BackendError("Run:AI accepted the workload without giving its id")
        return str(workload_id)

    # -- observation -----------------------------------------------------------------------
    def _workload(self, session: client.Session, job: JobRef) -> dict | None:
        """The workload, or None when Run:AI lists it among the deleted ones (``GET
        /workloads/{id}`` answers 404 for a deleted workload)."""
        try:
            return session.call("workload lookup", lambda c: client._api().WorkloadsApi(c).get_workload(job.remote_id))
        except ProviderError as exc:
            if exc.status != 404:
                raise
        if self.find_in(session, job.case_id, deleted=True):
            return None
        # Just submitted and not known yet, or gone without a trace: a failed poll (R-CASE-3).
        raise ProviderError(f"Run:AI does not know workload {job.remote_id} (yet)", status=404, transient=True)

    def poll(self, job: JobRef) -> BackendState:
        session = self.session(job)
        workload = self._workload(session, job)
        if workload is None:
            status, message, elapsed = BackendStatus.CANCELLED, "deleted at Run:AI", None
        else:
            status = map_phase(workload.get("phase"))
            text = str(workload.get("phaseMessage") or "").strip()
            elapsed = workload.get("totalRunningTimeSeconds")
            message = ""
            if status == BackendStatus.FAILED:
                message = f"Run:AI workload {job.remote_id} failed" + (f": {text}" if text else "")
            elif status == BackendStatus.PENDING and text:
                message = f"Run:AI: {text}"  # why it waits: unschedulable, over quota…
        rdir = run_dir_for(job.case_id, job.pool_remote)
        limit = None if status in BackendStatus.TERMINAL else 4 << 20
        for stream in ("stdout", "stderr"):
            files.drain_log(rdir / stream, job.workspace / f"{stream}.log", cap=files.log_cap_bytes(), limit=limit)
        allocated = (workload or {}).get("allocatedResources") or {}
        cores = allocated.get("cpu") if isinstance(allocated.get("cpu"), (int, float)) else None
        return BackendState(
            status=status,
            execution_time=float(elapsed) if isinstance(elapsed, (int, float)) else None,
            cores=math.ceil(cores) if cores else None,
            message=session.scrub(message)[:1000],
        )

    def _copy_tree(self, job: JobRef, what: str, globs: list[str]) -> None:
        """``work/`` on the shared volume into ``live/`` or ``results/`` as the helper brings files
        back (:func:`privileged.bring_back`: the job chooses what lies there, R-CASE-7); a live
        file only up to ``LIVE_MAX_BYTES`` and when it changed since the last sync."""
        rdir = run_dir_for(job.case_id, job.pool_remote)
        manifest = load_state(job.workspace, STATE_DIR, "manifest.json") if what == "results" else {}
        seen = load_state(job.workspace, STATE_DIR, "live.json") if what == "live" else {}

        def changed(rel: str, info: os.stat_result) -> bool:
            stamp = f"{info.st_size}:{info.st_mtime_ns}"
            if info.st_size > LIVE_MAX_BYTES or seen.get(rel) == stamp:
                return False
            seen[rel] = stamp
            return True

        owner = (os.geteuid(), os.getegid())
        target = job.workspace / what
        target.mkdir(parents=True, exist_ok=True)
        try:
            work_fd = os.open(rdir / "work", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError as exc:
            raise BackendError(f"the working directory on the shared volume is gone: {exc}") from None
        target_fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            keep = changed if what == "live" else None
            privileged.bring_back(what, work_fd, target_fd, owner, globs, manifest, job.max_result_bytes, keep)
        except privileged.TooLarge as exc:
            raise ResultsTooLarge(str(exc)) from None
        except privileged.Refused as exc:
            raise BackendError(str(exc)) from None
        finally:
            os.close(work_fd)
            os.close(target_fd)
        if what == "live":
            save_state(job.workspace, STATE_DIR, "live.json", seen)

    def sync(self, job: JobRef, globs: list[str]) -> None:
        self._copy_tree(job, "live", list(globs or []))

    def fetch_final(self, job: JobRef) -> None:
        self._copy_tree(job, "results", [])

    def cancel(self, job: JobRef) -> None:
        """DELETE the workload (its pods go; its logs and files stay on the shared volume). A
        workload that already ended is ``AlreadyFinished`` (R-CASE-6); one already deleted too."""
        session = self.session(job)
        workload = self._workload(session, job)
        if workload is None or map_phase(workload.get("phase")) in BackendStatus.TERMINAL:
            raise AlreadyFinished(f"Run:AI workload {job.remote_id} already ended")
        if not self._delete(session, job.remote_id):
            raise AlreadyFinished(f"Run:AI workload {job.remote_id} no longer exists")

    @staticmethod
    def _delete(session: client.Session, workload_id: str) -> bool:
        """DELETE the workload; False when Run:AI no longer has it (404)."""
        try:
            session.call("workload deletion", lambda c: client._api().TrainingsApi(c).delete_training(workload_id))
        except ProviderError as exc:
            if exc.status != 404:
                raise
            return False
        return True

    def purge(self, job: JobRef) -> None:
        """The run directory on the shared volume and the workload's record at Run:AI (what is
        already gone is skipped)."""
        if job.remote_id:
            self._delete(self.session(job), job.remote_id)
        root = (job.pool_remote or {}).get("working_root")
        if not root:
            return
        rdir = Path(root) / job.case_id
        try:
            if stat.S_ISDIR(os.lstat(rdir).st_mode):
                shutil.rmtree(rdir)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise BackendError(f"the run directory of case {job.case_id} was not removed: {exc}") from None

    # -- launch form and doctor ----------------------------------------------------------------
    def fixed_options(self, session: client.Session) -> list[LaunchOption]:
        """The pool's ``project`` and ``node_pool`` (each user's key sees its own projects: until
        the user connects, the pool's) and ``gpu_portion`` (static; dropped for classes without
        GPUs by :meth:`pin_class_overrides`)."""

        def pinned(key, label, value):
            return LaunchOption(key, label, [Choice(value, value)] if value else [], value or None)

        return [
            pinned("project", "Project", session.remote.get("project")),
            pinned("node_pool", "Node pool", session.remote.get("node_pool")),
            LaunchOption("gpu_portion", "GPU fraction per device", [Choice(v, v) for v in GPU_PORTIONS]),
        ]

    def asked_options(self, session: client.Session) -> list[LaunchOption]:
        """What the service credential sees, or on a per-user pool the user's own access key; the
        pool's own values pinned when it names them."""
        remote = session.remote
        project, node_pool, portion = self.fixed_options(session)
        projects = client.projects(session, remote.get("project"))
        if not remote.get("project"):
            names = [p["name"] for p in projects if p.get("name")]
            project = LaunchOption("project", "Project", [Choice(n, n) for n in names], names[0] if names else None)
        if not remote.get("node_pool"):
            items = [item or {} for listed in projects for item in listed.get("resources") or []]
            names = [(item.get("nodePool") or {}).get("name") for item in items]
            pools = list(dict.fromkeys(name for name in names if name))  # each once, in order
            node_pool = LaunchOption("node_pool", "Node pool", [Choice(n, n) for n in pools])
        return [project, node_pool, portion]

    def pin_class_overrides(self, answer: LaunchOptions, resource_class) -> LaunchOptions:
        """A fraction of a GPU only for classes with GPUs: for others the option is not declared,
        so asking for one is refused (400) like any undeclared option (R-BACK-6)."""
        if (resource_class.gpu or 0) >= 1:
            return answer
        kept = [option for option in answer.options if option.key != "gpu_portion"]
        return LaunchOptions(options=kept, degraded=answer.degraded, message=answer.message)
