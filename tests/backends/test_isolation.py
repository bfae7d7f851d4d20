"""R-CASE-8 on the local backend, through the API: a user's command reaches nothing but its own
workspace. The cases really run, in bubblewrap, as the test accounts (root and bwrap needed;
required under CI)."""

import os
import shutil
import uuid
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from apps.backends.local import run_dir
from apps.cases import passes, workspace
from apps.cases.models import Case, CaseStatus
from tests import factories
from tests.backends.conftest import (
    SECRETS,
    api_create,
    api_launch,
    api_launched,
    read_as,
    wait_for_terminal,
    wait_until,
)

pytestmark = [pytest.mark.django_db, pytest.mark.sandbox]

#: a command reading the service's environment and its neighbours' inputs, plus what it could try
#: with the absolute cases root
ATTACK = (
    "GP=$(awk '{print $4}' /proc/$PPID/stat); tr '\\0' '\\n' < /proc/$GP/environ > env.txt; "
    "cat ../../../*/inputs/* > loot.txt; cat {root}/*/inputs/* {root}/*/.run/work/* >> loot.txt; "
    "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done > procs.txt; "
    "tr '\\0' '\\n' < /proc/1/environ >> env.txt; env >> env.txt; id -u > uid.txt; ls -a {root} > cases.txt; true"
)


def download(client, case_id, path):
    response = client.get(f"/api/v1/cases/{case_id}/files/{path}")
    assert response.status_code == 200, (path, response.status_code)
    return b"".join(response.streaming_content).decode()


def processes():
    """(pid, state, parent pid, process group, command line) of every host process still there."""
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            yield int(entry), fields[0], int(fields[1]), int(fields[2]), Path(f"/proc/{entry}/cmdline").read_bytes()
        except (OSError, IndexError):
            continue


def marker_processes(marker: str) -> list[int]:
    """Host pids whose command line carries ``marker`` (alive, not zombies)."""
    return [pid for pid, state, _, _, cmdline in processes() if marker.encode() in cmdline and state != "Z"]


def _group_alive(pgid: int) -> bool:
    """Some process of the group is still running (zombies have finished)."""
    return any(group == pgid and state != "Z" for _, state, _, group, _ in processes())


def zombie_children() -> list[int]:
    return [pid for pid, state, parent, _, _ in processes() if parent == os.getpid() and state == "Z"]


@pytest.fixture
def linked(link_account, owner, member):
    return {"owner": link_account(owner, "gridgate-test1"), "member": link_account(member, "gridgate-test2")}


def test_attack_reads_no_service_secret_no_other_users_inputs_and_sees_only_its_processes(
    api, owner, member, local_pool, linked, monkeypatch, cases_root
):
    """R-CASE-8: ``ATTACK`` as a real case: the service's variables (set in this worker process)
    and another user's inputs stay out of reach, /proc shows only the case's own processes, and the
    case's account owns its files. R-BACK-1: the command's environment is its own, not the worker's."""
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    rc = local_pool.classes.get()
    victim = api_launched(api(member), rc, "sleep 20", inputs=[("victim.txt", b"victim-private-data-0815")])
    attacker = api_launched(api(owner), rc, ATTACK.replace("{root}", str(cases_root)))
    case = wait_for_terminal(Case.objects.get(pk=attacker))
    assert case.status == CaseStatus.DONE, case.last_error
    client = api(owner)

    env = download(client, attacker, "results/env.txt")
    for value in SECRETS.values():
        assert value not in env
    assert "SECRET_KEY" not in env and "DATABASE_URL" not in env
    assert f"GRIDGATE_CASE_ID={attacker}" in env and "PATH=" in env  # what ``env`` printed: the case's own
    assert "0815" not in download(client, attacker, "results/loot.txt")
    assert download(client, attacker, "results/cases.txt").split() == [".", "..", attacker]  # only its own
    procs = [line for line in download(client, attacker, "results/procs.txt").splitlines() if line.strip()]
    # Only the sandbox's own processes: not the worker (this pytest process), not the victim's.
    assert procs and not any("bin/pytest" in line or "sleep 20" in line for line in procs)
    assert len(procs) < 10  # bwrap's init, the shell and the few commands of the pipeline
    assert int(download(client, attacker, "results/uid.txt")) == linked["owner"].pw_uid
    # The victim's working directory, still running: its account's alone.
    work = run_dir(workspace.case_dir(victim)) / "work"
    assert work.stat().st_uid == linked["member"].pw_uid and (work.stat().st_mode & 0o777) == 0o700
    assert (work / "victim.txt").stat().st_uid == linked["member"].pw_uid
    # The attacker's was dropped once its results came back.
    assert not (run_dir(workspace.case_dir(attacker)) / "work").exists()
    assert api(member).post(f"/api/v1/cases/{victim}/cancel/").status_code == 200


@pytest.fixture
def traversable_cases_root(settings, cases_root):
    """A cases root other accounts can reach up to (pytest's own tmp_path is 0700 above it)."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="gridgate-cases-"))
    base.chmod(0o711)
    settings.GRIDGATE_CASES_ROOT = base / "cases"
    yield settings.GRIDGATE_CASES_ROOT
    shutil.rmtree(base, ignore_errors=True)


def test_campaign_shared_inputs_reach_its_cases_and_no_other_account(
    api, owner, local_pool, linked, traversable_cases_root
):
    """R-CASE-8: the owner's case reads the campaign's shared input through its sandbox; another
    account on the host cannot reach ``campaigns/<id>/`` even knowing the id and file name."""
    client = api(owner)
    response = client.post(
        "/api/v1/campaigns/",
        {"name": "sweep", "inputs": [SimpleUploadedFile("mesh.msh", b"shared-mesh-0815")]},
        format="multipart",
    )
    assert response.status_code == 201, response.content
    campaign = response.json()["id"]
    body = {"name": "c", "resource_class": local_pool.classes.get().pk, "command": "cat shared/mesh.msh > got.txt"}
    case_id = client.post("/api/v1/cases/", {**body, "campaign": campaign}, format="json").json()["id"]
    assert api_launch(client, case_id).status_code == 202
    case = wait_for_terminal(Case.objects.get(pk=case_id))
    assert case.status == CaseStatus.DONE, case.last_error
    assert download(client, case_id, "results/got.txt") == "shared-mesh-0815"

    other = linked["member"]
    path = workspace.campaign_shared_dir(campaign) / "mesh.msh"
    attempt = read_as(other, path)
    assert attempt.returncode != 0 and "0815" not in attempt.stdout


def test_launch_without_a_linked_account_is_refused_saying_whom_to_ask(api, owner, local_pool):
    """R-CASE-8: 403 with a JSON message; nothing runs, the case stays prepared."""
    case_id = api_create(api(owner), local_pool.classes.get(), "true")
    response = api_launch(api(owner), case_id)
    assert response.status_code == 403
    body = response.json()
    assert "operator" in body["detail"] and "Unix" in body["detail"]
    assert body["code"] == "unix_account_required"
    assert Case.objects.get(pk=case_id).status == CaseStatus.PREPARED


def test_unlinked_user_runs_as_the_sandbox_account_where_the_pool_allows_it(api, outsider, sandbox_host, db):
    rc = factories.pool("open", class_name="s", sandbox_unlinked=True).classes.get()
    case_id = api_launched(api(outsider), rc, "id -u > uid.txt")
    case = wait_for_terminal(Case.objects.get(pk=case_id))
    assert case.status == CaseStatus.DONE, case.last_error
    assert int(download(api(outsider), case_id, "results/uid.txt")) == sandbox_host["gridgate-sandbox"].pw_uid


def test_pool_without_network_gives_the_case_only_loopback(api, owner, linked, db):
    rc = factories.pool("offline", class_name="s", network=False).classes.get()
    case_id = api_launched(api(owner), rc, "awk -F: 'NR>2{print $1}' /proc/net/dev > ifaces.txt")
    case = wait_for_terminal(Case.objects.get(pk=case_id))
    assert case.status == CaseStatus.DONE, (workspace.case_dir(case_id) / "stderr.log").read_text()
    assert download(api(owner), case_id, "results/ifaces.txt").split() == ["lo"]


# -- symlinks planted in a workspace are never followed (R-CASE-8, R-CASE-7) -------------------------
def test_symlinks_planted_by_the_command_never_come_back_or_set_progress(api, owner, local_pool, linked, tmp_path):
    outside = tmp_path / "outside-progress"
    outside.write_text("0.5\n")
    command = (
        f"mkdir -p results; ln -s /etc/passwd results/x; ln -s /etc/passwd stdout.log; "
        f"rm -f .gridgate/progress; ln -s {outside} .gridgate/progress; ln -s /etc obj; "
        "echo real > real.txt; sleep 2"
    )
    case_id = api_launched(api(owner), local_pool.classes.get(), command)
    case = Case.objects.get(pk=case_id)
    work = run_dir(workspace.case_dir(case_id)) / "work"
    wait_until(lambda: (work / "real.txt").exists(), what="the command's links")
    passes.poll_pass(case_ids=[case.id])
    passes.sync_pass(case_ids=[case.id])
    case.refresh_from_db()
    assert case.progress is None  # the symlinked marker was not read
    assert not (workspace.case_dir(case_id) / "live" / ".gridgate" / "progress").exists()
    case = wait_for_terminal(case)
    assert case.status == CaseStatus.DONE, case.last_error
    listed = {entry["path"] for entry in api(owner).get(f"/api/v1/cases/{case_id}/files/").json()["results"]}
    assert "results/real.txt" in listed
    assert not any(path.startswith(("results/results", "results/stdout.log", "results/obj")) for path in listed)
    assert "root:" not in api(owner).get(f"/api/v1/cases/{case_id}/logs/").content.decode()


def test_symlinks_planted_in_the_workspace_are_never_followed_by_endpoints_or_the_poll(
    api, owner, local_pool, linked, tmp_path
):
    """Whoever planted them (a command of an older version, an operator mistake): the log and file
    endpoints serve nothing through them and the poll writes nothing through them."""
    target = tmp_path / "outside.log"
    target.write_text("outside-content\n")
    case_id = api_create(api(owner), local_pool.classes.get(), "echo from-the-command")
    root = workspace.case_dir(case_id)
    (root / "stdout.log").unlink()
    (root / "stdout.log").symlink_to(target)
    (root / "results" / "x").symlink_to("/etc/passwd")
    client = api(owner)
    assert "outside-content" not in client.get(f"/api/v1/cases/{case_id}/logs/").content.decode()
    assert client.get(f"/api/v1/cases/{case_id}/files/results/x").status_code in (400, 404)
    assert client.get(f"/api/v1/cases/{case_id}/files/stdout.log").status_code in (400, 404)

    assert api_launch(client, case_id).status_code == 202
    rdir = run_dir(root)
    wait_until(lambda: (rdir / "exit_status").exists(), what="the command's end")
    passes.poll_pass(case_ids=[case_id])
    assert target.read_text() == "outside-content\n"  # the poll did not append through the link
    case = Case.objects.get(pk=case_id)
    assert case.poll_failures == 1 and case.status != CaseStatus.DONE


# -- cancel stops the whole tree (R-CASE-8, R-CASE-6) ----------------------------------------------------
def test_cancel_ends_a_command_that_traps_sigterm_and_its_escaped_children(api, owner, local_pool, linked, settings):
    settings.GRIDGATE_CASE_CANCEL_GRACE_SECONDS = 1
    zombies_before = set(zombie_children())  # other tests' processes in this worker are not ours
    marker = f"mark-{uuid.uuid4().hex[:8]}"
    command = (
        f"setsid sh -c 'trap \"\" TERM; : {marker}; while :; do sleep 1; done' & "
        f"exec sh -c 'trap \"\" TERM; : {marker}; echo started; while :; do sleep 1; done'"
    )
    case_id = api_launched(api(owner), local_pool.classes.get(), command)
    case = Case.objects.get(pk=case_id)
    pgid = int(case.remote_id.split(":")[1])
    wait_until(lambda: len(marker_processes(marker)) >= 2, what="the command and its escaped child")
    response = api(owner).post(f"/api/v1/cases/{case_id}/cancel/")
    assert response.status_code == 200 and response.json()["status"] == CaseStatus.CANCELLED
    assert marker_processes(marker) == []
    assert not _group_alive(pgid)
    assert set(zombie_children()) - zombies_before == set()


def test_cancel_after_the_run_directory_was_deleted_is_not_a_500(api, owner, local_pool, linked, settings):
    settings.GRIDGATE_CASE_CANCEL_GRACE_SECONDS = 1
    marker = f"mark-{uuid.uuid4().hex[:8]}"
    case_id = api_launched(api(owner), local_pool.classes.get(), f"exec sh -c ': {marker}; sleep 30'")
    wait_until(lambda: marker_processes(marker), what="the command")
    run = run_dir(workspace.case_dir(case_id))

    def removed():  # the run's supervisor may write a file into it while it is removed
        shutil.rmtree(run, ignore_errors=True)
        return not run.exists()

    wait_until(removed, what="the run directory removed")
    response = api(owner).post(f"/api/v1/cases/{case_id}/cancel/")
    assert response.status_code in (200, 409), response.content
    assert marker_processes(marker) == []


def test_launching_leaves_no_child_and_no_zombie_in_the_launching_process(api, owner, local_pool, linked):
    zombies_before = set(zombie_children())  # other tests' processes in this worker are not ours
    case_id = api_launched(api(owner), local_pool.classes.get(), "echo quick")
    case = wait_for_terminal(Case.objects.get(pk=case_id))
    assert case.status == CaseStatus.DONE, case.last_error
    assert set(zombie_children()) - zombies_before == set()
