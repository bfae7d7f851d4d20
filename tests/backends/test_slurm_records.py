"""How the Slurm backend reads Slurm's answers, with the client commands replaced by what Slurm
22.05 prints (PROVIDERS.md, "Slurm with accounting"): these run everywhere, no cluster needed.
The same paths run against real clusters in test_slurm.py (CI runs it on both set-ups)."""

import subprocess
import uuid
from pathlib import Path

import pytest

from apps.backends import slurm
from apps.backends.base import BackendError, BackendStatus, JobRef, SubmitSpec, SubmitUncertain
from apps.backends.slurm import SlurmBackend

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


ACCOUNTING_SITE = {
    "squeue": (0, "", ""),  # slurmctld forgot the job (MinJobAge)
    ("sacct", False): (
        0,
        f"12|{CASE}|COMPLETED|0:0|00:00:03|1\n12.batch|batch|COMPLETED|0:0|00:00:03|1\n"
        "12.extern|extern|COMPLETED|0:0|00:00:03|1\n",
        "",
    ),
    ("sacct", True): (1, "", "Slurm job completion is disabled\n"),
}


def test_a_finished_job_is_read_from_plain_sacct_on_an_accounting_site(monkeypatch, tmp_path):
    calls = fake_slurm(monkeypatch, ACCOUNTING_SITE)
    state = SlurmBackend().poll(job(tmp_path))
    assert state.status == BackendStatus.SUCCEEDED and state.execution_time == 3 and state.cores == 1
    assert not any(args[0] == "sacct" and "-c" in args for args in calls)  # plain sacct answered


def test_a_finished_job_falls_back_to_the_completion_log_without_accounting(monkeypatch, tmp_path):
    fake_slurm(
        monkeypatch,
        {
            "squeue": (0, "", ""),
            ("sacct", False): (1, "", "Slurm accounting storage is disabled\n"),
            ("sacct", True): (0, f"12|{CASE}|FAILED|3:0|00:00:01|1\n", ""),
        },
    )
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
    spec = SubmitSpec(CASE, "true", Path("/nonexistent"), {}, {}, [], {}, {}, [])
    assert SlurmBackend().find(spec) == "12"


@pytest.mark.parametrize(
    "stderr",
    [
        "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation\n",
        "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)\n",
    ],
)
def test_sbatch_that_lost_its_controller_is_an_uncertain_submission_not_a_failure(monkeypatch, stderr):
    monkeypatch.setattr(slurm.subprocess, "run", lambda args, **kw: subprocess.CompletedProcess(args, 1, "", stderr))
    with pytest.raises(SubmitUncertain) as uncertain:
        slurm.run(["sbatch", "--parsable", "job.sh"], timeout_error=SubmitUncertain)
    assert uncertain.value.timeout and uncertain.value.transient  # facts as attributes, not text


def test_an_sbatch_refusal_stays_a_permanent_error(monkeypatch):
    stderr = "sbatch: error: Batch job submission failed: Requested node configuration is not available\n"
    monkeypatch.setattr(slurm.subprocess, "run", lambda args, **kw: subprocess.CompletedProcess(args, 1, "", stderr))
    with pytest.raises(BackendError) as refused:
        slurm.run(["sbatch", "--parsable", "job.sh"], timeout_error=SubmitUncertain)
    assert not isinstance(refused.value, SubmitUncertain) and not refused.value.transient


def test_doctor_accepts_accounting_and_never_tells_a_slurmdbd_site_to_run_slurmdbd(monkeypatch):
    monkeypatch.setattr(slurm.shutil, "which", lambda name: f"/usr/bin/{name}")
    fake_slurm(monkeypatch, {"scontrol": (0, "Slurmctld(primary) at vm is UP\n", ""), **ACCOUNTING_SITE})
    check = next(c for c in SlurmBackend().doctor() if c.name == "finished-job records")
    assert check.ok and "accounting" in check.message and "slurmdbd" not in check.message


def test_doctor_fails_a_site_with_neither_accounting_nor_a_completion_log(monkeypatch):
    monkeypatch.setattr(slurm.shutil, "which", lambda name: f"/usr/bin/{name}")
    fake_slurm(
        monkeypatch,
        {
            "scontrol": (0, "UP\n", ""),
            ("sacct", False): (1, "", "Slurm accounting storage is disabled\n"),
            ("sacct", True): (1, "", "Slurm job completion is disabled\n"),
        },
    )
    check = next(c for c in SlurmBackend().doctor() if c.name == "finished-job records")
    assert not check.ok and "JobCompType=jobcomp/filetxt" in check.message and "slurmdbd" in check.message
