"""How the Slurm backend reads Slurm's answers, with the client commands replaced by what Slurm
22.05 prints (PROVIDERS.md, "Slurm with accounting"): these run everywhere, no cluster needed.
The same paths run against real clusters in test_slurm.py (CI runs it on both set-ups)."""

import subprocess
import uuid
from pathlib import Path

import pytest

from apps.backends import slurm
from apps.backends.base import BackendError, BackendStatus, JobRef, SubmitUncertain
from apps.backends.slurm import SlurmBackend
from tests.backends.conftest import submit_spec

CASE = str(uuid.uuid4())


def fake_slurm(monkeypatch, answers):
    """``answers``: {(command, "-c" present?): (returncode, stdout, stderr)}; records calls."""
    calls = []

    def fake_run(args, *, check=True, timeout_error=BackendError):
        calls.append(args)
        key = (args[0], "-c" in args) if args[0] == "sacct" else args[0]
        code, out, err = answers.get(key, (0, "", ""))
        return subprocess.CompletedProcess(args, code, out, err)

    monkeypatch.setattr(slurm, "run", fake_run)
    return calls


def job(tmp_path, remote_id="12"):
    return JobRef(CASE, remote_id, tmp_path, {"working_root": str(tmp_path / "scratch")})


#: what sacct prints when the site keeps no accounting, and no completion log
NO_ACCOUNTING = (1, "", "Slurm accounting storage is disabled\n")
NO_COMPLETION_LOG = (1, "", "Slurm job completion is disabled\n")
ACCOUNTING_SITE = {
    "squeue": (0, "", ""),  # slurmctld forgot the job (MinJobAge)
    ("sacct", False): (
        0,
        f"12|{CASE}|COMPLETED|0:0|00:00:03|1\n12.batch|batch|COMPLETED|0:0|00:00:03|1\n"
        "12.extern|extern|COMPLETED|0:0|00:00:03|1\n",
        "",
    ),
    ("sacct", True): NO_COMPLETION_LOG,
}


def test_a_finished_job_is_read_from_plain_sacct_on_an_accounting_site(monkeypatch, tmp_path):
    calls = fake_slurm(monkeypatch, ACCOUNTING_SITE)
    state = SlurmBackend().poll(job(tmp_path))
    assert state.status == BackendStatus.SUCCEEDED and state.execution_time == 3 and state.cores == 1
    assert not any(args[0] == "sacct" and "-c" in args for args in calls)  # plain sacct answered


def test_a_finished_job_falls_back_to_the_completion_log_without_accounting(monkeypatch, tmp_path):
    log = (0, f"12|{CASE}|FAILED|3:0|00:00:01|1\n", "")
    fake_slurm(monkeypatch, {"squeue": (0, "", ""), ("sacct", False): NO_ACCOUNTING, ("sacct", True): log})
    state = SlurmBackend().poll(job(tmp_path))
    assert state.status == BackendStatus.FAILED and "exit code 3:0" in state.message


def test_the_allocation_record_of_the_first_seconds_is_not_yet_known(monkeypatch, tmp_path):
    """sacct's ``ID|allocation|PENDING`` (not the case's name) is "not yet known": a failed poll
    that changes no state, never a step back to pending (R-CASE-3)."""
    fake_slurm(
        monkeypatch,
        {"squeue": (0, "", ""), ("sacct", False): (0, "12|allocation|PENDING|0:0|00:00:00|1\n", "")},
    )
    with pytest.raises(BackendError) as unknown:
        SlurmBackend().poll(job(tmp_path))
    assert "does not know" in str(unknown.value) and unknown.value.transient


def test_squeue_pending_reason_reaches_the_state_message(monkeypatch, tmp_path):
    fake_slurm(monkeypatch, {"squeue": (0, f"12|{CASE}|PENDING|0:00|1|JobHeldAdmin\n", "")})
    state = SlurmBackend().poll(job(tmp_path))
    assert state.status == BackendStatus.PENDING and state.message == "Slurm: JobHeldAdmin"
    fake_slurm(monkeypatch, {"squeue": (0, f"12|{CASE}|RUNNING|0:05|1|None\n", "")})
    assert SlurmBackend().poll(job(tmp_path)).message == ""


def test_find_by_name_reads_accounting_for_a_job_slurmctld_forgot(monkeypatch):
    fake_slurm(monkeypatch, {"squeue": (0, "", ""), ("sacct", False): (0, f"12|{CASE}\n12.batch|batch\n", "")})
    assert SlurmBackend().find(submit_spec(CASE, Path("/nonexistent"))) == "12"


@pytest.mark.parametrize(
    ("stderr", "uncertain"),
    [
        ("sbatch: error: Batch job submission failed: Socket timed out on send/recv operation\n", True),
        ("sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)\n", True),
        ("sbatch: error: Batch job submission failed: Requested node configuration is not available\n", False),
    ],
)
def test_sbatch_that_lost_its_controller_is_an_uncertain_submission_and_a_refusal_a_permanent_error(
    monkeypatch, stderr, uncertain
):
    monkeypatch.setattr(slurm.subprocess, "run", lambda args, **kw: subprocess.CompletedProcess(args, 1, "", stderr))
    with pytest.raises(BackendError) as failed:
        slurm.run(["sbatch", "--parsable", "job.sh"], timeout_error=SubmitUncertain)
    assert isinstance(failed.value, SubmitUncertain) is uncertain
    assert failed.value.transient is uncertain and failed.value.timeout is uncertain  # facts as attributes, not text


def test_sbatch_timeout_is_an_uncertain_submission_not_a_failure(monkeypatch, tmp_path):
    """R-CASE-1: sbatch may have queued the job before its answer timed out."""

    def hung(*args, **kwargs):
        raise subprocess.TimeoutExpired(args[0], slurm.TIMEOUT)

    monkeypatch.setattr(slurm.subprocess, "run", hung)
    with pytest.raises(SubmitUncertain):
        slurm.run(["sbatch", "--parsable", "job.sh"], timeout_error=SubmitUncertain)
    with pytest.raises(SubmitUncertain):
        SlurmBackend().submit(submit_spec(str(uuid.uuid4()), tmp_path))


def test_sacct_lookups_look_back_past_midnight(monkeypatch):
    """A job submitted yesterday is still found by name (no second submission) and polled."""
    calls = fake_slurm(monkeypatch, {})
    SlurmBackend().find(submit_spec("c", Path("/tmp")))  # noqa: S108
    SlurmBackend()._sacct(["12"])
    sacct = [args for args in calls if args[0] == "sacct"]
    assert len(sacct) == 2 and all(args[args.index("-S") + 1] == slurm.SACCT_START for args in sacct)


@pytest.mark.parametrize(
    "plain, log, ends",
    [
        (NO_ACCOUNTING, (1, "", "sacct: fatal: open /var/log/slurm/jobcomp.log: Permission denied\n"), True),
        # Nothing lasting: slurmdbd unreachable; a log that answered without the job (not yet written).
        ((1, "", "sacct: error: slurm_persist_conn_open: Connection refused\n"), NO_COMPLETION_LOG, False),
        (NO_ACCOUNTING, (0, "", ""), False),
    ],
)
def test_a_job_slurmctld_forgot_ends_failed_only_when_its_record_cannot_be_read_for_good(
    monkeypatch, tmp_path, plain, log, ends
):
    """Slurm 22.05's own words: with no slurmdbd, plain sacct says "accounting storage is
    disabled" and ``sacct -c`` on a log it cannot open "fatal: open …". Only that is lasting; a
    slurmdbd that does not answer, or a record without the job yet, stays a failed poll (R-CASE-3)."""
    fake_slurm(monkeypatch, {"squeue": (0, "", ""), ("sacct", False): plain, ("sacct", True): log})
    state = SlurmBackend().poll_many([JobRef("c", "12", tmp_path, {})])["12"]
    if ends:
        assert state.status == BackendStatus.FAILED and "Permission denied" in state.message
    else:
        assert isinstance(state, Exception) and "does not know" in str(state)


def test_a_job_ended_for_an_unreadable_record_keeps_all_its_output(monkeypatch, tmp_path):
    """Its case ends on this answer, so the output is drained to the end, not one poll's 4 MiB."""
    unreadable = (1, "", "sacct: fatal: open /var/log/slurm/jobcomp.log: Permission denied\n")
    fake_slurm(monkeypatch, {"squeue": (0, "", ""), ("sacct", False): NO_ACCOUNTING, ("sacct", True): unreadable})
    (tmp_path / ".run").mkdir()
    (tmp_path / ".run" / "stdout").write_bytes(b"x" * (slurm.LIVE_DRAIN_BYTES + 1000))
    state = SlurmBackend().poll_many([JobRef("c", "12", tmp_path, {})])["12"]
    assert state.status == BackendStatus.FAILED
    assert (tmp_path / "stdout.log").stat().st_size == slurm.LIVE_DRAIN_BYTES + 1000


def test_state_mapping_never_turns_an_unknown_state_into_a_failure():
    """Slurm's durations (``duration_seconds(text, "-")``) are tests/backends/unit/test_durations.py's."""
    assert slurm.map_state("COMPLETED") == "succeeded"
    assert slurm.map_state("CANCELLED by 0") == "cancelled"
    assert slurm.map_state("OUT_OF_MEMORY") == "failed"
    assert slurm.map_state("COMPLETING") == "running"
    assert slurm.map_state("SOME_NEW_STATE") == "pending"


def records_check(monkeypatch, answers):
    """Doctor's "finished-job records" line on a host with every Slurm command."""
    monkeypatch.setattr(slurm.shutil, "which", lambda name: f"/usr/bin/{name}")
    fake_slurm(monkeypatch, answers)
    return next(c for c in SlurmBackend().doctor() if c.name == "finished-job records")


def test_doctor_accepts_accounting_and_never_tells_a_slurmdbd_site_to_run_slurmdbd(monkeypatch):
    check = records_check(monkeypatch, {"scontrol": (0, "Slurmctld(primary) at vm is UP\n", ""), **ACCOUNTING_SITE})
    assert check.ok and "accounting" in check.message and "slurmdbd" not in check.message


def test_doctor_fails_a_site_with_neither_accounting_nor_a_completion_log(monkeypatch):
    answers = {"scontrol": (0, "UP\n", ""), ("sacct", False): NO_ACCOUNTING, ("sacct", True): NO_COMPLETION_LOG}
    check = records_check(monkeypatch, answers)
    assert not check.ok and "JobCompType=jobcomp/filetxt" in check.message and "slurmdbd" in check.message
