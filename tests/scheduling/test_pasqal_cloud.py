"""The pasqal_cloud driver through the real pasqal-cloud SDK (SPEC §5, R-DEV-1, R-JOB-2/3,
R-SCHED-3), against one double of the cloud API served two ways: over HTTP on loopback, and
through the SDK's own ``BaseMockServer`` on Pasqal Cloud's real endpoint names. A live test runs
only with real credentials."""

import json
import os
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.scheduling import device_status, passes, services
from apps.scheduling.drivers import PermanentDriverError, TransientDriverError, pasqal_cloud
from apps.scheduling.drivers.pasqal_cloud import PasqalCloudDriver, mapped
from apps.scheduling.models import Device, Job, JobStatus, OpenBatch
from apps.sessions import services as sessions
from tests.scheduling.pulser_sequences import analog_sequence

pytestmark = pytest.mark.django_db


@pytest.fixture
def cloud_device(qpu_pool, cloud):
    device = Device.objects.create(pool=qpu_pool, name="fresnel-cloud", driver="pasqal_cloud", config=cloud.config())
    assert device_status.check_device(device) == "up"
    return device


def run_to_the_end(pool, rounds=5):
    for _ in range(rounds):
        Job.objects.update(next_poll_at=None)
        passes.run_pool(pool.pk)


def submit(session, shots=50):
    return services.submit_job(
        user=session.user, session_id=session.pk, payload={"sequence": analog_sequence()}, shots=shots
    )


def test_pasqal_cloud_job_runs_as_one_batch_of_one_job_with_counts_equal_to_shots(
    qpu_pool, cloud_device, cloud, open_session, owner
):
    job = submit(open_session(qpu_pool, owner), shots=50)
    run_to_the_end(qpu_pool)
    job.refresh_from_db()
    assert job.status == JobStatus.COMPLETED and sum(job.result["counts"].values()) == 50
    (batch,) = cloud.batches.values()
    (remote,) = cloud.jobs.values()
    assert remote["runs"] == 50 and batch["tags"] == [f"gridgate-job-{job.pk}"] and batch["device_type"] == "FRESNEL"
    assert job.remote_id == remote["id"] and job.runtime_seconds is not None


def test_pasqal_cloud_error_fails_the_job_with_its_errors(qpu_pool, cloud_device, cloud, open_session, owner):
    cloud.fail_next = 1
    job = submit(open_session(qpu_pool, owner))
    run_to_the_end(qpu_pool)
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and "Calibration drift" in job.error


def test_r_job_2_pasqal_cloud_cancel_and_cancel_racing_completion(qpu_pool, cloud_device, cloud, open_session, owner):
    cloud.hold = True
    session = open_session(qpu_pool, owner)
    cancelled = submit(session)
    run_to_the_end(qpu_pool, rounds=2)
    services.cancel_job(cancelled)
    run_to_the_end(qpu_pool, rounds=1)
    cancelled.refresh_from_db()
    assert cancelled.status == JobStatus.CANCELLED

    raced = submit(session, shots=30)
    run_to_the_end(qpu_pool, rounds=2)
    services.cancel_job(raced)
    raced.refresh_from_db()
    cloud.finish(raced.remote_id, "DONE")  # finished before the cancel arrives: the API refuses it
    run_to_the_end(qpu_pool, rounds=1)
    raced.refresh_from_db()
    assert raced.status == JobStatus.COMPLETED and sum(raced.result["counts"].values()) == 30


def test_r_sched_3_pasqal_cloud_lost_answer_is_adopted_by_tag_not_resubmitted(
    qpu_pool, cloud_device, cloud, open_session, owner
):
    job = submit(open_session(qpu_pool, owner))
    cloud.drop("/api/v1/batches", method="POST")  # the batch is created; the answer never arrives
    passes.run_pool(qpu_pool.pk)
    job.refresh_from_db()
    assert job.status == JobStatus.PENDING and job.attempts == 1
    Job.objects.filter(pk=job.pk).update(not_before=None)
    run_to_the_end(qpu_pool)
    job.refresh_from_db()
    assert job.status == JobStatus.COMPLETED
    assert cloud.creations() == 1 and len(cloud.batches) == 1


def test_r_sched_3_pasqal_cloud_worker_restart_polls_and_never_submits_twice(
    qpu_pool, cloud_device, cloud, open_session, owner
):
    job = submit(open_session(qpu_pool, owner))
    passes.run_pool(qpu_pool.pk)
    Job.objects.filter(pk=job.pk).update(remote_id="", lease_until=timezone.now() - timedelta(seconds=1))
    run_to_the_end(qpu_pool)
    job.refresh_from_db()
    assert job.status == JobStatus.COMPLETED and cloud.creations() == 1


def submit_each(session, count, rounds=4):
    jobs = []
    for shots in range(10, 10 + count):
        jobs.append(submit(session, shots=shots))
        run_to_the_end(session.pool, rounds=rounds)
    return [Job.objects.get(pk=job.pk) for job in jobs]


def test_open_batches_stream_a_sessions_jobs_into_one_batch_closed_when_the_session_ends(
    qpu_pool, streaming_device, cloud, open_session, owner, member, admin_client
):
    session = open_session(qpu_pool, owner)
    jobs = submit_each(session, 3)
    assert [job.status for job in jobs] == [JobStatus.COMPLETED] * 3
    (batch,) = cloud.batches.values()
    assert batch["open"] and [j["id"] for j in cloud.jobs_of(batch["id"])] == [job.remote_id for job in jobs]
    assert [sum(job.result["counts"].values()) for job in jobs] == [10, 11, 12]
    assert cloud.creations() == 1 and cloud.additions() == 2

    other = submit_each(open_session(qpu_pool, member), 1)[0]  # another session: a batch of its own
    assert other.status == JobStatus.COMPLETED and len(cloud.batches) == 2

    assert pasqal_cloud.close_ended_batches() == 0  # the sessions are open: their batches stay open
    sessions.revoke(session_ids=[session.pk])
    assert pasqal_cloud.enqueue_batch_closes() is True
    assert pasqal_cloud.close_ended_batches() == 1
    assert cloud.batches[batch["id"]]["open"] is False
    assert OpenBatch.objects.get(batch_id=batch["id"]).closed_at is not None
    assert [b["open"] for b in cloud.batches.values()] == [False, True]
    page = admin_client.get("/admin/scheduling/openbatch/")  # operators see them, read-only
    assert page.status_code == 200 and batch["id"] in page.content.decode()


def test_open_batches_a_lost_answer_to_an_addition_is_adopted_by_the_sequences_name(
    qpu_pool, streaming_device, cloud, open_session, owner
):
    session = open_session(qpu_pool, owner)
    first = submit_each(session, 1)[0]
    second = submit(session, shots=20)
    cloud.drop("/jobs", method="POST")  # the job is added; the answer never arrives
    passes.run_pool(qpu_pool.pk)
    second.refresh_from_db()
    assert second.status == JobStatus.PENDING and second.attempts == 1
    Job.objects.filter(pk=second.pk).update(not_before=None)
    run_to_the_end(qpu_pool)
    second.refresh_from_db()
    assert second.status == JobStatus.COMPLETED and sum(second.result["counts"].values()) == 20
    (batch,) = cloud.batches.values()
    assert cloud.additions() == 1 and len(cloud.jobs_of(batch["id"])) == 2
    assert [j["id"] for j in cloud.jobs_of(batch["id"])] == [first.remote_id, second.remote_id]


def test_open_batches_an_addition_that_failed_is_sent_again_once(
    qpu_pool, streaming_device, cloud, open_session, owner
):
    session = open_session(qpu_pool, owner)
    submit_each(session, 1)
    second = submit(session, shots=20)
    cloud.fault("/jobs", status=503, method="POST")  # refused before anything was added
    passes.run_pool(qpu_pool.pk)
    Job.objects.filter(pk=second.pk).update(not_before=None)
    run_to_the_end(qpu_pool)
    second.refresh_from_db()
    (batch,) = cloud.batches.values()
    assert second.status == JobStatus.COMPLETED and len(cloud.jobs_of(batch["id"])) == 2


def test_open_batches_a_lost_addition_never_adopts_another_runs_job_in_the_batch(
    qpu_pool, streaming_device, cloud, open_session, owner
):
    session = open_session(qpu_pool, owner)
    submit_each(session, 1)
    second = submit(session, shots=20)
    cloud.fault("/jobs", status=503, method="POST")  # refused: never added
    passes.run_pool(qpu_pool.pk)
    (batch_id,) = cloud.batches
    # Another worker's job lands in the batch meanwhile, its answer not recorded yet.
    cloud.add_jobs(batch_id, [{"runs": 5, "sequence": json.dumps({"name": "gridgate-job-999999"})}])
    Job.objects.filter(pk=second.pk).update(not_before=None)
    run_to_the_end(qpu_pool)
    second.refresh_from_db()
    assert second.status == JobStatus.COMPLETED and sum(second.result["counts"].values()) == 20
    assert len(cloud.jobs_of(batch_id)) == 3


def test_open_batches_a_timed_out_batch_gives_way_to_the_sessions_next_one(
    qpu_pool, streaming_device, cloud, open_session, owner
):
    session = open_session(qpu_pool, owner)
    first = submit_each(session, 1)[0]
    (old,) = cloud.batches
    cloud.time_out(old)  # Pasqal Cloud ends an open batch no job came to
    second = submit_each(session, 1)[0]
    assert second.status == JobStatus.COMPLETED and cloud.batches[old]["status"] == "TIMED_OUT"
    new = next(b for b in cloud.batches.values() if b["id"] != old)
    assert new["open"] and [j["id"] for j in cloud.jobs_of(new["id"])] == [second.remote_id]
    assert first.remote_id != second.remote_id
    assert [(b.batch_id, b.closed_at is None) for b in OpenBatch.objects.order_by("pk")] == [
        (old, False),
        (new["id"], True),
    ]


def test_open_batches_a_job_meeting_a_batch_another_job_is_creating_goes_in_a_batch_of_its_own(
    qpu_pool, streaming_device, cloud, open_session, owner
):
    session = open_session(qpu_pool, owner)
    OpenBatch.objects.create(device=streaming_device, session=session, creator="gridgate-job-0")
    job = submit_each(session, 1)[0]
    (batch,) = cloud.batches.values()
    assert job.status == JobStatus.COMPLETED and batch["open"] is False


def test_pasqal_cloud_device_down_when_the_device_type_is_not_offered(qpu_pool, cloud_device, cloud):
    del cloud.specs["FRESNEL"]
    assert device_status.check_device(cloud_device) == "down"
    cloud_device.refresh_from_db()
    assert cloud_device.online is False and "does not offer FRESNEL" in cloud_device.provider_message


def test_pasqal_cloud_wrong_password_leaves_the_device_unreachable_and_no_secret_shows(qpu_pool, cloud, monkeypatch):
    monkeypatch.setenv("GRIDGATE_CRED_CLOUD_PASSWORD", "wrong-PASSWORD-xyz")
    device = Device.objects.create(pool=qpu_pool, name="c", driver="pasqal_cloud", config=cloud.config())
    assert device_status.check_device(device) == "unreachable"
    assert "wrong-PASSWORD" not in device.provider_message and cloud.password not in device.provider_message


def test_r_dev_1_pasqal_cloud_sequences_are_checked_against_the_published_specs(
    qpu_pool, cloud_device, api, owner, open_session
):
    session = open_session(qpu_pool, owner)
    response = api(owner).post(
        f"/api/v1/sessions/{session.pk}/jobs/",
        {"payload": {"sequence": analog_sequence()}, "shots": 5000},
        format="json",
    )
    assert response.status_code == 400 and "at most 2000" in str(response.json())


def test_sdk_errors_map_to_transient_or_permanent():
    import requests
    from pasqal_cloud.errors import BatchCreationError

    def http_error(status):
        response = requests.Response()
        response.status_code, response._content = status, b'{"code": 0, "message": "x", "data": {}}'
        return requests.HTTPError(response=response)

    for status, kind in ((503, TransientDriverError), (429, TransientDriverError), (400, PermanentDriverError)):
        error = http_error(status)
        try:
            raise BatchCreationError(error) from error
        except BatchCreationError as exc:
            assert isinstance(mapped(exc, "submitting"), kind)
    assert isinstance(mapped(requests.ConnectionError("refused"), "x"), TransientDriverError)


def test_pasqal_cloud_config_is_validated():
    problems = " ".join(
        PasqalCloudDriver().validate_config({"device_type": "NOPE", "username_env": "GRIDGATE_CRED_U", "password": "x"})
    )
    assert "project_id" in problems and "device_type" in problems and "unknown key 'password'" in problems
    assert "password_env" in problems
    config = {"project_id": "p", "device_type": "EMU_MPS", "token_env": "GRIDGATE_CRED_T"}
    assert PasqalCloudDriver().validate_config(config) == []
    assert "GRIDGATE_CRED_" in " ".join(PasqalCloudDriver().validate_config(config | {"token_env": "SECRET_KEY"}))


@pytest.mark.live
def test_live_pasqal_cloud_specs_with_real_credentials(qpu_pool, monkeypatch):
    """Runs only with GRIDGATE_LIVE_PASQAL_PROJECT_ID and GRIDGATE_LIVE_PASQAL_TOKEN (or _USERNAME/_PASSWORD)."""
    project = os.environ.get("GRIDGATE_LIVE_PASQAL_PROJECT_ID")
    if not project:
        pytest.skip("set GRIDGATE_LIVE_PASQAL_PROJECT_ID and GRIDGATE_LIVE_PASQAL_TOKEN to run against Pasqal Cloud")
    config = {"project_id": project, "device_type": os.environ.get("GRIDGATE_LIVE_PASQAL_DEVICE", "FRESNEL")}
    # Only GRIDGATE_CRED_* variables may hold credentials (R-BACK-1): the live ones are copied there.
    for name in ("TOKEN", "USERNAME", "PASSWORD"):
        if os.environ.get(f"GRIDGATE_LIVE_PASQAL_{name}"):
            monkeypatch.setenv(f"GRIDGATE_CRED_LIVE_PASQAL_{name}", os.environ[f"GRIDGATE_LIVE_PASQAL_{name}"])
    if os.environ.get("GRIDGATE_LIVE_PASQAL_TOKEN"):
        config["token_env"] = "GRIDGATE_CRED_LIVE_PASQAL_TOKEN"
    else:
        config |= {
            "username_env": "GRIDGATE_CRED_LIVE_PASQAL_USERNAME",
            "password_env": "GRIDGATE_CRED_LIVE_PASQAL_PASSWORD",
        }
    device = Device.objects.create(pool=qpu_pool, name="live", driver="pasqal_cloud", config=config)
    assert device_status.check_device(device) in ("up", "down")
    device.refresh_from_db()
    assert device.provider_status != "unreachable", device.provider_message
