"""The pasqal_qpu driver against a local double of the QPU API (SPEC §5, R-DEV-1, R-JOB-2/3,
R-SCHED-3/4). The worker's functions are driven directly: no sleeps, no timing."""

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from apps.scheduling import device_status, passes, selectors, services
from apps.scheduling.devices import validate_driver_settings
from apps.scheduling.drivers.pasqal_qpu import PasqalQpuDriver
from apps.scheduling.models import Device, DriverRun, Job, JobStatus
from tests.doubles.pasqal_qpu_server import QpuDouble
from tests.scheduling.pulser_sequences import analog_sequence

pytestmark = pytest.mark.django_db


@pytest.fixture
def qpu_double():
    double = QpuDouble().start()
    yield double
    double.stop()


@pytest.fixture
def qpu(qpu_pool, qpu_double):
    device = Device.objects.create(
        pool=qpu_pool, name="fresnel", driver="pasqal_qpu", config={"url": qpu_double.url, "timeout": 5, "backoff": 0}
    )
    assert device_status.check_device(device) == "up"  # the worker's status pass reads specs and status
    return device


def polls_due():
    Job.objects.update(next_poll_at=None)


def run_to_the_end(pool, rounds=5):
    for _ in range(rounds):
        polls_due()
        passes.run_pool(pool.pk)


def submit(session, shots=100, atoms=2):
    return services.submit_job(
        user=session.user, session_id=session.pk, payload={"sequence": analog_sequence(atoms=atoms)}, shots=shots
    )


def test_pasqal_qpu_job_runs_to_done_with_counts_equal_to_shots(qpu_pool, qpu, qpu_double, open_session, owner):
    job = submit(open_session(qpu_pool, owner), shots=100, atoms=3)
    passes.run_pool(qpu_pool.pk)
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING and job.remote_id == "100"
    sent = qpu_double.jobs[100]
    assert sent["nb_run"] == 100 and isinstance(sent["pulser_sequence"], str)
    assert sent["context"]["pasqman_job_id"] == f"gridgate-job-{job.pk}"  # Gridgate's stable run id
    run_to_the_end(qpu_pool)
    job.refresh_from_db()
    assert job.status == JobStatus.COMPLETED
    assert sum(job.result["counts"].values()) == 100 and set(job.result["counts"]) == {"000", "111"}
    assert job.runtime_seconds is not None and job.started_at
    assert qpu_double.posts() == 1


def test_pasqal_qpu_error_fails_the_job_with_the_qpus_message(qpu_pool, qpu, qpu_double, open_session, owner):
    qpu_double.fail_next = 1
    job = submit(open_session(qpu_pool, owner))
    run_to_the_end(qpu_pool)
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED
    assert "Atom loss above threshold" in job.error


def test_r_job_2_cancel_of_a_running_qpu_job_cancels_it_on_the_qpu(qpu_pool, qpu, qpu_double, open_session, owner):
    qpu_double.hold = True
    job = submit(open_session(qpu_pool, owner))
    run_to_the_end(qpu_pool, rounds=2)
    assert qpu_double.jobs[100]["status"] == "RUNNING"
    services.cancel_job(job)
    run_to_the_end(qpu_pool, rounds=1)
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED
    assert qpu_double.jobs[100]["status"] == "CANCELED"
    assert ("PUT", "/api/v1/jobs/100/cancel") in qpu_double.calls


def test_r_job_2_cancel_racing_completion_records_the_real_final_state(qpu_pool, qpu, qpu_double, open_session, owner):
    qpu_double.hold = True
    job = submit(open_session(qpu_pool, owner), shots=40)
    run_to_the_end(qpu_pool, rounds=2)
    services.cancel_job(job)
    qpu_double.finish(100, "DONE")  # the QPU finishes before the cancel reaches it: 400, code 3003
    run_to_the_end(qpu_pool, rounds=1)
    job.refresh_from_db()
    assert job.status == JobStatus.COMPLETED
    assert sum(job.result["counts"].values()) == 40


def test_device_down_holds_jobs_with_reason_and_up_releases_them(qpu_pool, qpu, qpu_double, open_session, owner):
    qpu_double.operational = "DOWN"
    assert device_status.check_device(qpu) == "down"
    qpu.refresh_from_db()
    assert qpu.online is False and qpu.provider_status == "down"
    job = submit(open_session(qpu_pool, owner))
    run_to_the_end(qpu_pool)
    job.refresh_from_db()
    assert job.status == JobStatus.PENDING and qpu_double.posts() == 0
    assert selectors.queue_info([Job.objects.select_related("pool").get(pk=job.pk)])[job.pk][0] == "device down"

    qpu_double.operational = "UP"
    assert device_status.check_device(qpu) == "up"
    qpu.refresh_from_db()
    assert qpu.online is True
    run_to_the_end(qpu_pool)
    job.refresh_from_db()
    assert job.status == JobStatus.COMPLETED and qpu_double.posts() == 1


def test_a_device_taken_offline_by_an_operator_stays_offline_while_the_qpu_is_up(qpu_pool, qpu, qpu_double):
    services.set_device_online(qpu, False)
    assert device_status.check_device(qpu) == "up"
    qpu.refresh_from_db()
    assert qpu.online is False


def test_a_qpu_that_went_down_since_the_last_check_is_not_sent_the_job(qpu_pool, qpu, qpu_double, open_session, owner):
    qpu_double.operational = "DOWN"  # the status pass has not seen it yet; the submission checks
    job = submit(open_session(qpu_pool, owner))
    passes.run_pool(qpu_pool.pk)
    job.refresh_from_db()
    qpu.refresh_from_db()
    assert job.status == JobStatus.PENDING and qpu_double.posts() == 0
    assert qpu.online is False and qpu.provider_status == "down"


def test_a_5xx_burst_is_retried_with_back_off(qpu_pool, qpu, qpu_double, open_session, owner):
    qpu_double.fault("/api/v1/jobs", status=503, times=2, method="POST")
    qpu_double.fault("/api/v1/jobs/100", status=502, times=3, method="GET")
    job = submit(open_session(qpu_pool, owner), shots=10)
    run_to_the_end(qpu_pool)
    job.refresh_from_db()
    assert job.status == JobStatus.COMPLETED and sum(job.result["counts"].values()) == 10
    assert qpu_double.posts() == 3  # two refused, one accepted: one job on the QPU
    assert len(qpu_double.jobs) == 1 and job.attempts == 0


def test_an_unreachable_qpu_is_a_transient_error_and_the_job_waits(qpu_pool, qpu, qpu_double, open_session, owner):
    qpu_double.fault("/api/v1/jobs", status=503, times=10, method="POST")
    job = submit(open_session(qpu_pool, owner))
    passes.run_pool(qpu_pool.pk)
    job.refresh_from_db()
    assert job.status == JobStatus.PENDING and job.attempts == 1 and "503" in job.error
    assert DriverRun.objects.get(remote_id=f"gridgate-job-{job.pk}").status == "unsent"


def test_a_lost_answer_to_a_post_is_found_on_the_qpu_not_resubmitted(qpu_pool, qpu, qpu_double, open_session, owner):
    session = open_session(qpu_pool, owner)
    first = submit(session)
    run_to_the_end(qpu_pool)  # a job the device knows: uid 100
    job = submit(session)
    qpu_double.drop("/api/v1/jobs", method="POST")  # the QPU creates uid 101; the answer is lost
    passes.run_pool(qpu_pool.pk)
    job.refresh_from_db()
    assert job.status == JobStatus.PENDING and job.attempts == 1  # transient: back in the queue
    assert qpu_double.jobs[101]["context"]["pasqman_job_id"] == f"gridgate-job-{job.pk}"
    Job.objects.filter(pk=job.pk).update(not_before=None)
    run_to_the_end(qpu_pool)
    job.refresh_from_db()
    first.refresh_from_db()
    assert job.status == JobStatus.COMPLETED and job.remote_id == "101"
    assert qpu_double.posts() == 2 and len(qpu_double.jobs) == 2  # never sent twice
    assert first.status == JobStatus.COMPLETED


def test_a_lost_post_the_qpu_never_got_is_sent_again(qpu_pool, qpu, qpu_double, open_session, owner):
    session = open_session(qpu_pool, owner)
    submit(session)
    run_to_the_end(qpu_pool)
    job = submit(session)
    claimed = passes.dispatch_once(qpu_pool.pk)
    # An earlier attempt recorded its intent, and its POST never reached the QPU.
    DriverRun.objects.create(
        remote_id=f"gridgate-job-{job.pk}", device=qpu, payload=job.payload, shots=job.shots, status="submitting"
    )
    passes.submit_claimed(claimed)
    job.refresh_from_db()
    assert job.remote_id == "101" and qpu_double.posts() == 2


def test_a_lost_answer_that_cannot_be_looked_up_fails_instead_of_running_twice(
    qpu_pool, qpu, qpu_double, open_session, owner
):
    job = submit(open_session(qpu_pool, owner))
    qpu_double.drop("/api/v1/jobs", method="POST")  # no uid known on this device yet
    passes.run_pool(qpu_pool.pk)
    Job.objects.filter(pk=job.pk).update(not_before=None)
    passes.run_pool(qpu_pool.pk)
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and "not submitted again" in job.error
    assert qpu_double.posts() == 1


def test_r_sched_3_worker_restart_resumes_polling_and_never_submits_twice(
    qpu_pool, qpu, qpu_double, open_session, owner
):
    job = submit(open_session(qpu_pool, owner))
    passes.run_pool(qpu_pool.pk)
    job.refresh_from_db()
    # A worker restarts with the job on the QPU: its lease is stale, it polls it.
    Job.objects.filter(pk=job.pk).update(lease_until=timezone.now() - timedelta(seconds=1))
    run_to_the_end(qpu_pool)
    job.refresh_from_db()
    assert job.status == JobStatus.COMPLETED and qpu_double.posts() == 1


def test_r_sched_3_answer_recorded_but_not_the_job_is_adopted_after_restart(
    qpu_pool, qpu, qpu_double, open_session, owner
):
    job = submit(open_session(qpu_pool, owner))
    passes.run_pool(qpu_pool.pk)
    # The worker died between the QPU's answer and the job's row: the claim is found stale.
    Job.objects.filter(pk=job.pk).update(remote_id="", lease_until=timezone.now() - timedelta(seconds=1))
    run_to_the_end(qpu_pool)
    job.refresh_from_db()
    assert job.status == JobStatus.COMPLETED and job.remote_id == "100"
    assert qpu_double.posts() == 1


def test_specs_come_from_the_qpu_through_the_status_pass(qpu_pool, qpu_double, api, owner):
    device = Device.objects.create(pool=qpu_pool, name="fresnel", driver="pasqal_qpu", config={"url": qpu_double.url})
    response = api(owner).get(f"/api/v1/devices/{device.pk}/specs/")
    assert response.status_code == 503 and "not known yet" in response.json()["detail"]
    assert ("GET", "/api/v1/system") not in qpu_double.calls  # never during a request
    device_status.check_device(device)
    response = api(owner).get(f"/api/v1/devices/{device.pk}/specs/")
    assert response.status_code == 200 and response.json()["name"] == "AnalogDevice"
    assert response.json() == qpu_double.specs


def test_r_dev_1_sequences_are_checked_against_the_qpus_own_specs(qpu_pool, qpu, qpu_double, api, owner, open_session):
    session = open_session(qpu_pool, owner)
    post = api(owner).post
    too_many_shots = post(
        f"/api/v1/sessions/{session.pk}/jobs/",
        {"payload": {"sequence": analog_sequence()}, "shots": 2001},
        format="json",
    )
    assert too_many_shots.status_code == 400 and "at most 2000" in str(too_many_shots.json())
    other_device = post(
        f"/api/v1/sessions/{session.pk}/jobs/",
        {"payload": {"sequence": analog_sequence(device_name="DigitalAnalogDevice")}, "shots": 10},
        format="json",
    )
    assert other_device.status_code == 400 and "runs 'AnalogDevice'" in str(other_device.json())
    assert not Job.objects.exists()


def test_a_pasqal_qpu_device_runs_one_job_at_a_time(qpu_pool, qpu_double, api, staff):
    device = Device(pool=qpu_pool, name="q", driver="pasqal_qpu", config={"url": qpu_double.url}, max_concurrent_jobs=2)
    with pytest.raises(ValidationError) as caught:
        validate_driver_settings({}, device)
    assert "max_concurrent_jobs" in caught.value.message_dict
    with pytest.raises(ValidationError, match="one job at a time"):
        device.full_clean()  # the database constraint backs the driver's rule
    response = api(staff).post(
        "/api/v1/devices/",
        {
            "pool": qpu_pool.pk,
            "name": "q",
            "driver": "pasqal_qpu",
            "config": {"url": qpu_double.url},
            "max_concurrent_jobs": 3,
        },
        format="json",
    )
    assert response.status_code == 400 and "max_concurrent_jobs" in response.json()


def test_the_auth_header_value_comes_from_the_environment_only(qpu_pool, monkeypatch):
    double = QpuDouble(auth=("X-QPU-Token", "qpu-secret-VALUE-1")).start()
    try:
        device = Device.objects.create(
            pool=qpu_pool,
            name="q",
            driver="pasqal_qpu",
            config={
                "url": double.url,
                "auth_header": "X-QPU-Token",
                "auth_env": "GRIDGATE_CRED_QPU_TOKEN",
                "backoff": 0,
            },
        )
        assert device_status.check_device(device) == "unreachable"
        assert "GRIDGATE_CRED_QPU_TOKEN" in device.provider_message and "qpu-secret" not in device.provider_message
        monkeypatch.setenv("GRIDGATE_CRED_QPU_TOKEN", "qpu-secret-VALUE-1")
        assert device_status.check_device(device) == "up"
        device.refresh_from_db()
        assert "qpu-secret" not in str(device.config) + device.provider_message
    finally:
        double.stop()


def test_pasqal_qpu_config_is_validated(qpu_pool):
    problems = PasqalQpuDriver().validate_config(
        {"url": "ftp://x", "auth_header": "Authorization", "retries": 99, "x": 1}
    )
    text = " ".join(problems)
    assert "unknown key 'x'" in text and "'url'" in text and "auth_env" in text and "'retries'" in text
    assert PasqalQpuDriver().validate_config({"url": "https://qpu.example.org"}) == []
