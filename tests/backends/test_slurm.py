"""The Slurm backend against a real single-node cluster (scripts/slurm-local.sh start).

Skipped with the reason when no cluster answers, except under CI=true (or GRIDGATE_SLURM_TESTS=1)
where a missing cluster fails the tests. Tests wait for real jobs with bounded polling loops.
"""

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from apps.backends.base import BackendStatus, JobRef
from apps.backends.slurm import SlurmBackend
from apps.cases import passes, services, workspace
from apps.cases.models import Case, CaseStatus
from apps.resources.models import ResourceClass, ResourcePool
from tests import factories
from tests.backends.conftest import (
    SECRETS,
    api_create,
    api_launch,
    api_launched,
    launch,
    poll_until,
    read_as,
    submit_spec,
    wait_for_terminal,
    wait_until,
    write_inputs,
)
from tests.backends.test_launch_options import HOSTILE, assert_class_partition_wins, launch_with
from tests.cases.conftest import launched

pytestmark = [pytest.mark.slurm, pytest.mark.django_db]

#: a spec's job: one core, on the local cluster's partition
ONE_CORE = {"resources": {"cpu": 1, "memory": 1, "gpu": 0}, "batch_directives": ["--partition=debug"]}


@pytest.fixture
def working_root(request):
    """A working root the jobs' accounts can traverse (0711): pytest's own tmp_path is 0700 root."""
    root = tempfile.mkdtemp(prefix="gridgate-slurm-")
    os.chmod(root, 0o711)  # noqa: S103 - traverse only, like a cluster's scratch root
    request.addfinalizer(lambda: shutil.rmtree(root, ignore_errors=True))
    return Path(root)


@pytest.fixture
def owner_account(link_account, owner):
    """R-CASE-8: Slurm jobs are submitted as the case owner's linked account."""
    return link_account(owner)


@pytest.fixture
def slurm_pool(slurm_cluster, working_root, owner_account):
    remote = {"partition": "debug", "working_root": str(working_root / "scratch")}
    return factories.pool("hpc", kind="slurm", remote=remote, class_name="core")


def early_job(root: Path, command: str, inputs: dict | None = None):
    """A one-core job of a case under ``root`` (its workspace, with ``inputs``), submitted as the
    service when the module starts: (case id, job id, the pool's remote)."""
    case_id = str(uuid.uuid4())
    ws = root / "cases" / case_id
    for name in ("inputs", "results"):
        (ws / name).mkdir(parents=True)
    for name, text in (inputs or {}).items():
        (ws / "inputs" / name).write_text(text)
    remote = {"partition": "debug", "working_root": str(root / "scratch")}
    spec = submit_spec(case_id, ws, command=command, pool_remote=remote, **ONE_CORE)
    return case_id, SlurmBackend().submit(spec), remote


@pytest.fixture(scope="module")
def aged_job(slurm_cluster, tmp_path_factory):
    """Submitted when the module starts, so by the last test slurmctld has (nearly) purged it."""
    root = tmp_path_factory.mktemp("aged")
    return root, *early_job(root, "cat in.txt > result.txt; echo aged", {"in.txt": "aged input\n"})


DEFAULT_CONF = Path("/etc/slurm/slurm.conf")  # scripts/slurm-local.sh's cluster: no slurmdbd, jobcomp/filetxt


@pytest.fixture(scope="module")
def unreadable_log_conf(slurm_cluster, tmp_path_factory):
    """The local cluster's slurm.conf with a completion log this process cannot open: what a
    site's worker sees when ``JobCompLoc`` is root's (``sacct -c``: "fatal: open …"). The tests
    run as root, who opens any file, so the log is named where none exists."""
    text = DEFAULT_CONF.read_text()
    assert "JobCompType=jobcomp/filetxt" in text and "slurmdbd" not in text, "not scripts/slurm-local.sh's cluster"
    conf = tmp_path_factory.mktemp("unreadable-log") / "slurm.conf"
    lines = [line for line in text.splitlines() if not line.startswith("JobCompLoc=")]
    conf.write_text("\n".join([*lines, "JobCompLoc=/nonexistent/gridgate-test/jobcomp.log"]) + "\n")
    return conf


@pytest.fixture(scope="module")
def forgotten_failure(unreadable_log_conf, tmp_path_factory):
    """A job that fails in its first second, submitted when the module starts (on the local
    cluster, as the service), so that by the end of the module slurmctld has forgotten it."""
    root = tmp_path_factory.mktemp("forgotten")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SLURM_CONF", str(DEFAULT_CONF))
        case_id, job_id, remote = early_job(root, "echo 'no mesh' >&2; exit 3")
    return root, case_id, job_id, remote, unreadable_log_conf


def test_slurm_job_completes_and_its_results_come_back(slurm_pool, make_case):
    case = make_case(resource_class=slurm_pool.classes.get(), command="cat in.txt > out.txt; echo computed")
    case = launched(write_inputs(case), launch_options={"time": "00:10:00"})
    assert case.status == CaseStatus.PENDING and case.backend == "slurm" and case.remote_id.isdigit()
    text = (Path(slurm_pool.remote["working_root"]) / str(case.id) / "job.sh").read_text()
    assert f"#SBATCH --job-name={case.id}" in text and "#SBATCH --partition=debug" in text
    assert "#SBATCH --time=00:10:00" in text

    case = wait_for_terminal(case, timeout=90)
    assert case.status == CaseStatus.DONE, case.last_error
    assert (workspace.case_dir(case.id) / "results" / "out.txt").read_text() == "input\n"
    assert not (workspace.case_dir(case.id) / "results" / "in.txt").exists()
    assert "computed" in (workspace.case_dir(case.id) / "stdout.log").read_text()
    assert case.cores == 1 and case.execution_time is not None


def test_slurm_attack_runs_as_the_owner_and_reaches_no_secret_and_no_other_users_files(
    slurm_pool, api, owner, member, link_account, owner_account, monkeypatch, cases_root, working_root
):
    """R-CASE-8 on Slurm: the job is the owner's (squeue/scontrol say so, the account owns its
    files), it sees none of the worker's variables (R-BACK-1: neither sbatch nor the job inherits
    them, --export=NONE) and none of another user's inputs."""
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    victim_account = link_account(member, "gridgate-test2")
    rc = slurm_pool.classes.get()
    victim = api_launched(
        api(member), rc, "cat victim.txt > copy.txt; sleep 20", [("victim.txt", b"victim-private-data-0815")]
    )
    victim_job = Case.objects.get(pk=victim).remote_id
    attack = (
        "GP=$(awk '{print $4}' /proc/$PPID/stat); tr '\\0' '\\n' < /proc/$GP/environ > env.txt; "
        "for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ; done >> env.txt 2>/dev/null; env >> env.txt; "
        f"cat ../../../*/inputs/* ../../*/work/* {cases_root}/*/inputs/* > loot.txt 2>/dev/null; "
        "id -u > uid.txt; true"
    )
    attacker = api_launched(api(owner), rc, attack)
    text = (working_root / "scratch" / attacker / "job.sh").read_text()
    assert "#SBATCH --export=NONE" in text and "4711" not in text
    job_id = Case.objects.get(pk=attacker).remote_id
    shown = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    assert f"UserId={owner_account.pw_name}(" in shown
    case = wait_for_terminal(Case.objects.get(pk=attacker), timeout=90)
    assert case.status == CaseStatus.DONE, case.last_error
    results = workspace.case_dir(attacker) / "results"
    env = (results / "env.txt").read_text()
    assert not any(value in env for value in SECRETS.values()) and f"GRIDGATE_CASE_ID={attacker}" in env
    assert "0815" not in (results / "loot.txt").read_text()
    assert int((results / "uid.txt").read_text()) == owner_account.pw_uid
    assert not (working_root / "scratch" / attacker / "work").exists()  # dropped once fetched
    work = working_root / "scratch" / victim / "work"
    assert work.stat().st_uid == victim_account.pw_uid and (work.stat().st_mode & 0o777) == 0o700
    subprocess.run(["scancel", victim_job], capture_output=True, check=False)


def test_another_account_cannot_read_the_job_script_or_the_manifest_of_a_slurm_case(
    slurm_pool, make_case, owner_account, sandbox_host, working_root
):
    """``job.sh`` (the command, with whatever secret it carries) and manifest.json were 0644 in a
    run directory any account may traverse. Both are 0600 now: job.sh the job's account's,
    manifest.json the service's; sbatch still reads the script (the job runs)."""
    command = "echo token=secret-4711 > /dev/null; cat in.txt > out.txt"
    case = launch(make_case, slurm_pool, command)
    assert case.status == CaseStatus.PENDING, case.last_error
    rdir = working_root / "scratch" / str(case.id)
    script, manifest = rdir / "job.sh", rdir / "manifest.json"
    other = sandbox_host["gridgate-test2"]
    for path in (script, manifest):
        attempt = read_as(other, path)
        assert attempt.returncode != 0 and "4711" not in attempt.stdout and "in.txt" not in attempt.stdout, path
    assert read_as(owner_account, manifest).returncode != 0  # the service's record, not the job's
    assert "secret-4711" in read_as(owner_account, script).stdout  # the owner's own command
    assert (script.stat().st_uid, script.stat().st_mode & 0o777) == (owner_account.pw_uid, 0o600)
    assert (manifest.stat().st_uid, manifest.stat().st_mode & 0o777) == (os.geteuid(), 0o600)
    case = wait_for_terminal(case, timeout=90)
    assert case.status == CaseStatus.DONE, case.last_error
    assert (workspace.case_dir(case.id) / "results" / "out.txt").read_text() == "input\n"


def test_slurm_launch_without_a_linked_account_is_refused(slurm_cluster, working_root, api, member, db):
    rc = factories.pool("hpc2", kind="slurm", remote={"partition": "debug"}, class_name="core").classes.get()
    case_id = api_create(api(member), rc, "true")
    response = api_launch(api(member), case_id)
    assert response.status_code == 403 and "operator" in response.json()["detail"]
    assert Case.objects.get(pk=case_id).status == CaseStatus.PREPARED


def test_a_slurm_job_runs_within_its_class_wall_time_not_unlimited(slurm_pool, make_case):
    """F15: the job's TimeLimit is the class's wall time (Slurm showed UNLIMITED before)."""
    rc = slurm_pool.classes.get()
    rc.wall_time, rc.max_wall_time = 2 * 3600, 4 * 3600
    rc.save()
    case = launched(make_case(resource_class=rc, command="sleep 30"))
    assert case.status == CaseStatus.PENDING, case.last_error
    try:
        shown = subprocess.run(["scontrol", "show", "job", case.remote_id], capture_output=True, text=True).stdout
        assert "TimeLimit=02:00:00" in shown, shown
    finally:
        subprocess.run(["scancel", case.remote_id], capture_output=True, check=False)


def test_failing_slurm_job_ends_failed(slurm_pool, make_case):
    case = make_case(resource_class=slurm_pool.classes.get(), command="echo 'bad mesh' >&2; exit 4")
    case = wait_for_terminal(launched(case), timeout=90)
    assert case.status == CaseStatus.FAILED
    assert "FAILED" in case.last_error and "4" in case.last_error
    assert "bad mesh" in (workspace.case_dir(case.id) / "stderr.log").read_text()


def test_scancel_ends_cancelled(slurm_pool, make_case, request):
    case = launched(make_case(resource_class=slurm_pool.classes.get(), command="sleep 300"))
    request.addfinalizer(lambda: subprocess.run(["scancel", case.remote_id], capture_output=True, check=False))
    case = poll_until(case, lambda c: c.status == CaseStatus.RUNNING, timeout=60)
    case = services.cancel_case(case)
    assert case.status == CaseStatus.CANCELLED
    state = SlurmBackend().poll(passes.job_ref(case))
    assert state.status in (BackendStatus.CANCELLED, BackendStatus.RUNNING)  # RUNNING = still completing
    wait_until(lambda: SlurmBackend().poll(passes.job_ref(case)).status == BackendStatus.CANCELLED, timeout=30)


def test_retried_launch_adopts_the_slurm_job_by_name(slurm_pool, make_case):
    case = make_case(resource_class=slurm_pool.classes.get(), command="sleep 1")
    job_id = SlurmBackend().submit(passes.build_spec(case))  # reached Slurm, then the launcher died
    Case.objects.filter(pk=case.pk).update(
        launch_requested_at=timezone.now() - timedelta(minutes=5),
        lease_owner="dead",
        lease_until=timezone.now() - timedelta(minutes=3),
    )
    passes.submit_pass()
    case.refresh_from_db()
    assert case.status == CaseStatus.PENDING and case.remote_id == job_id
    listed = subprocess.run(
        ["squeue", "-h", "-t", "all", f"--name={case.id}", "-o", "%i"], capture_output=True, text=True
    )
    assert listed.stdout.split() == [job_id]
    wait_for_terminal(case, timeout=90)


def test_launch_options_list_partitions(slurm_pool):
    options = SlurmBackend().launch_options(slurm_pool)
    assert not options.degraded
    partitions = next(o for o in options.options if o.key == "partition")
    assert {c.value for c in partitions.choices} >= {"debug", "normal"} and partitions.default == "debug"


def test_doctor_checks_pass_on_the_local_cluster(slurm_pool):
    checks = SlurmBackend().doctor(slurm_pool)
    assert checks and all(check.ok for check in checks), [(c.name, c.message) for c in checks if not c.ok]


def test_r_back_6_the_issue_example_is_400_on_slurm_naming_the_partitions_and_times(slurm_pool, make_case, api, owner):
    """Hostile batch options: {"partition": "gpu-premium", "time": "365-00:00:00"} went straight into #SBATCH."""
    case = make_case(resource_class=slurm_pool.classes.get(), command="true")
    response = launch_with(api(owner), case, HOSTILE)
    assert response.status_code == 400
    detail = response.json()["detail"]
    assert "debug" in detail and "normal" in detail and "1-00:00:00" in detail
    case.refresh_from_db()
    assert case.status == CaseStatus.PREPARED
    assert not (Path(slurm_pool.remote["working_root"]) / str(case.id)).exists()  # no script, no job


def test_r_back_6_a_class_partition_survives_every_default_in_the_slurm_script(
    slurm_cluster, working_root, owner_account, make_case, api, owner
):
    """sinfo's default partition is debug; the class says normal: the form offers normal only, a
    launch with every default the form shows submits to normal, and debug is refused."""
    pool = ResourcePool.objects.create(
        name="hpc-override", kind="slurm", public=True, remote={"working_root": str(working_root / "scratch")}
    )
    rc = ResourceClass.objects.create(
        pool=pool, name="long", cpu=1, memory=1, default=True, remote={"partition": "normal"}
    )
    case, _form = assert_class_partition_wins(api(owner), make_case, rc, "debug", script="job.sh")
    wait_for_terminal(case, timeout=90)


def wait_forgotten(job_id: str):
    """Until slurmctld has forgotten the job: MinJobAge (5 s) + its ~60 s purge cycle."""
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        known = subprocess.run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%i"], capture_output=True, text=True)
        if job_id not in known.stdout.split():
            return
        time.sleep(1)
    pytest.fail(f"job {job_id} never aged out of slurmctld")


def test_job_past_min_job_age_is_still_resolved_from_sacct(aged_job, settings, make_case, slurm_pool):
    """Runs last in the module: the job was submitted when the module started."""
    root, case_id, job_id, remote = aged_job
    wait_forgotten(job_id)

    settings.GRIDGATE_CASES_ROOT = root / "cases"
    rc = factories.pool("aged", kind="slurm", remote=remote, class_name="core").classes.get()
    case = make_case(resource_class=rc, command="unused")
    Case.objects.filter(pk=case.pk).delete()
    Case.objects.create(
        id=case_id,
        owner=case.owner,
        name="aged",
        resource_class=rc,
        command="cat in.txt > result.txt",
        status=CaseStatus.RUNNING,
        backend="slurm",
        remote_id=job_id,
        submitted_at=timezone.now(),
    )
    for name in ("stdout.log", "stderr.log"):
        (root / "cases" / case_id / name).touch()
    state = SlurmBackend().poll(JobRef(case_id, job_id, root / "cases" / case_id, remote))
    assert state.status == BackendStatus.SUCCEEDED
    case = wait_for_terminal(Case.objects.get(pk=case_id), timeout=90)
    assert case.status == CaseStatus.DONE
    assert (root / "cases" / case_id / "results" / "result.txt").read_text() == "aged input\n"


def test_a_forgotten_job_whose_completion_log_cannot_be_read_ends_failed_saying_why(forgotten_failure, monkeypatch):
    """Runs after the aged job (the same wait): a job that failed in its first second and that
    slurmctld has forgotten (MinJobAge), on a site whose only record, the completion log, this
    account cannot open. Its poll was a failed poll backing off for ever (the case pending for
    minutes, then for good); it ends failed, with the reason and the operator's fix."""
    root, case_id, job_id, remote, conf = forgotten_failure
    monkeypatch.setenv("SLURM_CONF", str(DEFAULT_CONF))
    wait_forgotten(job_id)
    monkeypatch.setenv("SLURM_CONF", str(conf))
    for name in ("stdout.log", "stderr.log"):
        (root / "cases" / case_id / name).touch()
    state = SlurmBackend().poll(JobRef(case_id, job_id, root / "cases" / case_id, remote))
    assert state.status == BackendStatus.FAILED
    assert "fatal: open" in state.message and "JobCompLoc" in state.message
    assert "no mesh" in (root / "cases" / case_id / "stderr.log").read_text()  # its output came back


def test_a_held_jobs_reason_from_squeue_reaches_the_case(slurm_pool, make_case, request):
    """The pending reason (squeue %r; sacct says None) reaches the case and its history."""
    case = make_case(resource_class=slurm_pool.classes.get(), command="true")
    spec = passes.build_spec(case)
    # Not startable for an hour, then held by the administrator (root): squeue says JobHeldAdmin.
    spec.batch_directives = [*spec.batch_directives, "--begin=now+3600"]
    job_id = SlurmBackend().submit(spec)
    request.addfinalizer(lambda: subprocess.run(["scancel", job_id], capture_output=True, check=False))
    subprocess.run(["scontrol", "hold", job_id], capture_output=True, check=True)
    Case.objects.filter(pk=case.pk).update(
        status=CaseStatus.PENDING, backend="slurm", remote_id=job_id, next_poll_at=timezone.now()
    )
    passes.poll_pass(case_ids=[case.id])
    case.refresh_from_db()
    assert case.status == CaseStatus.PENDING and case.status_message == "Slurm: JobHeldAdmin"
    assert case.events.filter(kind="note", message="Slurm: JobHeldAdmin").exists()
