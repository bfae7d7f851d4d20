"""The FirecREST backend against the local FirecREST v2 double (tests/doubles/firecrest_server.py),
with the real pyfirecrest client over HTTP (R-BACK-1, R-BACK-4, R-CASE-1 … 6)."""

import os
import time
from pathlib import Path

import httpx
import pytest
from django.core.cache import cache

from apps.backends import firecrest as fc
from apps.backends.base import BackendStatus
from apps.backends.firecrest import backend as fc_backend
from apps.cases import passes, services, workspace
from apps.cases.models import Case, CaseStatus
from apps.resources.models import ResourceClass, ResourcePool
from tests import factories
from tests.backends.conftest import FirecrestDriver, launch, poll_once, poll_until, wait_for_terminal, wait_until
from tests.backends.test_launch_options import HOSTILE, assert_class_partition_wins, launch_with
from tests.doubles.firecrest_server import FirecrestDouble

pytestmark = pytest.mark.django_db

PROVIDER = "firecrest"  # the ``driver`` fixture's


@pytest.fixture
def fc_pool(driver):
    return driver.service_pool()


@pytest.mark.slurm
def test_firecrest_double_runs_a_real_batch_job_on_the_local_slurm(slurm_cluster, tmp_path, make_case, driver):
    """End to end: the double hands the job script to the local Slurm cluster (sbatch)."""
    server = FirecrestDouble(tmp_path / "hpc-slurm", runner="slurm", client_secret=driver.secret).start()
    try:
        remote = FirecrestDriver.remote(server, credentials="service")
        pool = factories.pool("slurm-fc", kind="firecrest", remote=remote, class_name="node")
        case = launch(make_case, pool, "cat in.txt > out.txt; echo on-slurm")
        assert case.status == CaseStatus.PENDING, case.last_error
        assert server.jobs[int(case.remote_id.split("@")[0])].slurm_id
        case = wait_for_terminal(case, timeout=90)
        assert case.status == CaseStatus.DONE, case.last_error
        assert (workspace.case_dir(case.id) / "results" / "out.txt").read_text() == "input\n"
        assert "on-slurm" in (workspace.case_dir(case.id) / "stdout.log").read_text()
    finally:
        server.stop()


def test_polling_makes_one_status_call_per_system_and_credential_per_pass(fc_pool, make_case, double):
    """R-BACK-4: however many cases, one job_info listing per (system, credential) per pass."""
    cases = [launch(make_case, fc_pool, "sleep 5") for _ in range(6)]
    assert all(c.status == CaseStatus.PENDING for c in cases)
    before = len(double.status_calls())
    passes.poll_pass(case_ids=[c.id for c in cases])
    assert double.status_calls()[before:] == [f"/compute/{double.system}/jobs"]
    assert all(Case.objects.get(pk=c.pk).poll_failures == 0 for c in cases)


def test_job_unknown_right_after_submit_is_a_failed_poll_then_recovers(fc_pool, make_case, double):
    """R-CASE-3: FirecREST's transient 404 just after submit changes nothing but the counters."""
    double.hide_new_jobs = 2  # hidden from the listing and from the single lookup
    case = launch(make_case, fc_pool, "true")
    case = poll_once(case)
    assert case.status == CaseStatus.PENDING and case.poll_failures == 1 and "(yet)" in case.last_error
    case = wait_for_terminal(case, timeout=90)
    assert case.status == CaseStatus.DONE


@pytest.mark.parametrize("answer", [{"delay": 6}, {"drop": True}], ids=["late", "dropped"])
def test_uncertain_submit_keeps_the_case_prepared_and_the_retry_adopts_the_job(fc_pool, make_case, double, answer):
    """R-CASE-1: the submission timed out, or its connection dropped after it was sent, and the job
    is not listed yet: the case stays prepared, the submit pass retries later and finds the job by
    name instead of submitting a second one."""
    double.fault(f"/compute/{double.system}/jobs$", method="POST", after=True, **answer)
    double.hide_new_jobs = fc_backend.FIND_AFTER_TIMEOUT_ATTEMPTS  # the lookups right after it do not see it yet
    case = launch(make_case, fc_pool, "true")
    assert case.status == CaseStatus.PREPARED and case.launch_requested_at and "uncertain" in case.last_error
    Case.objects.filter(pk=case.pk).update(lease_until=None)  # the back-off has passed
    for job in double.user_jobs():
        job.hidden_lookups = 0
    passes.submit_pass()
    case.refresh_from_db()
    assert case.status == CaseStatus.PENDING and len(double.user_jobs()) == 1


@pytest.mark.parametrize(
    ("state", "exit_code", "expected"),
    [
        ("COMPLETED", 0, BackendStatus.SUCCEEDED),
        ("COMPLETED", 2, BackendStatus.FAILED),
        ("FAILED", 1, BackendStatus.FAILED),
        ("TIMEOUT", 0, BackendStatus.FAILED),
        ("OUT_OF_MEMORY", 0, BackendStatus.FAILED),
        ("NODE_FAIL", 0, BackendStatus.FAILED),
        ("CANCELLED by 1234", 0, BackendStatus.CANCELLED),
        (["RUNNING"], None, BackendStatus.RUNNING),
        ("COMPLETED,FAILED", 0, BackendStatus.FAILED),
        ("PENDING", None, BackendStatus.PENDING),
        ("SOMETHING_NEW", None, BackendStatus.PENDING),
    ],
)
def test_slurm_states_map_to_backend_statuses(state, exit_code, expected):
    assert fc.map_state(state, exit_code) == expected


def test_out_of_memory_ends_the_case_failed_with_the_state_in_the_message(fc_pool, make_case, double):
    case = launch(make_case, fc_pool, "sleep 30")
    double.force_state(double.user_jobs()[0].job_id, "OUT_OF_MEMORY", 0)
    case = wait_for_terminal(case, timeout=90)
    assert case.status == CaseStatus.FAILED and "OUT_OF_MEMORY" in case.last_error


def test_job_script_carries_sbatch_lines_and_the_case_id_as_job_name(fc_pool, make_case, double):
    case = launch(make_case, fc_pool, "true", launch_options={"time": "00:10:00"})
    script = next((Path(fc_pool.remote["working_root"]) / str(case.id)).glob("job-*.sh")).read_text()
    assert f"#SBATCH --job-name={case.id}" in script and "#SBATCH --partition=debug" in script
    assert "#SBATCH --time=00:10:00" in script


def test_r_back_6_options_outside_the_allow_list_are_400_on_firecrest(fc_pool, make_case, double, api, owner):
    case = make_case(resource_class=fc_pool.classes.get(), command="true")
    response = launch_with(api(owner), case, HOSTILE)
    assert response.status_code == 400
    assert "one of debug" in response.json()["detail"] and "365-00:00:00" in response.json()["detail"]
    case.refresh_from_db()
    assert case.status == CaseStatus.PREPARED and double.user_jobs() == []


def test_r_back_6_unreachable_firecrest_allows_only_the_configured_partition(fc_pool, make_case, double, api, owner):
    """Degraded (R-BACK-2): the provider's list is unknown, so only the pool's partition passes."""
    cache.clear()
    double.partitions = ["debug", "normal"]
    double.fault("/partitions", status=503, times=5)
    case = make_case(resource_class=fc_pool.classes.get(), command="true")
    response = launch_with(api(owner), case, {"partition": "normal"})
    assert response.status_code == 400 and "could not be asked" in response.json()["detail"]


def test_r_back_6_a_class_partition_survives_the_firecrest_default(double, make_case, api, owner):
    """FirecREST's first partition ("normal") was the form's default and silently replaced the
    class's "debug". Now the class's partition is the only choice, healthy or not."""
    cache.clear()
    double.partitions = ["normal", "debug"]
    remote = FirecrestDriver.remote(double, credentials="service")
    del remote["partition"]
    pool = ResourcePool.objects.create(name="alps-override", kind="firecrest", public=True, remote=remote)
    rc = ResourceClass.objects.create(
        pool=pool, name="dbg", cpu=1, memory=1, default=True, remote={"partition": "debug"}
    )
    client = api(owner)
    case, form = assert_class_partition_wins(client, make_case, rc, "normal", script="job-*.sh")
    assert not form["degraded"]
    cache.clear()
    double.fault("/partitions", status=503, times=5)
    body = client.get(f"/api/v1/resource-classes/{rc.id}/launch-options/").json()
    assert body["degraded"] and next(o for o in body["options"] if o["key"] == "partition")["default"] == "debug"
    wait_for_terminal(case, timeout=90)


# -- provider facts of the real FirecREST v2 server (PROVIDERS.md "observed") --------------------


def running(make_case, pool, double, command="while [ ! -e go ]; do sleep 0.1; done", **kwargs):
    case = launch(make_case, pool, command, **kwargs)
    assert case.status == CaseStatus.PENDING, case.last_error
    work = Path(pool.remote["working_root"]) / str(case.id)
    job = double.user_jobs()[-1]
    return case, work, job


@pytest.mark.parametrize("polls", [1, 2, 50])
def test_logs_are_byte_identical_to_the_remote_file_after_n_polls(fc_pool, make_case, double, polls):
    """R-CASE-5 on the real server's tail (``tail --bytes=+N``, 1-based; 0 = the last 10 lines):
    the workspace log equals the remote stdout byte for byte after 1, 2 or 50 polls of a growing
    file, multi-byte characters cut across polls included."""
    case, rdir, job = running(make_case, fc_pool, double)
    data = "".join(f"line {i}: é€😀 {'x' * (i % 7)}\n" for i in range(120)).encode()
    # Cut at byte positions that split the 2-, 3- and 4-byte characters somewhere.
    cuts = [len(data) * (i + 1) // polls - (i % 3) for i in range(polls - 1)] + [len(data)]
    log = workspace.case_dir(case.id) / "stdout.log"
    start = 0
    for cut in cuts:
        with (rdir / "stdout").open("ab") as handle:
            handle.write(data[start:cut])
        start = cut
        passes.poll_pass(case_ids=[case.id])
        local = log.read_bytes() if log.exists() else b""
        assert data.startswith(local) and cut - len(local) < 4  # at most one cut character waits
    assert log.read_bytes() == data
    (rdir / "work" / "go").write_text("")
    case = wait_for_terminal(case, timeout=90)
    assert case.status == CaseStatus.DONE and log.read_bytes() == (rdir / "stdout").read_bytes() == data


def test_a_launch_inside_the_token_window_refreshes_the_token_first(fc_pool, make_case, double):
    """The real server refuses a token with < 30 s left; pyfirecrest's default reuses it until
    10 s before expiry. The backend asks for a fresh one earlier: no call is refused."""
    first = launch(make_case, fc_pool, "true")
    assert first.status == CaseStatus.PENDING, first.last_error
    (client,) = fc._clients.values()
    client._authorization._token_expiration_ts = time.time() + 20  # 20 s left, on both sides
    double.expire_tokens_in(20)
    case = launch(make_case, fc_pool, "true")
    assert case.status == CaseStatus.PENDING, case.last_error
    assert double.refusals(401) == []


def test_a_401_expires_too_soon_is_retried_with_a_fresh_token_never_a_failure(fc_pool, make_case, double):
    double.fault(
        f"/compute/{double.system}/jobs$",
        method="POST",
        status=401,
        body={"message": "Access token expires too soon (less than 30s remaining)"},
    )
    case = launch(make_case, fc_pool, "true")
    assert case.status == CaseStatus.PENDING, case.last_error
    assert len(double.user_jobs()) == 1 and double.refusals(401)


def test_allocation_record_of_a_running_job_is_no_failed_poll_and_never_regresses(fc_pool, make_case, double):
    """A running job looked up by id (or listed) as its allocation record ("allocation",
    PENDING): matched by id, nothing new, no failed poll; a running case stays running."""
    double.allocation_records = 2
    case, rdir, job = running(make_case, fc_pool, double)
    case = poll_once(case)
    assert case.status == CaseStatus.PENDING and case.poll_failures == 0, case.last_error
    poll_until(case, lambda c: c.status == CaseStatus.RUNNING)
    job.allocation_lookups = 3
    case = poll_once(case)
    assert case.status == CaseStatus.RUNNING and case.poll_failures == 0, case.last_error
    (rdir / "work" / "go").write_text("")
    assert wait_for_terminal(case, timeout=90).status == CaseStatus.DONE


def test_just_finished_job_missing_from_the_list_is_a_failed_poll_then_done(fc_pool, make_case, double):
    double.missing_after_end = 2  # missing from the listing and from the lookup by id
    case = launch(make_case, fc_pool, "echo bye")
    job = double.user_jobs()[0]
    wait_until(lambda: job.proc.poll() is not None, what="the job to end")
    case = poll_once(case)
    assert case.status == CaseStatus.PENDING and case.poll_failures == 1 and "(yet)" in case.last_error
    case = wait_for_terminal(case, timeout=90)
    assert case.status == CaseStatus.DONE
    assert (workspace.case_dir(case.id) / "stdout.log").read_text() == "bye\n"


def test_cancel_racing_completion_keeps_the_output(fc_pool, make_case, double, api, owner):
    """R-CASE-6 + R-CASE-5: the job ends between the user's last look and Stop; the real server
    answers the cancel 500; the case ends done with every byte of its output, once. Here a poll
    read the first part while it ran (the tail's offset); the contract proves an output never read."""
    case, rdir, job = running(
        make_case, fc_pool, double, "echo first; while [ ! -e go ]; do sleep 0.1; done; echo last"
    )
    passes.poll_pass(case_ids=[case.id])
    (rdir / "work" / "go").write_text("")
    wait_until(lambda: job.proc.poll() is not None, what="the job to end")
    response = api(owner).post(f"/api/v1/cases/{case.id}/cancel/")
    assert response.status_code == 409, response.content
    case = wait_for_terminal(case)
    assert case.status == CaseStatus.DONE
    assert (workspace.case_dir(case.id) / "stdout.log").read_text() == "first\nlast\n"


def test_doctor_reports_every_unhealthy_service(fc_pool, double):
    double.unhealthy = {"ssh": "ssh timeout", "filesystem": "/scratch not mounted"}
    checks = {check.name: check for check in fc.FirecrestBackend().doctor(fc_pool)}
    assert not checks["system"].ok
    assert "ssh (ssh timeout)" in checks["system"].message and "filesystem" in checks["system"].message


def test_live_sync_sees_a_same_size_rewrite_within_the_same_second(fc_pool, make_case, double):
    """Listing sizes are strings and mtimes have one-second resolution: a same-size rewrite with
    the same stamp is still brought into live/ (the remote checksum decides)."""
    case, rdir, job = running(make_case, fc_pool, double, observability_globs=["out.txt"])
    target = rdir / "work" / "out.txt"
    target.write_text("AAAA")
    stamp = target.stat().st_mtime
    poll_until(case, lambda c: c.status == CaseStatus.RUNNING)
    passes.sync_pass(case_ids=[case.id])
    live = workspace.case_dir(case.id) / "live" / "out.txt"
    assert live.read_text() == "AAAA"
    target.write_text("BBBB")
    os.utime(target, (stamp, stamp))
    passes.sync_pass(case_ids=[case.id])
    assert live.read_text() == "BBBB"


def test_dropped_connection_after_submit_adopts_the_job(fc_pool, make_case, double):
    """R-CASE-1: the connection dropped after the submission was sent: uncertain, not a failure;
    the job is found by name and adopted, never submitted twice."""
    double.fault(f"/compute/{double.system}/jobs$", method="POST", after=True, drop=True)
    case = launch(make_case, fc_pool, "true")
    assert case.status == CaseStatus.PENDING, case.last_error
    assert len(double.user_jobs()) == 1 and case.remote_id.startswith(f"{double.user_jobs()[0].job_id}@")
    error = fc.Session({}).error("x", httpx.RemoteProtocolError("Server disconnected"))
    assert error.dropped and error.maybe_done and not error.permanent


def test_last_uncertain_submission_looks_once_more_and_cancels_the_orphan(fc_pool, make_case, double):
    """R-CASE-1: the last uncertain attempt fails the case; a job the provider created late is
    found by name once more and cancelled, never left running unrecorded."""
    from apps.cases.passes import MAX_SUBMIT_ATTEMPTS

    double.fault(f"/compute/{double.system}/jobs$", method="POST", after=True, drop=True)
    double.hide_new_jobs = fc_backend.FIND_AFTER_TIMEOUT_ATTEMPTS  # unseen by the adoption lookups
    case = make_case(resource_class=fc_pool.classes.get(), command="sleep 30")
    (workspace.case_dir(case.id) / "inputs" / "in.txt").write_text("input\n")
    services.launch_case(case)
    Case.objects.filter(pk=case.pk).update(poll_failures=MAX_SUBMIT_ATTEMPTS - 1)  # the last attempt
    passes.submit_pass(case_ids=[case.id])
    case.refresh_from_db()
    assert case.status == CaseStatus.FAILED, case.last_error
    (job,) = double.user_jobs()
    assert job.cancelled
