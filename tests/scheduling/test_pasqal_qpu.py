"""The pasqal_qpu driver against a local double of the QPU API (SPEC §5, R-DEV-1, R-JOB-2/3,
R-SCHED-3/4). The worker's functions are driven directly: no sleeps, no timing."""

import json
import time
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from apps.scheduling import device_status, passes, selectors, services
from apps.scheduling.devices import validate_driver_settings
from apps.scheduling.drivers import pasqal_qpu
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


def finished_one(pool, session) -> Job:
    """A job run to its end on the QPU: the device has a uid on record."""
    done = submit(session)
    run_to_the_end(pool)
    done.refresh_from_db()
    assert done.status == JobStatus.COMPLETED
    return done


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
    assert selectors.queue_info([Job.objects.select_related("pool").get(pk=job.pk)])[job.pk].code == "device_down"

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


def test_a_5xx_burst_is_retried_and_the_job_runs_once(qpu_pool, qpu, qpu_double, open_session, owner):
    """A 5xx to a POST may come after the QPU created the job: the QPU API answered, so it is
    done with the request, and a walk at once settles it (the device's last recorded job is
    there, the next uid is not): back in the queue, then sent again."""
    session = open_session(qpu_pool, owner)
    finished_one(qpu_pool, session)
    qpu_double.fault("/api/v1/jobs", status=503, times=2, method="POST")
    qpu_double.fault("/api/v1/jobs/101", status=502, times=3, method="GET")
    job = submit(session, shots=10)
    for _ in range(6):
        polls_due()
        Job.objects.filter(pk=job.pk).update(not_before=None)  # its back-off, without waiting it out
        run_to_the_end(qpu_pool, rounds=1)
    job.refresh_from_db()
    assert job.status == JobStatus.COMPLETED and sum(job.result["counts"].values()) == 10
    assert qpu_double.posts() == 4  # the first job's, two refused, one accepted
    assert qpu_double.posted.count(f"gridgate-job-{job.pk}") == 1  # one job on the QPU


def test_an_unreachable_qpu_is_a_transient_error_and_the_job_waits(qpu_pool, qpu, qpu_double, open_session, owner):
    """Nothing reached the QPU (the connection was refused): the job waits and is sent again."""
    job = submit(open_session(qpu_pool, owner))
    url = qpu_double.url
    Device.objects.filter(pk=qpu.pk).update(config={**qpu.config, "url": "http://127.0.0.1:9", "retries": 0})
    passes.run_pool(qpu_pool.pk)
    job.refresh_from_db()
    assert job.status == JobStatus.PENDING and job.attempts == 1 and "cannot reach" in job.error
    Device.objects.filter(pk=qpu.pk).update(config={**qpu.config, "url": url})
    Job.objects.filter(pk=job.pk).update(not_before=None)
    run_to_the_end(qpu_pool)
    job.refresh_from_db()
    assert job.status == JobStatus.COMPLETED and qpu_double.posts() == 1


def test_a_lost_answer_to_a_post_is_found_on_the_qpu_not_resubmitted(qpu_pool, qpu, qpu_double, open_session, owner):
    session = open_session(qpu_pool, owner)
    first = submit(session)
    run_to_the_end(qpu_pool)  # a job the device knows: uid 100
    job = submit(session)
    qpu_double.drop("/api/v1/jobs", method="POST")  # the QPU creates uid 101; the answer is lost
    passes.run_pool(qpu_pool.pk)
    job.refresh_from_db()
    # Not a failure and not back in the queue: the job keeps its device while it is looked for.
    assert job.status == JobStatus.RUNNING and job.remote_id == "" and job.attempts == 0
    assert "answer to submission" in job.logs
    assert qpu_double.jobs[101]["context"]["pasqman_job_id"] == f"gridgate-job-{job.pk}"
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
    # An earlier attempt recorded its intent, and its POST never reached the QPU; the QPU API's
    # deadline for it has passed.
    DriverRun.objects.create(
        remote_id=f"gridgate-job-{job.pk}",
        device=qpu,
        payload=job.payload,
        shots=job.shots,
        status="submitting",
        sent_at=timezone.now() - timedelta(hours=1),
    )
    passes.submit_claimed(claimed)
    job.refresh_from_db()
    assert job.remote_id == "101" and qpu_double.posts() == 2


def test_a_lost_answer_that_cannot_be_looked_up_ends_unknown_instead_of_running_twice(
    qpu_pool, qpu, qpu_double, open_session, owner, api
):
    job = submit(open_session(qpu_pool, owner))
    qpu_double.drop("/api/v1/jobs", method="POST")  # no uid known on this device yet
    passes.run_pool(qpu_pool.pk)
    polls_due()
    passes.run_pool(qpu_pool.pk)
    job.refresh_from_db()
    assert job.status == JobStatus.UNKNOWN and "not submitted again" in job.error
    assert f"gridgate-job-{job.pk}" in job.error  # the tag an operator looks for
    assert qpu_double.posts() == 1
    assert api(owner).get(f"/api/v1/jobs/{job.pk}/").json()["status"] == "unknown"
    assert not Job.objects.filter(device=qpu, status=JobStatus.RUNNING).exists()  # the device is free


def test_a_5xx_after_the_qpu_created_the_job_is_adopted_not_sent_again(qpu_pool, qpu, qpu_double, open_session, owner):
    session = open_session(qpu_pool, owner)
    finished_one(qpu_pool, session)
    job = submit(session)
    qpu_double.fault("/api/v1/jobs", status=502, method="POST", after=True)  # created, then 502
    passes.run_pool(qpu_pool.pk)
    polls_due()
    run_to_the_end(qpu_pool)
    job.refresh_from_db()
    assert job.status == JobStatus.COMPLETED
    assert qpu_double.posted.count(f"gridgate-job-{job.pk}") == 1


def test_a_lost_answer_after_the_qpu_api_restarted_ends_unknown_never_twice(
    qpu_pool, qpu, qpu_double, open_session, owner
):
    """The QPU API came back on an empty store: its uids start again, so the uid after the last
    one Gridgate recorded proves nothing. The job the lost POST created is not sent again."""
    session = open_session(qpu_pool, owner)
    finished_one(qpu_pool, session)
    qpu_double.restart()
    job = submit(session)
    qpu_double.drop("/api/v1/jobs", method="POST")
    passes.run_pool(qpu_pool.pk)
    polls_due()
    passes.run_pool(qpu_pool.pk)
    job.refresh_from_db()
    assert job.status == JobStatus.UNKNOWN
    assert qpu_double.posted.count(f"gridgate-job-{job.pk}") == 1


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


def test_specs_the_pinned_pulser_cannot_read_take_the_device_down_and_the_routes_answer_503(
    qpu_pool, qpu, qpu_double, api, owner, open_session
):
    """A QPU may report specs of a newer Pulser. The status pass takes the device down with the
    reason (jobs wait); its specs route, the QRMI specs route and a submission answer 503 with it,
    never a 500."""
    session = open_session(qpu_pool, owner)
    qpu_double.specs = {**qpu_double.specs, "channels": [{"id": "rydberg_global", "basis": "a new basis"}]}
    assert device_status.check_device(qpu) == "down"
    qpu.refresh_from_db()
    assert not qpu.online and "cannot read the specs" in qpu.provider_message
    Device.objects.filter(pk=qpu.pk).update(provider_specs=qpu_double.specs)  # as if stored before
    for response in (
        api(owner).get(f"/api/v1/devices/{qpu.pk}/specs/"),
        api(owner).post(
            f"/api/v1/sessions/{session.pk}/jobs/",
            {"payload": {"sequence": analog_sequence()}, "shots": 10},
            format="json",
        ),
        api(None).get(f"/qrmi/{qpu_pool.name}/qpu/specs"),
    ):
        assert response.status_code == 503 and "cannot read the specs" in response.json()["detail"]


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


@pytest.fixture
def keycloak_qpu(qpu_pool, monkeypatch):
    """A QPU API behind the centre's identity provider (OAuth2 client credentials, as Warden)."""
    from apps.scheduling.drivers import pasqal_qpu

    monkeypatch.setattr(pasqal_qpu, "TOKENS", pasqal_qpu.BearerTokens())  # no token from another test
    monkeypatch.setenv("GRIDGATE_CRED_QPU_CLIENT", "warden")
    monkeypatch.setenv("GRIDGATE_CRED_QPU_SECRET", "s3cret-VALUE")
    double = QpuDouble(client=("warden", "s3cret-VALUE")).start()
    device = Device.objects.create(
        pool=qpu_pool,
        name="fresnel",
        driver="pasqal_qpu",
        config={
            "url": double.url,
            "token_url": f"{double.url}/token",
            "client_id_env": "GRIDGATE_CRED_QPU_CLIENT",
            "client_secret_env": "GRIDGATE_CRED_QPU_SECRET",
            "backoff": 0,
        },
    )
    yield device, double
    double.stop()


def test_the_qpu_api_gets_a_bearer_token_from_the_identity_provider_once_and_reuses_it(
    keycloak_qpu, qpu_pool, open_session, owner
):
    device, double = keycloak_qpu
    assert device_status.check_device(device) == "up"
    job = submit(open_session(qpu_pool, owner))
    run_to_the_end(qpu_pool)
    job.refresh_from_db()
    assert job.status == JobStatus.COMPLETED
    assert double.token_requests == 1  # one grant for the status pass, the submission and the polls


def test_a_401_gets_a_fresh_token_and_one_retry_and_the_job_is_sent_once(keycloak_qpu, qpu_pool, open_session, owner):
    device, double = keycloak_qpu
    device_status.check_device(device)
    double.expire_tokens()  # the identity provider revoked it (or it expired early)
    job = submit(open_session(qpu_pool, owner))
    run_to_the_end(qpu_pool)
    job.refresh_from_db()
    assert job.status == JobStatus.COMPLETED and double.token_requests == 2
    assert double.posted.count(f"gridgate-job-{job.pk}") == 1


def test_refused_client_credentials_say_so_without_the_secret(keycloak_qpu, monkeypatch):
    device, double = keycloak_qpu
    monkeypatch.setenv("GRIDGATE_CRED_QPU_SECRET", "wrong-VALUE")
    assert device_status.check_device(device) == "unreachable"
    device.refresh_from_db()
    assert "invalid_client" in device.provider_message and "VALUE" not in device.provider_message


def test_pasqal_qpu_config_is_validated(qpu_pool):
    problems = PasqalQpuDriver().validate_config(
        {"url": "ftp://x", "auth_header": "Authorization", "retries": 99, "x": 1}
    )
    text = " ".join(problems)
    assert "unknown key 'x'" in text and "'url'" in text and "auth_env" in text and "'retries'" in text
    assert PasqalQpuDriver().validate_config({"url": "https://qpu.example.org"}) == []
    oauth = {
        "url": "https://qpu.example.org",
        "token_url": "https://sso.example.org/realms/hpc/protocol/openid-connect/token",
        "client_id_env": "GRIDGATE_CRED_QPU_CLIENT",
        "client_secret_env": "GRIDGATE_CRED_QPU_SECRET",
    }
    assert PasqalQpuDriver().validate_config(oauth) == []
    text = " ".join(PasqalQpuDriver().validate_config({**oauth, "client_secret_env": "SECRET_KEY", "token_url": "x"}))
    assert (
        "'client_secret_env' must name a variable whose name starts with GRIDGATE_CRED_" in text
        and "'token_url'" in text
    )
    text = " ".join(PasqalQpuDriver().validate_config({"url": "https://q", "client_id_env": "GRIDGATE_CRED_X"}))
    assert "go with 'token_url'" in text
    # The QPU API's deadline must lie past what the driver itself waits (timeout + back-offs: 10 + 7).
    text = " ".join(PasqalQpuDriver().validate_config({"url": "https://q", "request_deadline": 17}))
    assert "'request_deadline' must be above" in text and "17 s" in text
    assert PasqalQpuDriver().validate_config({"url": "https://q", "request_deadline": 18}) == []


def test_qrmi_specs_pass_the_qpus_own_text_through_unchanged(qpu_pool, qpu_double, client):
    """Warden hands the QPU's specs text on as it came; a copy re-serialized from the database
    had its keys in jsonb's order. Here the QPU writes its keys in reverse order, spaced its way."""
    from tests.doubles.pasqal_qpu_server import analog_device_specs

    specs = analog_device_specs()
    text = json.dumps(dict(reversed(list(specs.items()))), indent=1)
    qpu_double.specs = text  # GET /system answers {"specs": "<that text>"}
    device = Device.objects.create(pool=qpu_pool, name="fresnel", driver="pasqal_qpu", config={"url": qpu_double.url})
    assert device_status.check_device(device) == "up"
    answer = client.get(f"/qrmi/{qpu_pool.name}/qpu/specs")
    assert answer.status_code == 200, answer.content
    assert answer.json()["specs"] == text


# -- a slow QPU API: exactly once ------------------------------------------------------------------
class Clock:
    """One clock for the QPU double and the driver, moved by the test: no test waits 25 s."""

    def __init__(self):
        self.seconds = 0.0
        self.start = timezone.now()

    def __call__(self) -> float:  # the double's
        return self.seconds

    def now(self):  # the driver's
        return self.start + timedelta(seconds=self.seconds)


@pytest.fixture
def slow_qpu(qpu_pool, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(pasqal_qpu, "now", clock.now)
    double = QpuDouble(clock=clock).start()

    def device(**config):
        made = Device.objects.create(
            pool=qpu_pool, name="fresnel", driver="pasqal_qpu", config={"url": double.url, **config}
        )
        assert device_status.check_device(made) == "up"
        return made

    yield clock, double, device
    double.stop()


def lost_post_held(pool, double, job):
    """The job's POST left, its answer was lost (the driver's timeout), the QPU API has not created it."""
    passes.run_pool(pool.pk)
    deadline = time.monotonic() + 30
    while double.pending_creates() != 1 and time.monotonic() < deadline:  # the request reached the double
        time.sleep(0.05)
    assert double.pending_creates() == 1
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING and job.remote_id == ""  # held on its device, not requeued


@pytest.mark.parametrize(
    "delay, config",
    [
        (15, {"timeout": 0.3, "backoff": 0}),  # created after the driver's timeout and back-off
        (25, {"timeout": 0.3}),  # the default deadline, the default back-off
    ],
)
def test_a_job_the_qpu_api_creates_15_or_25_s_after_the_post_runs_exactly_once(
    qpu_pool, slow_qpu, open_session, owner, delay, config
):
    """The QPU API creates the job after the driver gave up on the POST's answer: the walk finds
    no uid past the last one for a while. That is no proof before the QPU API's own deadline, so
    the job keeps its device and is looked for again, and adopted once the QPU shows it: one QPU
    job for one Gridgate job (a resend on the first empty walk made two)."""
    clock, double, device = slow_qpu
    device(**config)
    session = open_session(qpu_pool, owner)
    finished_one(qpu_pool, session)  # the device knows uid 100
    job = submit(session)
    tag = f"gridgate-job-{job.pk}"
    double.delay_creates(delay)
    lost_post_held(qpu_pool, double, job)
    for second in range(5, delay, 5):  # the driver looks again every few seconds: nothing yet
        clock.seconds = second
        double.tick()
        polls_due()
        passes.run_pool(qpu_pool.pk)
        job.refresh_from_db()
        assert job.status == JobStatus.RUNNING and job.remote_id == "", second
    clock.seconds = delay
    double.tick()  # the QPU API creates the job now
    polls_due()
    run_to_the_end(qpu_pool)
    job.refresh_from_db()
    assert job.status == JobStatus.COMPLETED and job.remote_id == "101"
    assert double.posted.count(tag) == 1 and len(double.jobs) == 2


def test_a_lost_post_the_qpu_never_created_is_sent_again_only_after_its_deadline_and_a_second_walk(
    qpu_pool, slow_qpu, open_session, owner
):
    clock, double, device = slow_qpu
    device(timeout=0.3, backoff=0)  # request_deadline: the default, 120 s
    session = open_session(qpu_pool, owner)
    finished_one(qpu_pool, session)
    job = submit(session)
    double.delay_creates(10**6)  # never, as far as this test goes
    lost_post_held(qpu_pool, double, job)
    clock.seconds = 119
    polls_due()
    passes.run_pool(qpu_pool.pk)  # a walk before the deadline: no uid 101, which proves nothing
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING and job.remote_id == "" and double.posts() == 2
    clock.seconds = 120
    polls_due()
    passes.run_pool(qpu_pool.pk)  # the second walk, after it: never created, sent again
    job.refresh_from_db()
    assert job.remote_id == "101" and double.posts() == 3
    run_to_the_end(qpu_pool)
    job.refresh_from_db()
    assert job.status == JobStatus.COMPLETED and double.posted.count(f"gridgate-job-{job.pk}") == 1


def test_a_lost_post_the_qpu_api_cannot_be_asked_about_until_twice_its_deadline_ends_unknown(
    qpu_pool, slow_qpu, open_session, owner
):
    clock, double, device = slow_qpu
    qpu = device(timeout=0.3, backoff=0, retries=0, request_deadline=60)
    session = open_session(qpu_pool, owner)
    finished_one(qpu_pool, session)
    job = submit(session)
    double.delay_creates(10**6)
    lost_post_held(qpu_pool, double, job)
    Device.objects.filter(pk=qpu.pk).update(config={**qpu.config, "url": "http://127.0.0.1:9"})  # unreachable
    for second in (30, 90):
        clock.seconds = second
        polls_due()
        passes.run_pool(qpu_pool.pk)
        job.refresh_from_db()
        assert job.status == JobStatus.RUNNING and job.remote_id == "", second  # still held
    clock.seconds = 120
    polls_due()
    passes.run_pool(qpu_pool.pk)
    job.refresh_from_db()
    assert job.status == JobStatus.UNKNOWN and f"gridgate-job-{job.pk}" in job.error
    assert double.posted.count(f"gridgate-job-{job.pk}") == 0  # never created, never sent twice


@pytest.mark.credential_binding
def test_f8_a_device_reads_its_credential_only_where_the_variable_is_bound_to_its_pool(qpu_pool, monkeypatch):
    """F8 for devices: a device of another pool naming GRIDGATE_CRED_QPU_TOKEN gets nothing until
    GRIDGATE_CRED_QPU_TOKEN_POOLS lists its pool."""
    from apps.resources.models import ResourcePool

    double = QpuDouble(auth=("X-QPU-Token", "qpu-secret-VALUE-2")).start()
    monkeypatch.setenv("GRIDGATE_CRED_QPU_TOKEN", "qpu-secret-VALUE-2")
    other = ResourcePool.objects.create(name="elsewhere", kind="local", public=False)
    monkeypatch.setenv("GRIDGATE_CRED_QPU_TOKEN_POOLS", str(other.pk))
    try:
        config = {"url": double.url, "auth_header": "X-QPU-Token", "auth_env": "GRIDGATE_CRED_QPU_TOKEN", "backoff": 0}
        device = Device.objects.create(pool=qpu_pool, name="q", driver="pasqal_qpu", config=config)
        assert device_status.check_device(device) == "unreachable"
        assert f"GRIDGATE_CRED_QPU_TOKEN_POOLS={qpu_pool.pk}" in device.provider_message
        monkeypatch.setenv("GRIDGATE_CRED_QPU_TOKEN_POOLS", f"{other.pk},{qpu_pool.pk}")
        assert device_status.check_device(device) == "up"
    finally:
        double.stop()


@pytest.mark.parametrize("key", ["url", "token_url"])
def test_a_pasqal_qpu_url_that_cannot_be_parsed_is_400_not_500(qpu_pool, api, staff, key):
    config = {"url": "https://qpu.example.org", key: "https://[qpu.example.org/v1"}
    if key == "token_url":
        config.update(client_id_env="GRIDGATE_CRED_QPU_ID", client_secret_env="GRIDGATE_CRED_QPU_SECRET")
    response = api(staff).post(
        "/api/v1/devices/",
        {"pool": qpu_pool.pk, "name": "q", "driver": "pasqal_qpu", "config": config, "max_concurrent_jobs": 1},
        format="json",
    )
    assert response.status_code == 400, response.content
    assert key in str(response.json())
