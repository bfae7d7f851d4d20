"""Job and device endpoints (SPEC §7): submission, visibility, cancel, logs, devices, specs."""

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.scheduling import eta
from apps.scheduling.drivers.emulator import available_devices
from apps.scheduling.models import Device, Job, JobStatus
from apps.sessions import services as session_services
from tests.scheduling.pulser_sequences import analog_sequence

pytestmark = pytest.mark.django_db


@pytest.fixture
def emulator(qpu_pool):
    return Device.objects.create(pool=qpu_pool, name="emu", driver="emulator", config={"pulser_device": "AnalogDevice"})


def post_job(client, session, payload=None, shots=50, **extra):
    return client.post(
        f"/api/v1/sessions/{session.pk}/jobs/", {"payload": payload or {"x": 1}, "shots": shots}, format="json", **extra
    )


def test_owner_submits_a_job_in_an_active_session(api, owner, qpu_pool, fake_device, open_session):
    session = open_session(qpu_pool, owner)
    response = post_job(api(owner), session)
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["status"] == "pending" and body["session"] == str(session.pk)
    assert body["pending_reason"] is None and body["queue_position"] is None  # not computed on submission
    body = api(owner).get(f"/api/v1/jobs/{body['id']}/").json()
    assert body["pending_reason"] == "waiting for its turn" and body["queue_position"] == 1


def test_submission_needs_the_owner(api, owner, staff, qpu_pool, fake_device, open_session):
    session = open_session(qpu_pool, owner)
    assert post_job(api(staff), session).status_code == 403  # visible to staff, not theirs


def test_submission_to_another_users_session_is_404(api, owner, outsider, qpu_pool, open_session):
    session = open_session(qpu_pool, owner)
    assert post_job(api(outsider), session).status_code == 404


def test_a_service_principal_sees_the_session_but_cannot_submit_in_it(api, owner, outsider, qpu_pool, open_session):
    """The owner-first lookup still asks the permission about someone else's session."""
    from django.contrib.auth.models import Permission

    outsider.user_permissions.add(Permission.objects.get(codename="act_on_behalf"))
    session = open_session(qpu_pool, owner)
    assert post_job(api(outsider), session).status_code == 403  # visible (not 404), not theirs


def test_a_service_principal_sees_others_sessions_but_not_their_jobs(
    api, owner, service_principal, staff, qpu_pool, fake_device, open_session
):
    """SPEC §10: users never see others' jobs. A service principal sees every session (it releases
    them for Slurm) but reads others' job payloads and results neither by id nor in the session's
    list; staff see them."""
    session = open_session(qpu_pool, owner)
    job_id = post_job(api(owner), session).json()["id"]
    assert api(service_principal).get(f"/api/v1/sessions/{session.pk}/").status_code == 200
    assert api(service_principal).get(f"/api/v1/jobs/{job_id}/").status_code == 404
    assert api(service_principal).get(f"/api/v1/sessions/{session.pk}/jobs/").json() == []
    assert [job["id"] for job in api(staff).get(f"/api/v1/sessions/{session.pk}/jobs/").json()] == [job_id]
    assert [job["id"] for job in api(owner).get(f"/api/v1/sessions/{session.pk}/jobs/").json()] == [job_id]


def test_submission_to_a_revoked_session_is_403(api, owner, qpu_pool, open_session):
    session = open_session(qpu_pool, owner)
    session_services.release(user=session.user, session_id=session.pk)
    response = post_job(api(owner), session)
    assert response.status_code == 403 and "revoked" in response.json()["detail"]


def test_invalid_pulser_sequence_is_refused_with_400(api, owner, qpu_pool, emulator, open_session):
    session = open_session(qpu_pool, owner)
    response = post_job(api(owner), session, payload={"sequence": '{"version": "1"}'})
    assert response.status_code == 400
    assert "Not a valid Pulser sequence" in response.json()["payload"][0]
    assert not Job.objects.exists()


def test_sequence_for_another_device_is_refused(api, owner, qpu_pool, emulator, open_session):
    session = open_session(qpu_pool, owner)
    response = post_job(api(owner), session, payload={"sequence": analog_sequence(device_name="MockDevice")})
    assert response.status_code == 400 and "runs 'AnalogDevice'" in response.json()["payload"][0]


def test_valid_sequence_as_object_or_string_is_accepted(api, owner, qpu_pool, emulator, open_session):
    session = open_session(qpu_pool, owner)
    text = analog_sequence()
    assert post_job(api(owner), session, payload={"sequence": text}).status_code == 201
    assert post_job(api(owner), session, payload={"sequence": json.loads(text)}).status_code == 201


@pytest.mark.parametrize("shots", [0, -3, "lots", None])
def test_bad_shots_are_400(api, owner, qpu_pool, fake_device, open_session, shots):
    session = open_session(qpu_pool, owner)
    assert post_job(api(owner), session, shots=shots).status_code == 400


def test_device_of_another_pool_is_refused(api, owner, qpu_pool, local_pool, open_session):
    other = Device.objects.create(pool=local_pool, name="elsewhere", driver="fake")
    session = open_session(qpu_pool, owner)
    response = api(owner).post(
        f"/api/v1/sessions/{session.pk}/jobs/", {"payload": {}, "shots": 1, "device": other.pk}, format="json"
    )
    assert response.status_code == 400 and "device" in response.json()


def test_idempotency_key_on_job_submission(api, owner, qpu_pool, fake_device, open_session):
    session = open_session(qpu_pool, owner)
    client = api(owner)
    first = post_job(client, session, HTTP_IDEMPOTENCY_KEY="job-1")
    again = post_job(client, session, HTTP_IDEMPOTENCY_KEY="job-1")
    assert first.json()["id"] == again.json()["id"] and Job.objects.count() == 1


def test_jobs_are_listed_for_their_owner_and_staff_only(api, owner, member, staff, qpu_pool, fake_device, open_session):
    post_job(api(owner), open_session(qpu_pool, owner))
    assert api(owner).get("/api/v1/jobs/").json()["count"] == 1
    assert api(member).get("/api/v1/jobs/").json()["count"] == 0
    assert api(staff).get("/api/v1/jobs/?status=pending").json()["count"] == 1


def test_another_users_job_is_404(api, owner, member, qpu_pool, fake_device, open_session):
    job_id = post_job(api(owner), open_session(qpu_pool, owner)).json()["id"]
    assert api(member).get(f"/api/v1/jobs/{job_id}/").status_code == 404
    assert api(member).post(f"/api/v1/jobs/{job_id}/cancel/").status_code == 404
    assert api(member).get(f"/api/v1/jobs/{job_id}/logs/").status_code == 404


def test_cancel_endpoint_and_409_on_repeat(api, owner, qpu_pool, fake_device, open_session):
    job_id = post_job(api(owner), open_session(qpu_pool, owner)).json()["id"]
    response = api(owner).post(f"/api/v1/jobs/{job_id}/cancel/")
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    again = api(owner).post(f"/api/v1/jobs/{job_id}/cancel/")
    assert again.status_code == 409 and again.json()["status"] == "cancelled"


def test_logs_endpoint(api, owner, qpu_pool, fake_device, open_session):
    job_id = post_job(api(owner), open_session(qpu_pool, owner)).json()["id"]
    Job.objects.filter(pk=job_id).update(logs="line 1\n")
    assert api(owner).get(f"/api/v1/jobs/{job_id}/logs/").json() == {"logs": "line 1\n"}


def test_job_list_query_count_is_constant(api, owner, qpu_pool, fake_device, open_session):
    session = open_session(qpu_pool, owner)
    client = api(owner)

    def queries():
        eta.clear_cache()  # the queue's snapshot rebuilt in full each time
        with CaptureQueriesContext(connection) as ctx:
            assert client.get("/api/v1/jobs/?page_size=500").status_code == 200
        return len(ctx)

    for _ in range(2):
        post_job(client, session)
    few = queries()
    for _ in range(20):
        post_job(client, session)
    assert queries() == few


def test_devices_list_shows_load_and_is_scoped(api, owner, outsider, staff, qpu_pool, fake_device, open_session):
    private = qpu_pool.__class__.objects.create(name="private", public=False)
    Device.objects.create(pool=private, name="hidden", driver="fake")
    session = open_session(qpu_pool, owner)
    job = post_job(api(owner), session).json()
    Job.objects.filter(pk=job["id"]).update(status=JobStatus.RUNNING, device=fake_device)
    names = [d["name"] for d in api(outsider).get("/api/v1/devices/").json()["results"]]
    assert names == ["fake1"]
    device = api(outsider).get(f"/api/v1/devices/{fake_device.pk}/").json()
    assert device["running_jobs"] == 1 and device["pending_jobs"] == 0
    assert len(api(staff).get("/api/v1/devices/").json()["results"]) == 2


def test_only_staff_write_devices(api, owner, staff, qpu_pool, fake_device):
    body = {"pool": qpu_pool.pk, "name": "new", "driver": "fake", "config": {}}
    assert api(owner).post("/api/v1/devices/", body, format="json").status_code == 403
    assert api(staff).post("/api/v1/devices/", body, format="json").status_code == 201
    bad = dict(body, name="bad", driver="emulator", config={"pulser_device": "NoSuchDevice"})
    response = api(staff).post("/api/v1/devices/", bad, format="json")
    assert response.status_code == 400 and "pulser_device" in response.json()["config"][0]


@pytest.mark.parametrize("driver", ["emulator", "pasqal_cloud"])
@pytest.mark.parametrize("name", ["Device", "VirtualDevice"])
def test_a_pulser_device_class_is_not_a_device(api, staff, qpu_pool, driver, name):
    """pulser.devices holds the classes Device and VirtualDevice beside the devices: configured
    with one, every submission to the device was a 500."""
    body = {"pool": qpu_pool.pk, "name": "cls", "driver": driver, "config": {"pulser_device": name}}
    response = api(staff).post("/api/v1/devices/", body, format="json")
    assert response.status_code == 400
    assert any("pulser_device" in problem for problem in response.json()["config"])
    assert name not in available_devices() and "AnalogDevice" in available_devices()


def test_a_device_saved_with_a_pulser_class_answers_503_not_500(api, owner, qpu_pool, open_session):
    """A config saved before its name was checked: the submission and the specs say an
    administrator must fix the device (503 with a message), not a 500."""
    device = Device.objects.create(pool=qpu_pool, name="legacy", driver="emulator", config={"pulser_device": "Device"})
    response = post_job(api(owner), open_session(qpu_pool, owner), {"sequence": analog_sequence()}, shots=10)
    assert response.status_code == 503 and "administrator" in response.json()["detail"]
    response = api(owner).get(f"/api/v1/devices/{device.pk}/specs/")
    assert response.status_code == 503 and "administrator" in response.json()["detail"]


def test_emulator_specs_are_its_pulser_device(api, owner, qpu_pool, emulator):
    specs = api(owner).get(f"/api/v1/devices/{emulator.pk}/specs/").json()
    assert specs["name"] == "AnalogDevice" and "channels" in specs


def test_device_back_online_triggers_dispatch(
    api, staff, owner, qpu_pool, fake_device, open_session, django_capture_on_commit_callbacks, settings
):
    settings.GRIDGATE_TASKS_EAGER = True
    Device.objects.filter(pk=fake_device.pk).update(online=False)
    session = open_session(qpu_pool, owner)
    with django_capture_on_commit_callbacks(execute=True):
        job_id = post_job(api(owner), session).json()["id"]
    assert Job.objects.get(pk=job_id).status == JobStatus.PENDING  # no device online
    with django_capture_on_commit_callbacks(execute=True):
        response = api(staff).patch(f"/api/v1/devices/{fake_device.pk}/", {"online": True}, format="json")
    assert response.status_code == 200
    assert Job.objects.get(pk=job_id).status == JobStatus.RUNNING


def test_a_device_running_jobs_cannot_be_deleted(api, staff, owner, qpu_pool, fake_device, open_session):
    job_id = post_job(api(owner), open_session(qpu_pool, owner)).json()["id"]
    Job.objects.filter(pk=job_id).update(status=JobStatus.RUNNING, device=fake_device)
    response = api(staff).delete(f"/api/v1/devices/{fake_device.pk}/")
    assert response.status_code == 409 and "running jobs" in response.json()["detail"]
    Job.objects.filter(pk=job_id).update(status=JobStatus.COMPLETED)
    assert api(staff).delete(f"/api/v1/devices/{fake_device.pk}/").status_code == 204
    assert Job.objects.get(pk=job_id).device is None  # the finished job keeps its history


def test_a_device_that_pending_jobs_asked_for_cannot_be_deleted(api, staff, owner, qpu_pool, fake_device, open_session):
    """A job that names a device runs only there (R-DEV-1 checked it against that device):
    deleting the device must not turn it into a job any device of the pool may take."""
    other = Device.objects.create(pool=qpu_pool, name="fake2", driver="fake", online=False)
    session = open_session(qpu_pool, owner)
    body = {"payload": {"x": 1}, "shots": 50, "device": fake_device.pk}
    response = api(owner).post(f"/api/v1/sessions/{session.pk}/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    job_id = response.json()["id"]
    answer = api(staff).delete(f"/api/v1/devices/{fake_device.pk}/")
    assert answer.status_code == 409, answer.content
    assert Job.objects.get(pk=job_id).target_device_id == fake_device.pk
    assert api(staff).delete(f"/api/v1/devices/{other.pk}/").status_code == 204  # nothing asked for it


def test_filtering_jobs_by_a_device_of_a_hidden_pool_answers_as_for_a_device_that_does_not_exist(
    api, outsider, private_pool
):
    """R-POOL-8: ``?device=`` was checked against every device, so a hidden pool's device gave an
    empty list and a missing id a 400: the answer told which devices exist."""
    from tests import factories

    hidden = factories.device(private_pool, "hidden")
    client = api(outsider)
    answers = [client.get(f"/api/v1/jobs/?device={pk}") for pk in (hidden.pk, hidden.pk + 1000)]
    assert answers[0].status_code == answers[1].status_code
    assert answers[0].json() == answers[1].json()
