"""The Slurm backend: ``sbatch``/``squeue``/``scontrol``/``sacct``/``scancel`` on a login node,
each job submitted as its case's account (R-CASE-8). docs/backends.md, "slurm", lists the quirks
absorbed here; the ones that shape this module:

- **Job name = case id**: before every submission the job is looked up by name and adopted, so a
  retried launch never creates a second one (R-CASE-1).
- **One squeue per pass** (R-CASE-2) reads every live job, with the reason a pending one waits
  (sacct always says ``None``). A job slurmctld has forgotten (``MinJobAge``) is read from its
  permanent record, accounting or else the job-completion log (:func:`sacct`); a job neither
  knows is a failed poll, never a failure (R-CASE-3).
- **An sbatch that lost its controller's answer** may have queued the job: :class:`SubmitUncertain`,
  never a failure.

The run directory is ``<working_root>/<case id>/`` (a filesystem the login and compute nodes
share), else the case workspace's ``.run/``, which suits a single-node cluster.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from apps.backends import as_root, files, sbatch
from apps.backends.base import (
    AlreadyFinished,
    BackendError,
    BackendState,
    BackendStatus,
    Check,
    Choice,
    Doctor,
    ExecutionBackend,
    JobRef,
    LaunchOption,
    LaunchOptions,
    PollsMany,
    SubmitSpec,
    SubmitUncertain,
    duration_seconds,
    require_command,
)
from apps.core.cases_root import root_parent_check

TIMEOUT = 30  # seconds for any Slurm command: a hung controller is a failed poll, not a hung worker

#: Slurm's state words (squeue, sacct, FirecREST) by status. ``COMPLETING`` (epilog, output flush)
#: is still running; a word not listed is pending, never a failure.
STATES = {
    BackendStatus.PENDING: "PENDING CONFIGURING REQUEUED REQUEUE_HOLD REQUEUE_FED RESV_DEL_HOLD",
    BackendStatus.RUNNING: "RUNNING COMPLETING STAGE_OUT SIGNALING RESIZING SUSPENDED STOPPED",
    BackendStatus.SUCCEEDED: "COMPLETED",
    BackendStatus.FAILED: "FAILED TIMEOUT OUT_OF_MEMORY NODE_FAIL BOOT_FAIL DEADLINE PREEMPTED SPECIAL_EXIT REVOKED",
    BackendStatus.CANCELLED: "CANCELLED",
}
STATUS_OF = {word: status for status, words in STATES.items() for word in words.split()}

#: how far back ``sacct`` looks: without ``-S`` it starts at midnight today, so a job submitted
#: yesterday would be missed by the lookup by name (and submitted again) or by the poll.
SACCT_START = "now-30days"
#: worker variables the Slurm client commands may need (configuration location only); the rest of
#: the worker's environment (credentials, R-BACK-1) never reaches ``sbatch`` or the job.
SLURM_CLIENT_ENVIRONMENT = ("SLURM_CONF",)
#: the most of a live job's output one poll brings in (``files.drain_log``'s chunk)
LIVE_DRAIN_BYTES = 4 << 20

TIME_CHOICES = [("00:10:00", "10 minutes"), ("01:00:00", "1 hour"), ("04:00:00", "4 hours"), ("1-00:00:00", "1 day")]


def launch_form(partitions: list[str], default) -> list[LaunchOption]:
    """A Slurm cluster's launch options (here or through FirecREST): the partition among
    ``partitions`` and the time limit. New ones each time: a class pins its own choices into them
    (``sbatch.pin_class_partition``, ``sbatch.pin_class_time``)."""
    return [
        LaunchOption("partition", "Partition", [Choice(name, name) for name in partitions], default),
        LaunchOption("time", "Time limit", [Choice(value, label) for value, label in TIME_CHOICES], "01:00:00"),
    ]


def map_state(raw: str) -> str:
    """``CANCELLED by 0`` → cancelled; unknown → pending (never a failure)."""
    word = (raw or "").strip().split(" ")[0].rstrip("+").upper()
    return STATUS_OF.get(word, BackendStatus.PENDING)


def ended(job_id, state: str, exit_code) -> str:
    """A failed job's message, here and through FirecREST."""
    code = f" (exit code {exit_code})" if exit_code not in (None, "") else ""
    return f"Slurm job {job_id} ended {state}{code}"


def _int(text: str) -> int | None:
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


#: what a Slurm client prints when its conversation with slurmctld broke off: the request may or
#: may not have been carried out (for sbatch: the job may be queued), and trying later may work.
LOST_ANSWER = (
    "socket timed out",
    "unable to contact slurm controller",
    "transport endpoint is not connected",
    "zero bytes were transmitted",
    "slurm temporarily unable",
    "connection refused",
)


def run(args: list[str], *, check: bool = True, timeout_error=BackendError) -> subprocess.CompletedProcess:
    """Run a Slurm client command. A command that does not answer, or that says its controller
    did not, raises ``timeout_error`` with ``timeout=True`` (for sbatch :class:`SubmitUncertain`:
    the job may be queued); the facts are set here, where the error is caught (STYLE 6)."""
    try:
        environment = files.base_environment(files.INHERITED_ENVIRONMENT + SLURM_CLIENT_ENVIRONMENT)
        proc = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT, check=False, env=environment)
    except FileNotFoundError:
        raise BackendError(f"{args[0]} is not installed on this host (is this a Slurm login node?)") from None
    except subprocess.TimeoutExpired:
        raise timeout_error(f"{args[0]} did not answer within {TIMEOUT} s", timeout=True) from None
    return checked(proc, check=check, timeout_error=timeout_error)


def checked(proc, *, check: bool = True, timeout_error=BackendError) -> subprocess.CompletedProcess:
    """``proc``'s outcome as :func:`run` reports it (also for the sbatch the privileged helper ran)."""
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        text = f"{proc.args[0]} failed: {detail[-1] if detail else f'exit status {proc.returncode}'}"
        if any(marker in (proc.stderr or "").lower() for marker in LOST_ANSWER):
            raise timeout_error(text, timeout=True)
        raise BackendError(text)
    return proc


def sacct(args: list[str]) -> subprocess.CompletedProcess:
    """``sacct`` on whichever permanent record the site keeps: accounting (slurmdbd) first, else
    the job-completion log (``-c``). Each refuses when its source is off (exit 1), so the first
    that answers is the site's. When neither answers, ``unreadable`` on the result is the
    completion log's refusal if that log is the site's record and this account cannot read it
    (:func:`unreadable_record`), else ''."""
    proc = run(["sacct", *args], check=False)
    proc.unreadable = ""
    if proc.returncode != 0:
        plain = proc
        proc = run(["sacct", "-c", *args], check=False)
        proc.unreadable = unreadable_record(plain, proc)
    return proc


def unreadable_record(plain: subprocess.CompletedProcess, log: subprocess.CompletedProcess) -> str:
    """The completion log's refusal (``sacct: fatal: open /var/log/slurm/jobcomp.log: Permission
    denied``) when the site keeps no accounting (plain sacct: "Slurm accounting storage is
    disabled") and this account cannot open the log; '' for anything that may pass (slurmdbd
    unreachable, a record that answered). Only the former is a lasting fact."""
    if log.returncode == 0 or "accounting storage is disabled" not in (plain.stderr or "").lower():
        return ""
    return next((line.strip() for line in (log.stderr or "").splitlines() if "fatal: open" in line), "")


def finished_job_records() -> tuple[bool, str]:
    """Doctor: whether ``sacct`` answers from a permanent record, asked as :func:`sacct` asks."""
    probe = ["-n", "-P", "-o", "jobid", "-S", "now"]
    answers = "sacct answers from the {} (finished jobs resolve after MinJobAge)"
    plain = run(["sacct", *probe], check=False)
    if plain.returncode == 0:
        return True, answers.format("accounting")
    log = run(["sacct", "-c", *probe], check=False)
    if log.returncode == 0:
        return True, answers.format("completion log")
    refusal = (plain.stderr or log.stderr).strip()
    return False, (
        "sacct answers from neither accounting nor a job completion log"
        + (f" ({refusal})" if refusal else "")
        + ": run slurmdbd (AccountingStorageType=accounting_storage/slurmdbd) or set"
        " JobCompType=jobcomp/filetxt, so jobs finished past MinJobAge still resolve"
    )


#: one job as squeue or sacct shows it: (name, state, elapsed seconds, cores, the reason it waits
#: from squeue or its exit code from sacct)
Record = tuple[str, str, float | None, int | None, str]


def run_dir_for(case_id: str, workspace: Path, pool_remote: dict) -> Path:
    root = (pool_remote or {}).get("working_root")
    return Path(root) / case_id if root else workspace / ".run"


class SlurmBackend(PollsMany, ExecutionBackend):
    needs = (("working_root", "it has no working directory on the cluster"),)
    commands = ("sbatch", "squeue", "scancel")
    runs_as_user = True

    # -- submission --------------------------------------------------------------------------
    def find(self, spec: SubmitSpec) -> str | None:
        live = run(["squeue", "-h", "-t", "all", f"--name={spec.case_id}", "-o", "%i|%j"]).stdout
        ids = [line.split("|")[0] for line in live.splitlines() if line.endswith(f"|{spec.case_id}")]
        if not ids:
            # A job slurmctld has forgotten (past MinJobAge) is only in the permanent record. Its
            # name lookup misses a job for its first ~3.5 s, but such a job is still in squeue.
            done = sacct(["-S", SACCT_START, f"--name={spec.case_id}", "-n", "-P", "-o", "jobid,jobname"])
            ids = [line.split("|")[0] for line in done.stdout.splitlines() if line.endswith(f"|{spec.case_id}")]
        ids = [i for i in ids if i.isdigit()]
        return max(ids, key=int) if ids else None

    def job_script(self, spec: SubmitSpec, rdir: Path) -> str:
        # R-BACK-1: ``--export=NONE``: the job gets none of the submitter's environment, only what
        # is exported here (the harmless basics, the launch specification's environment, the id).
        environment = {
            name: value
            for name, value in files.case_environment(spec).items()
            if name != "TMPDIR"  # the worker's scratch directory means nothing on a compute node
        }
        return sbatch.render(
            job_name=spec.case_id,
            run_dir=str(rdir),
            batch_directives=spec.batch_directives,
            launch_options=spec.launch_options,
            environment=environment,
            command=spec.command,
            export_none=True,
            make_progress_dir=False,
            wall_seconds=sbatch.wall_seconds(spec),
        )

    def submit(self, spec: SubmitSpec) -> str:
        """R-CASE-8: the job is submitted as the case's account (``sbatch`` run as that account
        by the privileged helper), so squeue/sacct show the user and file permissions apply; its
        working directory is that account's (0700) and the run directory is the service's (0711:
        the job reaches its own ``work/``, cannot replace ``job.sh`` or the control files). Its
        files are 0600 or 0640 and no other account reads them: ``job.sh`` (the command, which may
        carry a secret) ends up the job's account's, ``manifest.json`` stays the service's, the
        output files are the account's and readable by the service's group. The service prepares
        the run directory; the privileged helper hands it over and submits (``sbatch`` verb).
        ``run_as`` None or trusted: submitted by the service as itself, which then owns them all."""
        require_command(spec)
        rdir = run_dir_for(spec.case_id, spec.workspace, spec.pool_remote)
        run_as = spec.run_as if spec.run_as is not None and spec.run_as.switches else None
        try:
            files.service_run_dir(rdir, 0o711)  # traverse only: the job reaches its own work/
            if (rdir / "work").exists() and run_as:
                self._helper("clean", spec.case_id, spec.pool_remote)  # a retry: the account's work/
            files.prepare_run_dir(rdir, spec.inputs_dir, spec.shared_dir, shared="copy" if run_as else "link")
            script = rdir / "job.sh"
            text = self.job_script(spec, rdir)  # ScriptError (unsafe value): nothing written or submitted
            files.write_private(script, text.encode())  # 0600: the command may carry a secret
            if not run_as:
                for name in ("stdout", "stderr"):
                    files.write_private(rdir / name)
        except OSError as exc:
            raise BackendError(f"cannot prepare {rdir}: {exc}") from None
        # An sbatch that timed out, or says it lost its controller (``checked``), may have queued
        # the job: uncertain, never a failure (the retry looks the job up by name first, R-CASE-1).
        if run_as:
            account = {"uid": run_as.uid}
            answer = self._helper("sbatch", spec.case_id, spec.pool_remote, account=account, timeout=TIMEOUT)
            if answer.get("timeout"):
                raise SubmitUncertain(f"sbatch did not answer within {TIMEOUT} s", timeout=True)
            proc = subprocess.CompletedProcess(["sbatch"], answer["returncode"], answer["stdout"], answer["stderr"])
            out = checked(proc, timeout_error=SubmitUncertain).stdout.strip()
        else:
            out = run(["sbatch", "--parsable", str(script)], timeout_error=SubmitUncertain).stdout.strip()
        job_id = out.split(";")[0]
        if not job_id.isdigit():
            raise BackendError(f"sbatch answered {out!r} instead of a job id")
        return job_id

    @staticmethod
    def _helper(verb: str, case_id: str, pool_remote: dict, **request) -> dict:
        """One call of the privileged helper about this case's run directory. A ``timeout`` in the
        request is sbatch's own; the call waits a little longer."""
        root = (pool_remote or {}).get("working_root")
        where = {"kind": "slurm", "working_root": root}
        return as_root.call(
            verb,
            {"case_id": case_id, "run": where, **request},
            timeout=request["timeout"] + 30 if "timeout" in request else 24 * 3600,
            working_roots=[root] if root else (),
        )

    # -- observation -----------------------------------------------------------------------
    def _squeue(self, ids: list[str]) -> dict[str, Record]:
        proc = run(["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", "%i|%j|%T|%M|%C|%r"], check=False)
        # One unknown id exits 1 ("Invalid job id specified"); several list only the known ones.
        if proc.returncode != 0 and "Invalid job id" not in proc.stderr:
            detail = proc.stderr.strip().splitlines()
            raise BackendError(f"squeue failed: {detail[-1] if detail else proc.returncode}", transient=True)
        out = {}
        for line in proc.stdout.splitlines():
            parts = line.split("|", 5)
            if len(parts) == 6:
                out[parts[0]] = (parts[1], parts[2], duration_seconds(parts[3], "-"), _int(parts[4]), parts[5].strip())
        return out

    def _sacct(self, ids: list[str]) -> tuple[dict[str, Record], str]:
        """The permanent records of ``ids``, and the completion log's refusal when this account
        cannot read the site's only record (:func:`unreadable_record`)."""
        proc = sacct(
            ["-S", SACCT_START, "-j", ",".join(ids), "-n", "-P", "-o", "jobid,jobname,state,exitcode,elapsed,ncpus"]
        )
        out = {}
        for line in proc.stdout.splitlines():
            parts = line.split("|")
            # Only the job line: its steps (``ID.batch``, ``ID.extern``) are not the job.
            if len(parts) == 6 and parts[0] in ids:
                out[parts[0]] = (parts[1], parts[2], duration_seconds(parts[4], "-"), _int(parts[5]), parts[3])
        return out, proc.unreadable

    def _exit_code(self, job_id: str) -> str:
        proc = run(["scontrol", "-o", "show", "job", job_id], check=False)
        match = re.search(r"\bExitCode=(\S+)", proc.stdout)
        return match.group(1) if match else ""

    def poll_many(self, jobs: list[JobRef]) -> dict[str, BackendState | Exception]:
        if not jobs:
            return {}
        try:
            live = self._squeue([j.remote_id for j in jobs])
        except BackendError as exc:
            return {j.remote_id: exc for j in jobs}
        # Jobs slurmctld has purged (past MinJobAge) are resolved from the completion records.
        # The name must match too: job ids restart when a cluster's state is reset.
        missing = [j.remote_id for j in jobs if j.remote_id not in live or live[j.remote_id][0] != j.case_id]
        archived, unreadable = self._sacct(missing) if missing else ({}, "")
        out: dict[str, BackendState | Exception] = {}
        for job in jobs:
            try:
                out[job.remote_id] = self._state(job, live, archived, unreadable)
            except OSError as exc:  # its logs could not be written (a full disk): its poll alone fails
                out[job.remote_id] = exc
        return out

    def _state(self, job: JobRef, live: dict, archived: dict, unreadable: str) -> BackendState | Exception:
        """One job's answer from the pass's squeue and sacct reads (its output drained)."""
        reason = exit_code = ""
        if job.remote_id in live and live[job.remote_id][0] == job.case_id:
            _name, raw, elapsed, cores, reason = live[job.remote_id]
        elif job.remote_id in archived and archived[job.remote_id][0] == job.case_id:
            _name, raw, elapsed, cores, exit_code = archived[job.remote_id]
        elif unreadable:
            # squeue lists every job it accepted (sbatch returns after it did) until MinJobAge
            # after its end: this one ended and was forgotten (a job failing in its first
            # second, polled after MinJobAge; a worker outage). How it ended is only in the
            # completion log, which this account cannot read: waiting cannot tell more (it
            # was a failed poll backing off for ever, the case pending meanwhile). It ends
            # failed, saying why, with its output (R-CASE-4).
            self._drain(job, limit=None)  # it ends on this answer: all of it
            return BackendState(
                status=BackendStatus.FAILED,
                message=(
                    f"Slurm job {job.remote_id} ended and slurmctld no longer lists it (MinJobAge), and how it "
                    f"ended cannot be read here ({unreadable}): the site's only record is the job completion "
                    "log, which the service's account cannot read. An operator makes JobCompLoc readable by it "
                    "or runs slurmdbd (docs/operations.md, 'Slurm: finished-job records')."
                ),
            )
        else:
            # Not listed yet, or sacct's first-seconds allocation record (``ID|allocation|
            # PENDING``, named "allocation", not the case): "not yet known", a failed poll
            # that changes no state (R-CASE-3), never a step back to pending.
            return BackendError(f"Slurm does not know job {job.remote_id} (yet)", transient=True)
        status = map_state(raw)
        message = ""
        if status == BackendStatus.PENDING and reason and reason != "None":
            message = f"Slurm: {reason}"  # why it waits: JobHeldAdmin, Resources, Priority…
        elif status == BackendStatus.FAILED:
            exit_code = exit_code or self._exit_code(job.remote_id)  # only for failures: one extra call, rarely
            message = ended(job.remote_id, raw.split(" ")[0], exit_code)
        # A finished job writes nothing more: drain its output (it is finalized on this answer).
        self._drain(job, limit=None if status in BackendStatus.TERMINAL else LIVE_DRAIN_BYTES)
        return BackendState(status=status, execution_time=elapsed, cores=cores, message=message)

    @staticmethod
    def _drain(job: JobRef, *, limit: int | None) -> None:
        """The job's output past what its workspace logs hold, at most ``limit`` bytes (None: all)."""
        rdir = run_dir_for(job.case_id, job.workspace, job.pool_remote)
        for stream in ("stdout", "stderr"):
            files.drain_log(rdir / stream, job.workspace / f"{stream}.log", cap=files.log_cap_bytes(), limit=limit)

    def sync(self, job: JobRef, globs: list[str]) -> None:
        self._helper("collect", job.case_id, job.pool_remote, what="live", globs=list(globs or []))

    def fetch_final(self, job: JobRef) -> None:
        if (run_dir_for(job.case_id, job.workspace, job.pool_remote) / "results_fetched").exists():
            return  # a retry whose outcome was not recorded: the results are in, the work is gone
        self._helper("collect", job.case_id, job.pool_remote, what="results", max_bytes=job.max_result_bytes)

    def cancel(self, job: JobRef) -> None:
        state = self.poll_many([job])[job.remote_id]
        if isinstance(state, BackendState) and state.status in BackendStatus.TERMINAL:
            raise AlreadyFinished(f"Slurm job {job.remote_id} already ended")
        run(["scancel", job.remote_id])

    def purge(self, job: JobRef) -> None:
        """The run directory goes (SPEC §8, ``manage.py cleanup``); already gone is fine. Its
        ``work/`` is the account's: the privileged helper removes it first."""
        rdir = run_dir_for(job.case_id, job.workspace, job.pool_remote)
        try:
            if (rdir / "work").exists():
                self._helper("clean", job.case_id, job.pool_remote)
            shutil.rmtree(rdir)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise BackendError(f"the run directory of case {job.case_id} was not removed: {exc}") from None

    # -- launch form and doctor ----------------------------------------------------------------
    def launch_options(self, pool, identity=None) -> LaunchOptions:
        configured = (pool.remote or {}).get("partition") if pool is not None else None
        try:
            lines = run(["sinfo", "-h", "-o", "%P|%a"]).stdout.splitlines()
        except BackendError as exc:
            fallback = [configured] if configured else []
            return LaunchOptions(options=launch_form(fallback, configured), degraded=True, message=str(exc))
        partitions, default = [], configured
        for line in lines:
            name, _, avail = line.partition("|")
            if name.endswith("*"):
                name = name[:-1]
                default = default or name
            if avail == "up":
                partitions.append(name)
        return LaunchOptions(options=launch_form(partitions, default))

    def pin_class_overrides(self, answer: LaunchOptions, resource_class) -> LaunchOptions:
        return sbatch.pin_class_time(sbatch.pin_class_partition(answer, resource_class), resource_class)

    def doctor(self, pool=None) -> list[Check]:
        trusted = pool is not None and pool.trusted
        remote = (pool.remote or {}) if pool is not None else {}
        doctor = Doctor([as_root.helper_check(trusted, cgroup=False)])
        if not trusted:
            doctor.append(Check("cases root parent", *root_parent_check()))
        for command in ("sbatch", "squeue", "scontrol", "sacct", "scancel", "sinfo"):
            found = shutil.which(command)
            missing = f"{command} is not on PATH: install the Slurm client tools (slurm-client) on this host"
            doctor.append(Check(f"command {command}", bool(found), found or missing))
        doctor.check("controller", controller_check, fix="start slurmctld or fix slurm.conf/munge on this host")
        if remote.get("partition"):
            doctor.check("partition", lambda: partition_check(remote["partition"]))
        if remote.get("working_root"):
            doctor.append(working_root_check(remote["working_root"], trusted))
        if shutil.which("sacct"):
            doctor.append(Check("finished-job records", *finished_job_records()))
        return doctor


def controller_check() -> tuple[bool, str]:
    ping = run(["scontrol", "ping"]).stdout.strip()
    return "UP" in ping, ping or "no answer from scontrol ping"


def partition_check(partition: str) -> tuple[bool, str]:
    found = run(["sinfo", "-h", "-p", partition, "-o", "%P|%a"]).stdout.strip()
    if found and found.endswith("|up"):
        return True, f"partition {partition} is up"
    return False, f"partition {partition} is missing or not up: fix the pool's remote.partition"


def working_root_check(root: str, trusted: bool) -> Check:
    path = Path(root)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".gridgate-doctor"
        probe.write_text("ok")
        probe.unlink()
        problem = files.unsafe_parent(path)
        if not problem and not trusted:
            closed, message = root_parent_check(path)
            problem = None if closed else message
    except OSError as exc:
        return Check("working_root", False, f"{root} is not writable ({exc}): fix remote.working_root")
    return Check("working_root", not problem, problem or f"{root} is writable")
