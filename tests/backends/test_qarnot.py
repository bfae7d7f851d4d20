"""The Qarnot backend against the local Qarnot API double and moto's S3 server, with the real
qarnot SDK over HTTP (R-BACK-1, R-BACK-3, R-CASE-1 … 7). Each test maps to a defect csauto met
on a real account (seed 003), named in its docstring."""

import logging

import pytest

from apps.backends import qarnot as qb
from apps.backends.base import AlreadyFinished, BackendStatus
from apps.cases import passes, services, workspace
from apps.cases.models import Campaign, Case, CaseStatus
from apps.core.exceptions import Invalid
from tests.backends.conftest import launch, poll_until
from tests.backends.test_doctor import doctor

pytestmark = pytest.mark.django_db

PROVIDER = "qarnot"  # the ``driver`` fixture's


@pytest.fixture
def q_pool(driver):
    return driver.service_pool(name="qarnot", docker_image="registry.example.org/solver:1.2")


def test_unknown_scheduling_type_is_refused_naming_the_choices_before_any_upload(q_pool, make_case, double):
    """R-BACK-3 and R-BACK-6: an unknown scheduling value is refused (400) naming Flex, OnDemand,
    Reserved, before anything is uploaded."""
    before = double.buckets()
    case = make_case(resource_class=q_pool.classes.get(), command="true")
    with pytest.raises(Invalid) as info:
        services.launch_case(case, launch_options={"scheduling": "cheap"})
    assert all(word in info.value.detail for word in ("Flex", "OnDemand", "Reserved"))
    case.refresh_from_db()
    assert case.status == CaseStatus.PREPARED and double.buckets() == before


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"node_type": "128c-1tb-gpu"}, "one of 8c-32g-amd-rome, 16c-64g-intel"),
        ({"ranks": 5000}, "from 1 to 1024"),
        ({"threads": 0}, "from 1 to 256"),
        ({"docker_image": "attacker/image"}, "declared options: scheduling, node_type, ranks, threads"),
    ],
)
def test_r_back_6_qarnot_options_outside_the_allow_list_are_400(q_pool, double, api, owner, options, named):
    body = {"name": "x", "resource_class": q_pool.classes.get().pk, "command": "true", "launch_options": options}
    response = api(owner).post("/api/v1/cases/", body, format="json")
    assert response.status_code == 400 and named in response.json()["detail"]


def test_scheduling_and_node_type_travel_with_the_task(q_pool, make_case, double):
    case = launch(make_case, q_pool, "true", launch_options={"scheduling": "OnDemand", "node_type": "16c-64g-intel"})
    body = double.tasks[case.remote_id].body
    assert body["schedulingType"] == "OnDemand"
    assert {"discriminator": "SpecificHardwareConstraint", "specificationKey": "16c-64g-intel"} in body[
        "hardwareConstraints"
    ]


def test_core_constraint_is_sent_only_when_the_catalogue_lists_it(q_pool, make_case, double):
    """Seed defect: a synthesised core constraint missing from the account catalogue made every
    launch fail with "Some constraints don't exist"."""
    listed = launch(make_case, q_pool, "true")  # 4 cores: listed
    assert double.tasks[listed.remote_id].body["hardwareConstraints"] == [
        {"discriminator": "MinimumCoreHardwareConstraint", "coreCount": 4}
    ]
    unlisted = launch(make_case, q_pool, "true", launch_options={"ranks": 3, "threads": 2})  # 6: not listed
    assert unlisted.status == CaseStatus.PENDING, unlisted.last_error
    assert double.tasks[unlisted.remote_id].body["hardwareConstraints"] == []


def test_upload_plan_over_max_upload_mb_fails_before_anything_is_uploaded(q_pool, make_case, double):
    before = double.buckets()
    case = launch(make_case, q_pool, "true", inputs={"big.bin": "x" * (2 * 1024 * 1024)})
    assert case.status == CaseStatus.FAILED and "max_upload_mb" in case.last_error
    assert double.buckets() == before


def test_full_storage_quota_or_bucket_limit_is_reported_before_any_upload(q_pool, make_case, double):
    """Seed defect: an exhausted quota surfaced mid-upload after the campaign was launched."""
    before = double.buckets()
    double.user["quotaBytesBucket"] = 1
    case = launch(make_case, q_pool, "true")
    assert case.status == CaseStatus.FAILED and "storage quota" in case.last_error
    double.user["quotaBytesBucket"] = 10 << 30
    double.user["maxBucket"] = len(before) + 1
    case = launch(make_case, q_pool, "true")
    assert case.status == CaseStatus.FAILED and "bucket" in case.last_error
    assert double.buckets() == before


def test_campaign_shared_inputs_are_uploaded_once_and_never_come_back(q_pool, make_case, double, owner):
    """Seed defect: shared directories landed inside the case and came back with every result."""
    campaign = Campaign.objects.create(owner=owner, name="sweep")
    shared = workspace.campaign_shared_dir(campaign.id)
    shared.mkdir(parents=True)
    (shared / "mesh.dat").write_text("mesh\n")
    cases = [launch(make_case, q_pool, "cat shared/mesh.dat > used.txt", campaign=campaign) for _ in range(2)]
    assert double.keys(f"gg-campaign-{campaign.id}") == [".gridgate-complete", "shared/mesh.dat"]
    for case in cases:
        case = poll_until(case, lambda c: c.is_terminal)
        assert case.status == CaseStatus.DONE, case.last_error
        results = workspace.case_dir(case.id) / "results"
        assert (results / "used.txt").read_text() == "mesh\n"
        assert not (results / "shared").exists()
        assert not (results / ".gridgate-complete").exists()  # the shared-inputs marker either
        assert ".gridgate-complete" not in double.keys(qb.bucket_names(str(case.id))[1])


def test_unknown_provider_state_maps_to_pending():
    assert qb.map_state("SomethingNew") == BackendStatus.PENDING
    assert qb.map_state("UploadingResults") == BackendStatus.RUNNING
    assert qb.map_state("Success") == BackendStatus.SUCCEEDED
    assert qb.map_state("Failure") == BackendStatus.FAILED
    assert qb.map_state("Deleted") == BackendStatus.CANCELLED


def test_doctor_fails_at_the_storage_check_when_the_accounts_quota_is_full(q_pool, double):
    """R-BACK-5: a full storage quota fails ``manage.py doctor`` (exit 1) at its storage check;
    the passing run, each check printed and never the token, is the contract's."""
    double.user["quotaBytesBucket"] = 1
    code, out = doctor("--pool", str(q_pool.id))
    assert code == 1 and "FAIL  [qarnot pool=qarnot] storage" in out


# -- Qarnot as its SDK describes it ------------------------------------------------------------
def test_abort_refused_as_non_running_is_already_finished_by_the_tasks_state(q_pool, make_case, double):
    """The abort reaches a task that finished after the lookup: Qarnot answers 403 'non-running';
    the task's state (not the message) makes it AlreadyFinished (R-CASE-6)."""
    case = launch(make_case, q_pool, "echo quick")
    double.wait_state(case.remote_id, ("Success",))
    double.fault(f"/tasks/{case.remote_id}/abort", status=403, body={"message": "Forbidden"})
    with pytest.raises(AlreadyFinished):
        qb.QarnotBackend().cancel(passes.job_ref(case))


def test_maximum_number_of_tasks_keeps_the_case_prepared_and_the_retry_submits(q_pool, make_case, double):
    """403 "maximum number of tasks reached" is temporary: retried later, never a failure."""
    double.max_tasks = 0  # the double is the test's own: nothing to restore after a failure
    count = len(double.tasks)
    case = launch(make_case, q_pool, "true")
    assert case.status == CaseStatus.PREPARED and "task slot" in case.last_error
    assert len(double.tasks) == count
    double.max_tasks = None
    Case.objects.filter(pk=case.pk).update(lease_until=None)  # the back-off has passed
    passes.submit_pass()
    case.refresh_from_db()
    assert case.status == CaseStatus.PENDING and len(double.tasks) == count + 1


def test_missing_credits_fail_the_launch_with_a_reference_to_the_reason_in_the_log(q_pool, make_case, double, caplog):
    """Under the service's account the case's owner reads that the provider refused and a
    reference (F18: never the provider's words); the operators find the reason under it."""
    caplog.set_level(logging.WARNING)
    double.credits = False
    case = launch(make_case, q_pool, "true")
    assert case.status == CaseStatus.FAILED and "Qarnot task submission failed: the provider" in case.last_error
    reference = case.last_error.split("(reference ")[1].split(":")[0]
    logged = next(line for line in caplog.text.splitlines() if f"provider answer {reference}" in line)
    assert "credits" in logged.lower()


def test_large_unchanged_input_with_a_multipart_etag_is_not_a_result(q_pool, make_case, double):
    """boto3 uploads files over 8 MB in parts: their ETag is not an MD5, yet an input the task
    did not change must not come back with the results."""
    q_pool.remote = {**q_pool.remote, "max_upload_mb": 64}
    q_pool.save()
    big = "0123456789abcdef" * (600 * 1024)  # 9.4 MiB
    case = launch(make_case, q_pool, "echo made > out.txt", inputs={"big.bin": big})
    case = poll_until(case, lambda c: c.is_terminal, timeout=60)
    assert case.status == CaseStatus.DONE, case.last_error
    out_bucket = qb.bucket_names(str(case.id))[1]
    etag = double.s3.head_object(Bucket=out_bucket, Key="big.bin")["ETag"]
    assert "-" in etag  # the double returned it with a multipart ETag, as Qarnot's storage does
    results = workspace.case_dir(case.id) / "results"
    assert (results / "out.txt").read_text() == "made\n" and not (results / "big.bin").exists()
