"""The local backend with real subprocesses."""

import os
import signal

import pytest

from apps.backends.local import LocalBackend, run_dir
from apps.cases import passes, services, workspace
from apps.cases.models import TERMINAL, CaseStatus
from tests.backends.conftest import wait_for_terminal, wait_until, write_inputs
from tests.cases.conftest import launched

pytestmark = [pytest.mark.django_db, pytest.mark.sandbox]


@pytest.fixture(autouse=True)
def owner_linked(link_account, owner):
    """R-CASE-8: the local pool runs each case as its owner's account."""
    return link_account(owner)


def _kill(case):
    """Stop a case's process group whatever the test's outcome (idempotent). Not once the case
    has ended: its group is gone and its number may be another's (a sandbox on the other xdist
    worker, killed by this clean-up)."""
    case.refresh_from_db()
    if case.status in TERMINAL:
        return
    try:
        os.killpg(int(case.remote_id.split(":", 1)[1]), signal.SIGKILL)
    except (ProcessLookupError, ValueError, IndexError, PermissionError):
        pass


def test_real_command_writes_a_result_that_comes_back_into_results(make_case):
    case = make_case(
        command="cat mesh.txt > out.txt; echo extra >> mesh.txt; mkdir -p post; echo 7 > post/value; echo hello",
        observability_globs=["post/*"],
    )
    case = launched(write_inputs(case, {"mesh.txt": b"mesh\n", "untouched.txt": b"same\n"}))
    assert case.status == CaseStatus.PENDING and case.remote_id.startswith("local:")
    case = wait_for_terminal(case)

    assert case.status == CaseStatus.DONE, case.last_error
    results = workspace.case_dir(case.id) / "results"
    assert (results / "out.txt").read_text() == "mesh\n"
    assert (results / "mesh.txt").read_text() == "mesh\nextra\n"  # changed inputs come back
    assert (results / "post" / "value").read_text() == "7\n"
    assert not (results / "untouched.txt").exists()  # unchanged inputs do not
    assert (workspace.case_dir(case.id) / "inputs" / "mesh.txt").read_text() == "mesh\n"  # inputs untouched
    assert (workspace.case_dir(case.id) / "stdout.log").read_text() == "hello\n"
    listed = {entry["path"] for entry in workspace.list_files(workspace.case_dir(case.id))}
    assert "results/out.txt" in listed and not any(path.startswith(".run") for path in listed)


def test_failing_command_ends_failed_with_stderr_kept(make_case):
    case = launched(make_case(command="echo 'solver diverged' >&2; exit 3"))
    case = wait_for_terminal(case)
    assert case.status == CaseStatus.FAILED
    assert "exited with status 3" in case.last_error
    assert (workspace.case_dir(case.id) / "stderr.log").read_text() == "solver diverged\n"


def test_exit_status_on_disk_survives_a_worker_restart(make_case):
    """The outcome is read from .run/exit_status: a new backend instance (a restarted worker)
    that never saw the process still resolves the case."""
    case = launched(make_case(command="echo done > marker"))
    rdir = run_dir(workspace.case_dir(case.id))
    wait_until((rdir / "exit_status").exists, what="the exit status file")
    assert (rdir / "exit_status").read_text().strip() == "0"
    state = LocalBackend().poll(passes.job_ref(case))
    assert state.status == "succeeded"


def test_progress_marker_is_synced_into_live_and_read_while_running(make_case, request):
    case = launched(
        make_case(
            command="echo 0.25 > .gridgate/progress; echo partial > run.log; sleep 30", observability_globs=["*.log"]
        )
    )
    request.addfinalizer(lambda: _kill(case))  # an assertion failing below must not leave it running
    rdir = run_dir(workspace.case_dir(case.id))
    wait_until((rdir / "work" / "run.log").exists, what="the command's first output")
    passes.poll_pass(case_ids=[case.id])
    passes.sync_pass(case_ids=[case.id])
    case.refresh_from_db()
    assert case.status == CaseStatus.RUNNING
    assert case.progress == 0.25
    assert (workspace.case_dir(case.id) / "live" / "run.log").read_text() == "partial\n"
    case = services.cancel_case(case)
    assert case.status == CaseStatus.CANCELLED
    assert (rdir / "cancelled").exists()


def test_output_written_just_before_exit_is_never_lost(make_case):
    """R-CASE-5: the status is decided before the output is read, and a finished command's
    output is drained whole (more than one bounded read)."""
    case = launched(make_case(command="head -c 5000000 /dev/zero | tr '\\\\0' x; echo; echo last"))
    rdir = run_dir(workspace.case_dir(case.id))
    wait_until((rdir / "exit_status").exists, what="the exit status file")
    case = wait_for_terminal(case)
    assert case.status == CaseStatus.DONE, case.last_error
    stdout = (workspace.case_dir(case.id) / "stdout.log").read_text()
    assert len(stdout) == 5_000_000 + len("\nlast\n") and stdout.endswith("\nlast\n")


def test_r_back_6_the_local_backend_declares_only_its_wall_time_so_anything_else_is_400(
    api, owner, local_pool, make_case
):
    """Hostile batch options on the local backend: refused at creation and at launch; nothing runs.
    Its one option, ``time`` (minutes), is a whole number within the class's maximum."""
    hostile = {"partition": "gpu-premium", "time": "365-00:00:00"}
    client = api(owner)
    body = {"name": "x", "resource_class": local_pool.classes.get().pk, "command": "true", "launch_options": hostile}
    response = client.post("/api/v1/cases/", body, format="json")
    assert response.status_code == 400 and "declared options: time" in response.json()["detail"]
    case = make_case(command="true")
    response = client.post(f"/api/v1/cases/{case.id}/launch/", {"launch_options": hostile}, format="json")
    assert response.status_code == 400 and set(response.json()["launch_options"]) == {"partition", "time"}
    too_long = {"time": str(local_pool.classes.get().max_wall_time // 60 + 1)}
    response = client.post(f"/api/v1/cases/{case.id}/launch/", {"launch_options": too_long}, format="json")
    assert response.status_code == 400 and "a whole number from 1 to" in response.json()["detail"]
    case.refresh_from_db()
    assert case.status == CaseStatus.PREPARED and not run_dir(workspace.case_dir(case.id)).exists()


def test_a_local_case_started_on_one_host_is_never_polled_by_another(make_case):
    """Host B would find no process in its /proc and fail the case; it never claims it."""
    from django.test import override_settings

    with override_settings(GRIDGATE_WORKER_HOST="host-a"):
        case = launched(make_case(command="echo ran"))
    assert case.run_host == "host-a"
    rdir = run_dir(workspace.case_dir(case.id))
    wait_until((rdir / "exit_status").exists, what="the exit status file")
    with override_settings(GRIDGATE_WORKER_HOST="host-b"):
        assert passes.poll_pass(case_ids=[case.id]).claimed == 0
    case.refresh_from_db()
    assert case.status == CaseStatus.PENDING
    with override_settings(GRIDGATE_WORKER_HOST="host-a"):
        case = wait_for_terminal(case)
    assert case.status == CaseStatus.DONE
