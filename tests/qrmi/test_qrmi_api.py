"""R-QRMI-1/3: the Warden routes under /qrmi/<pool>/, with real MUNGE credentials (R-QRMI-2)."""

import json

import pytest
from django.contrib.auth.models import Group

from apps.scheduling.models import Device, Job, JobStatus
from apps.sessions.models import RevocationReason, Session, SessionStatus
from tests.qrmi.conftest import USER_UID
from tests.scheduling.pulser_sequences import analog_sequence

pytestmark = [pytest.mark.munge, pytest.mark.django_db]

BASE = "/qrmi/fresnel"
ROOT = 0


def acquire(qrmi, uid=ROOT, **body):
    return qrmi(uid).post(f"{BASE}/sessions", {"user_id": str(USER_UID), **body}, format="json")


def layout_sequence() -> str:
    import pulser.devices
    from pulser import Pulse, Sequence

    device = pulser.devices.AnalogDevice
    register = device.pre_calibrated_layouts[0].define_register(0, 1, qubit_ids=["q0", "q1"])
    sequence = Sequence(register, device)
    sequence.declare_channel("rydberg", "rydberg_global")
    sequence.add(Pulse.ConstantPulse(100, 2.0, 0.0, 0.0), "rydberg")
    sequence.measure("ground-rydberg")
    return sequence.to_abstract_repr()


def submit(qrmi, session, uid=USER_UID, shots=10, sequence=None):
    return qrmi(uid).post(
        f"{BASE}/jobs",
        {"sequence": sequence or layout_sequence(), "shots": shots},
        format="json",
        HTTP_X_WARDEN_SESSION=str(session.pk),
    )


# -- accessible ----------------------------------------------------------------------------------
def test_r_qrmi_1_accessible_needs_no_credential(qpu, qrmi):
    response = qrmi(None).get(f"{BASE}/accessible")
    assert response.status_code == 200
    assert response.json() == {"is_accessible": True, "message": ""}


def test_r_qrmi_1_accessible_false_carries_the_message(qpu, qrmi):
    qpu.is_accessible, qpu.accessibility_message = False, "Maintenance until 14:00."
    qpu.save()
    assert qrmi(None).get(f"{BASE}/accessible").json() == {
        "is_accessible": False,
        "message": "Maintenance until 14:00.",
    }


def test_r_qrmi_1_unknown_pool_is_404(qpu, qrmi):
    assert qrmi(None).get("/qrmi/nope/accessible").status_code == 404


def test_r_qrmi_1_routes_have_no_trailing_slash_and_are_never_redirected(qpu, qrmi, alice):
    # APPEND_SLASH must not turn the client's POST/DELETE into a redirect.
    response = acquire(qrmi)
    assert response.status_code == 201
    assert qrmi(ROOT).delete(f"{BASE}/sessions/{response.json()['id']}").status_code == 200
    assert qrmi(ROOT).post(f"{BASE}/sessions/", {}, format="json").status_code == 404


# -- acquire -------------------------------------------------------------------------------------
def test_r_qrmi_1_acquire_by_the_service_uid_opens_a_session_on_the_default_class(qpu, qrmi, alice):
    response = acquire(qrmi, slurm_job_id="4242")
    assert response.status_code == 201
    body = response.json()
    session = Session.objects.get(pk=body["id"])
    assert (session.user, session.pool, session.resource_class, session.slots, session.external_id) == (
        alice,
        qpu,
        qpu.classes.get(default=True),
        1,
        "4242",
    )
    assert body["user_id"] == str(USER_UID)


def test_r_qrmi_1_second_identical_acquire_returns_the_same_session(qpu, qrmi, alice):
    first = acquire(qrmi, slurm_job_id="4242")
    again = acquire(qrmi, slurm_job_id="4242")
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]


def test_r_qrmi_1_newer_field_names_are_accepted(qpu, qrmi, alice):
    response = acquire(qrmi, scheduler_job_id="77", qpu_slots=2)
    assert response.status_code == 201
    session = Session.objects.get(pk=response.json()["id"])
    assert (session.external_id, session.slots) == ("77", 2)
    # the 0.26.4 name for the same job is the same session
    assert acquire(qrmi, slurm_job_id="77", qpu_slots=2).json()["id"] == str(session.pk)


def test_r_qrmi_1_disagreeing_job_ids_are_400(qpu, qrmi, alice):
    assert acquire(qrmi, slurm_job_id="1", scheduler_job_id="2").status_code == 400


def test_r_qrmi_1_same_job_with_other_slots_is_409_with_a_readable_body(qpu, qrmi, alice):
    acquire(qrmi, scheduler_job_id="9", qpu_slots=1)
    response = acquire(qrmi, scheduler_job_id="9", qpu_slots=2)
    assert response.status_code == 409
    assert "already exists for external id '9'" in response.content.decode()


def test_r_qrmi_1_acquire_beyond_slots_total_is_409_with_a_readable_body(qpu, qrmi, alice):
    assert acquire(qrmi, scheduler_job_id="a", qpu_slots=3).status_code == 201
    response = acquire(qrmi, scheduler_job_id="b", qpu_slots=2)
    assert response.status_code == 409
    assert "Pool 'fresnel' has 1 of 4 slots available; 2 requested." in response.content.decode()
    assert response.json()["slots_available"] == 1


def test_r_qrmi_2_a_user_uid_calling_acquire_is_403(qpu, qrmi, alice):
    response = acquire(qrmi, uid=USER_UID)
    assert response.status_code == 403
    assert f"Unix uid {USER_UID} may not acquire sessions" in response.json()["detail"]
    assert not Session.objects.exists()


def test_r_qrmi_2_acquire_for_an_unknown_uid_is_403_naming_the_uid(qpu, qrmi):
    response = acquire(qrmi)
    assert response.status_code == 403
    assert f"Unix uid {USER_UID} has no Gridgate account" in response.json()["detail"]


def test_r_qrmi_2_acquire_for_a_user_without_access_to_the_pool_is_403(qpu, qrmi, alice):
    qpu.public = False
    qpu.save()
    qpu.groups.add(Group.objects.create(name="qpu-users"))
    response = acquire(qrmi)
    assert response.status_code == 403
    assert "may not use pool 'fresnel'" in response.json()["detail"]


def test_r_qrmi_2_service_principal_user_linked_to_a_uid_may_acquire(qpu, qrmi, alice, service_principal):
    from tests.qrmi.conftest import link

    link(service_principal, 1001)
    assert acquire(qrmi, uid=1001).status_code == 201


# -- release -------------------------------------------------------------------------------------
def test_r_qrmi_1_release_by_id_is_200_with_the_id_and_idempotent(qpu, qrmi, alice, open_qrmi_session):
    session = open_qrmi_session()
    for _ in range(2):
        response = qrmi(ROOT).delete(f"{BASE}/sessions/{session.pk}")
        assert response.status_code == 200
        assert response.json() == {"id": str(session.pk)}
    session.refresh_from_db()
    assert (session.status, session.revocation_reason) == (SessionStatus.REVOKED, RevocationReason.RELEASED)


def test_r_qrmi_1_release_with_the_session_header(qpu, qrmi, alice, open_qrmi_session):
    session = open_qrmi_session()
    response = qrmi(ROOT).delete(f"{BASE}/sessions", HTTP_X_WARDEN_SESSION=str(session.pk))
    assert (response.status_code, response.json()) == (200, {"id": str(session.pk)})
    assert Session.objects.get(pk=session.pk).status == SessionStatus.REVOKED


def test_r_qrmi_1_release_without_header_is_403_as_in_warden_and_unknown_session_404(qpu, qrmi, alice):
    assert qrmi(ROOT).delete(f"{BASE}/sessions").status_code == 403
    assert qrmi(ROOT).delete(f"{BASE}/sessions/not-a-uuid").status_code == 404
    assert qrmi(ROOT).delete(f"{BASE}/sessions/00000000-0000-0000-0000-000000000000").status_code == 404


def test_r_qrmi_2_release_by_another_uid_is_403_and_by_the_owner_200(qpu, qrmi, alice, bob, open_qrmi_session):
    session = open_qrmi_session()
    assert qrmi(1001).delete(f"{BASE}/sessions/{session.pk}").status_code == 403
    assert Session.objects.get(pk=session.pk).status == SessionStatus.ACTIVE
    assert qrmi(USER_UID).delete(f"{BASE}/sessions/{session.pk}").status_code == 200


# -- jobs ----------------------------------------------------------------------------------------
def test_r_qrmi_3_task_start_is_an_ordinary_pending_job(qpu, qrmi, alice, open_qrmi_session):
    session = open_qrmi_session()
    response = submit(qrmi, session, shots=25)
    assert response.status_code == 200
    body = response.json()
    job = Job.objects.get(pk=body["id"])
    assert isinstance(body["id"], int)
    assert body == {"id": job.pk, "user_id": str(USER_UID), "status": "PENDING", "results": None}
    assert (job.session, job.user, job.shots, job.status) == (session, alice, 25, JobStatus.PENDING)


def test_r_qrmi_1_task_start_validates_the_sequence_like_the_api(qpu, qrmi, alice, open_qrmi_session):
    session = open_qrmi_session()
    wrong_device = submit(qrmi, session, sequence=analog_sequence(device_name="DigitalAnalogDevice"))
    assert wrong_device.status_code == 400
    assert "runs 'AnalogDevice'" in wrong_device.content.decode()
    assert submit(qrmi, session, sequence="{not json").status_code == 400
    assert not Job.objects.exists()


def test_r_qrmi_1_task_start_without_session_header_is_403_as_in_warden(qpu, qrmi, alice):
    response = qrmi(USER_UID).post(f"{BASE}/jobs", {"sequence": "{}", "shots": 1}, format="json")
    assert response.status_code == 403
    assert "X-Warden-Session" in response.content.decode()


def test_r_qrmi_1_get_jobs_lists_the_callers_jobs_on_the_pool(qpu, qrmi, alice, bob, open_qrmi_session):
    from apps.sessions import services as session_services

    mine = [submit(qrmi, open_qrmi_session()).json()["id"] for _ in range(2)]
    theirs = session_services.admit(user=bob, resource_class=qpu.classes.get(), slots=1).session
    submit(qrmi, theirs, uid=1001)
    response = qrmi(USER_UID).get(f"{BASE}/jobs")
    assert response.status_code == 200
    assert [job["id"] for job in response.json()] == mine
    assert all(job["user_id"] == str(USER_UID) and job["status"] == "PENDING" for job in response.json())
    assert [job["user_id"] for job in qrmi(1001).get(f"{BASE}/jobs").json()] == ["1001"]


def test_r_qrmi_2_task_in_another_users_session_is_403(qpu, qrmi, alice, bob, open_qrmi_session):
    response = submit(qrmi, open_qrmi_session(), uid=1001)
    assert response.status_code == 403
    assert "belongs to another user" in response.json()["detail"]


def test_r_qrmi_2_task_from_an_unlinked_uid_is_403(qpu, qrmi, alice, open_qrmi_session):
    response = submit(qrmi, open_qrmi_session(), uid=ROOT)
    assert response.status_code == 403
    assert "Unix uid 0 is not linked" in response.json()["detail"]


def test_r_qrmi_2_task_after_release_is_403(qpu, qrmi, alice, open_qrmi_session):
    session = open_qrmi_session()
    qrmi(ROOT).delete(f"{BASE}/sessions/{session.pk}")
    response = submit(qrmi, session)
    assert response.status_code == 403
    assert "has ended" in response.json()["detail"]


@pytest.mark.parametrize(
    "status, wire",
    [
        (JobStatus.PENDING, "PENDING"),
        (JobStatus.RUNNING, "RUNNING"),
        (JobStatus.COMPLETED, "DONE"),
        (JobStatus.CANCELLED, "CANCELED"),
        (JobStatus.FAILED, "ERROR"),
    ],
)
def test_r_qrmi_1_job_status_uses_wardens_names(qpu, qrmi, alice, open_qrmi_session, status, wire):
    job_id = submit(qrmi, open_qrmi_session()).json()["id"]
    device = Device.objects.get(pool=qpu)
    result = {"counts": {"00": 7, "11": 3}} if status == JobStatus.COMPLETED else None
    Job.objects.filter(pk=job_id).update(status=status, device=device, result=result)
    body = qrmi(USER_UID).get(f"{BASE}/jobs/{job_id}").json()
    assert body["status"] == wire
    if status == JobStatus.COMPLETED:
        assert isinstance(body["results"], str)
        assert json.loads(body["results"]) == {"counter": {"00": 7, "11": 3}}
    else:
        assert body["results"] is None


def test_r_qrmi_1_another_uids_job_is_404(qpu, qrmi, alice, bob, open_qrmi_session):
    job_id = submit(qrmi, open_qrmi_session()).json()["id"]
    for path in (f"jobs/{job_id}", f"jobs/{job_id}/logs"):
        assert qrmi(1001).get(f"{BASE}/{path}").status_code == 404
    assert qrmi(1001).post(f"{BASE}/jobs/{job_id}/cancel").status_code == 404
    assert qrmi(USER_UID).get(f"{BASE}/jobs/{job_id}").status_code == 200


def test_r_qrmi_1_cancel_pending_job_then_409_when_finished(qpu, qrmi, alice, open_qrmi_session):
    job_id = submit(qrmi, open_qrmi_session()).json()["id"]
    response = qrmi(USER_UID).post(f"{BASE}/jobs/{job_id}/cancel")
    assert (response.status_code, response.json()["status"]) == (200, "CANCELED")
    again = qrmi(USER_UID).post(f"{BASE}/jobs/{job_id}/cancel")
    assert again.status_code == 409
    assert "Job is cancelled" in again.content.decode()


def test_r_qrmi_1_logs_are_a_string_with_the_error(qpu, qrmi, alice, open_qrmi_session):
    job_id = submit(qrmi, open_qrmi_session()).json()["id"]
    Job.objects.filter(pk=job_id).update(logs="simulated 2 atoms\n", error="boom")
    assert qrmi(USER_UID).get(f"{BASE}/jobs/{job_id}/logs").json() == {"logs": "simulated 2 atoms\nerror: boom\n"}


# -- specs and slots -----------------------------------------------------------------------------
def test_r_qrmi_1_specs_are_the_emulated_pulser_device_as_a_json_string(qpu, qrmi, alice):
    body = qrmi(USER_UID).get(f"{BASE}/qpu/specs").json()
    assert isinstance(body["specs"], str)
    assert json.loads(body["specs"])["name"] == "AnalogDevice"
    Device.objects.filter(pool=qpu).update(config={"pulser_device": "DigitalAnalogDevice"})
    assert json.loads(qrmi(USER_UID).get(f"{BASE}/qpu/specs").json()["specs"])["name"] == "DigitalAnalogDevice"


def test_r_qrmi_1_specs_without_a_device_is_404(qpu, qrmi, alice):
    Device.objects.filter(pool=qpu).delete()
    assert qrmi(USER_UID).get(f"{BASE}/qpu/specs").status_code == 404


def test_r_qrmi_1_qpu_slots_reports_usage(qpu, qrmi, alice, open_qrmi_session):
    open_qrmi_session(slots=3)
    assert qrmi(ROOT).get(f"{BASE}/qpu-slots").json() == {
        "qpu_slots_total": 4,
        "qpu_slots_used": 3,
        "qpu_slots_available": 1,
    }


def test_r_qrmi_1_qpu_slots_without_slots_total_is_404(qpu, qrmi):
    qpu.slots_total = None
    qpu.save()
    response = qrmi(ROOT).get(f"{BASE}/qpu-slots")
    assert response.status_code == 404
    assert "slots_total is not set" in response.json()["detail"]


# -- R-QRMI-3: the same sessions and jobs as everywhere ------------------------------------------
def test_r_qrmi_3_sessions_and_jobs_appear_in_the_main_api(qpu, qrmi, alice, api):
    session_id = acquire(qrmi, slurm_job_id="5").json()["id"]
    job_id = submit(qrmi, Session.objects.get(pk=session_id)).json()["id"]
    sessions = api(alice).get("/api/v1/sessions/").json()["results"]
    assert [s["id"] for s in sessions] == [session_id]
    jobs = api(alice).get("/api/v1/jobs/").json()["results"]
    assert [j["id"] for j in jobs] == [job_id]
    assert jobs[0]["status"] == "pending"


def test_r_qrmi_3_qrmi_jobs_are_fairly_scheduled_with_api_jobs(qpu, qrmi, alice, bob, api, settings):
    """Two one-slot sessions, one from QRMI and one from the API, with several jobs each: the
    weighted-fair dispatcher alternates between them."""
    from apps.scheduling.passes import dispatch_once

    Device.objects.filter(pool=qpu).update(driver="fake", config={"script": ["running", "completed"]})
    qrmi_session = Session.objects.get(pk=acquire(qrmi, slurm_job_id="q").json()["id"])
    api_session = api(bob).post("/api/v1/sessions/", {"resource_class": qpu.classes.get().pk}, format="json").json()
    for _ in range(2):
        assert submit(qrmi, qrmi_session).status_code == 200
    for _ in range(2):
        assert (
            api(bob)
            .post(
                f"/api/v1/sessions/{api_session['id']}/jobs/",
                {"payload": {"sequence": layout_sequence()}, "shots": 5},
                format="json",
            )
            .status_code
            == 201
        )
    Device.objects.filter(pool=qpu).update(max_concurrent_jobs=10)
    order = [str(dispatch_once(qpu.pk).session_id) for _ in range(4)]
    both = {str(qrmi_session.pk), api_session["id"]}
    assert set(order[:2]) == both and set(order[2:]) == both


# -- pool access on every route (R-POOL-8) -------------------------------------------------------
@pytest.fixture
def private_qpu(qpu, bob):
    """The QPU pool made private and granted to bob's group only (alice may not use it)."""
    group = Group.objects.create(name="fresnel-users")
    bob.groups.add(group)
    qpu.public = False
    qpu.save()
    qpu.groups.add(group)
    return qpu


@pytest.mark.parametrize("route", ["qpu-slots", "qpu/specs"])
def test_r_pool_8_a_private_pools_slots_and_specs_are_404_to_a_user_who_may_not_use_it(private_qpu, qrmi, alice, route):
    """Like GET /resource-pools/{id}/slots/: the same 404 as a pool that does not exist."""
    response = qrmi(USER_UID).get(f"{BASE}/{route}")
    assert response.status_code == 404
    assert response.json() == {"detail": "No pool 'fresnel'."}
    assert qrmi(USER_UID).get(f"/qrmi/no-such-pool/{route}").json() == {"detail": "No pool 'no-such-pool'."}


@pytest.mark.parametrize("route", ["qpu-slots", "qpu/specs"])
def test_r_pool_8_a_granted_user_and_the_service_uid_see_a_private_pools_slots_and_specs(
    private_qpu, qrmi, alice, bob, route
):
    assert qrmi(1001).get(f"{BASE}/{route}").status_code == 200
    assert qrmi(ROOT).get(f"{BASE}/{route}").status_code == 200


@pytest.mark.parametrize("route", ["qpu-slots", "qpu/specs"])
def test_r_qrmi_2_an_unlinked_uid_gets_403_on_slots_and_specs(qpu, qrmi, route):
    response = qrmi(USER_UID).get(f"{BASE}/{route}")
    assert response.status_code == 403
    assert f"Unix uid {USER_UID} is not linked" in response.json()["detail"]


@pytest.fixture
def other_qpu(db):
    from apps.resources.models import ResourceClass, ResourcePool

    pool = ResourcePool.objects.create(name="orion", kind="local", public=True, slots_total=4)
    ResourceClass.objects.create(pool=pool, name="access", cpu=1, memory=1, default=True)
    Device.objects.create(pool=pool, name="emu2", driver="emulator", config={"pulser_device": "AnalogDevice"})
    return pool


def test_r_qrmi_1_a_session_is_found_only_under_its_own_pool(qpu, other_qpu, qrmi, alice, open_qrmi_session):
    """A test that can fail: the session lookup not filtered by pool would let a session of pool
    fresnel submit to and be released through /qrmi/orion/."""
    session = open_qrmi_session()
    response = qrmi(USER_UID).post(
        "/qrmi/orion/jobs",
        {"sequence": layout_sequence(), "shots": 10},
        format="json",
        HTTP_X_WARDEN_SESSION=str(session.pk),
    )
    assert response.status_code == 404
    assert qrmi(ROOT).delete(f"/qrmi/orion/sessions/{session.pk}").status_code == 404
    assert qrmi(ROOT).delete("/qrmi/orion/sessions", HTTP_X_WARDEN_SESSION=str(session.pk)).status_code == 404
    session.refresh_from_db()
    assert session.status == SessionStatus.ACTIVE and not Job.objects.filter(session=session).exists()


def test_r_dev_1_task_start_with_an_unmeasured_or_parametrized_sequence_is_400(qpu, qrmi, alice, open_qrmi_session):
    from tests.scheduling.pulser_sequences import custom_sequence

    session = open_qrmi_session()
    unmeasured = submit(qrmi, session, sequence=custom_sequence(measured=False))
    assert unmeasured.status_code == 400 and "no measurement" in unmeasured.content.decode()
    parametrized = submit(qrmi, session, sequence=custom_sequence(parametrized=True))
    assert parametrized.status_code == 400 and "parametrized" in parametrized.content.decode()
    too_many_shots = submit(qrmi, session, shots=5000)
    assert too_many_shots.status_code == 400 and "at most 2000" in too_many_shots.content.decode()
    assert not Job.objects.exists()


# -- user_id parsing -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "user_id", ["\u0666\u0665\u0665\u0663\u0664", "65534\n", " 65534", "65534 ", "+1", "-1", "1e3", ""]
)
def test_r_qrmi_1_user_id_must_be_ascii_digits_without_whitespace(qpu, qrmi, alice, user_id):
    response = qrmi(ROOT).post(f"{BASE}/sessions", {"user_id": user_id}, format="json")
    assert response.status_code == 400, response.content
    assert "user_id" in response.json()
    assert not Session.objects.exists()


def test_r_qrmi_1_user_id_beyond_the_uid_range_is_400(qpu, qrmi, alice):
    response = qrmi(ROOT).post(f"{BASE}/sessions", {"user_id": "9999999999"}, format="json")
    assert response.status_code == 400 and "user_id" in response.json()
