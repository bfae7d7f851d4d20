"""R-QRMI-1/3: the Warden routes under /qrmi/<pool>/, with real MUNGE credentials (R-QRMI-2)."""

import ipaddress
import json

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone

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
    assert response.json() == {
        "is_accessible": True,
        "message": "",
        # qrmi 0.25's status(): online, offline or paused, busy, pending jobs, capacity
        "status": "online",
        "status_reason": "",
        "busy": False,
        "pending_job_count": 0,
        "qpu_slots_total": 4,
        "qpu_slots_used": 0,
        "qpu_slots_available": 4,
    }


def test_r_qrmi_1_accessible_false_carries_the_message(qpu, qrmi):
    qpu.is_accessible, qpu.accessibility_message = False, "Maintenance until 14:00."
    qpu.save()
    body = qrmi(None).get(f"{BASE}/accessible").json()
    assert (body["is_accessible"], body["message"]) == (False, "Maintenance until 14:00.")
    assert (body["status"], body["status_reason"]) == ("offline", "Maintenance until 14:00.")


def test_a_paused_pool_reports_paused_with_its_reason_takes_sessions_and_jobs_that_wait(
    qpu, qrmi, alice, open_qrmi_session, settings
):
    """Paused (calibration, maintenance): accessible says so with the reason; acquire still
    works, a job is accepted and stays PENDING, and runs once the pause is cleared."""
    from apps.scheduling import passes

    settings.GRIDGATE_TASKS_EAGER = False
    qpu.paused_reason = "calibration until 14:00"
    qpu.save()
    body = qrmi(None).get(f"{BASE}/accessible").json()
    assert (body["is_accessible"], body["status"], body["status_reason"]) == (True, "paused", "calibration until 14:00")
    assert acquire(qrmi, slurm_job_id="p").status_code == 200
    job_id = submit(qrmi, open_qrmi_session()).json()["id"]
    passes.run_pool(qpu.pk)
    assert qrmi(USER_UID).get(f"{BASE}/jobs/{job_id}").json()["status"] == "PENDING"
    assert qrmi(None).get(f"{BASE}/accessible").json()["pending_job_count"] == 1
    qpu.paused_reason = ""
    qpu.save()
    passes.run_pool(qpu.pk)
    assert Job.objects.get(pk=job_id).device_id is not None
    assert qrmi(None).get(f"{BASE}/accessible").json()["status"] == "online"


def test_a_paused_device_pauses_the_pool_it_alone_serves(qpu, qrmi):
    Device.objects.filter(pool=qpu).update(paused_reason="laser maintenance")
    body = qrmi(None).get(f"{BASE}/accessible").json()
    assert (body["status"], body["status_reason"]) == ("paused", "laser maintenance")


def test_r_qrmi_1_unknown_pool_is_404(qpu, qrmi):
    assert qrmi(None).get("/qrmi/nope/accessible").status_code == 404


def test_r_qrmi_1_routes_have_no_trailing_slash_and_are_never_redirected(qpu, qrmi, alice):
    # APPEND_SLASH must not turn the client's POST/DELETE into a redirect.
    response = acquire(qrmi)
    assert response.status_code == 200
    assert qrmi(ROOT).delete(f"{BASE}/sessions/{response.json()['id']}").status_code == 200
    assert qrmi(ROOT).post(f"{BASE}/sessions/", {}, format="json").status_code == 404


# -- acquire -------------------------------------------------------------------------------------
def test_r_qrmi_1_acquire_by_the_service_uid_opens_a_session_on_the_default_class(qpu, qrmi, alice):
    response = acquire(qrmi, slurm_job_id="4242")
    assert response.status_code == 200  # Warden's answer, new session or not
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
    # Warden's session fields, both job id names
    assert (body["scheduler_job_id"], body["slurm_job_id"], body["qpu_slots"]) == ("4242", "4242", 1)
    assert body["created_at"] and body["idle_expires_at"] and body["expires_at"]
    assert (body["revoked_at"], body["revocation_reason"]) == (None, None)


def test_r_qrmi_1_second_identical_acquire_returns_the_same_session(qpu, qrmi, alice):
    first = acquire(qrmi, slurm_job_id="4242")
    again = acquire(qrmi, slurm_job_id="4242")
    assert (first.status_code, again.status_code) == (200, 200)
    assert first.json()["id"] == again.json()["id"]


def test_r_qrmi_1_newer_field_names_are_accepted(qpu, qrmi, alice):
    response = acquire(qrmi, scheduler_job_id="77", qpu_slots=2)
    assert response.status_code == 200
    session = Session.objects.get(pk=response.json()["id"])
    assert (session.external_id, session.slots) == ("77", 2)
    # the 0.26.4 name for the same job is the same session
    assert acquire(qrmi, slurm_job_id="77", qpu_slots=2).json()["id"] == str(session.pk)


def test_r_qrmi_1_disagreeing_job_ids_are_a_422_in_wardens_shape(qpu, qrmi, alice):
    response = acquire(qrmi, slurm_job_id="1", scheduler_job_id="2")
    assert response.status_code == 422
    assert response.json() == {
        "detail": [
            {
                "type": "value_error",
                "loc": ["body", "scheduler_job_id"],
                "msg": "slurm_job_id and scheduler_job_id disagree.",
            }
        ]
    }


def test_r_qrmi_1_same_job_with_other_slots_is_409_with_a_readable_body(qpu, qrmi, alice):
    acquire(qrmi, scheduler_job_id="9", qpu_slots=1)
    response = acquire(qrmi, scheduler_job_id="9", qpu_slots=2)
    assert response.status_code == 409
    assert "already exists for external id '9'" in response.content.decode()


def test_r_qrmi_1_acquire_beyond_slots_total_is_409_with_a_readable_body(qpu, qrmi, alice):
    assert acquire(qrmi, scheduler_job_id="a", qpu_slots=3).status_code == 200
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
    assert acquire(qrmi, uid=1001).status_code == 200


# -- release -------------------------------------------------------------------------------------
def test_r_qrmi_1_release_by_id_is_200_with_the_id_and_idempotent(qpu, qrmi, alice, open_qrmi_session):
    session = open_qrmi_session()
    answers = []
    for _ in range(2):
        response = qrmi(ROOT).delete(f"{BASE}/sessions/{session.pk}")
        assert response.status_code == 200
        answers.append(response.json())
    assert answers[0]["id"] == answers[1]["id"] == str(session.pk)
    assert answers[0]["revoked_at"] == answers[1]["revoked_at"] is not None  # the first one stays
    # A service uid releasing: the answer is the release statement's own row, with no lookup of
    # the owner's uid (the client reads only the id).
    assert answers[0]["revocation_reason"] == "released" and answers[0]["user_id"] is None
    session.refresh_from_db()
    assert (session.status, session.revocation_reason) == (SessionStatus.REVOKED, RevocationReason.RELEASED)


def test_r_qrmi_1_release_with_the_session_header(qpu, qrmi, alice, open_qrmi_session):
    session = open_qrmi_session()
    response = qrmi(ROOT).delete(f"{BASE}/sessions", HTTP_X_WARDEN_SESSION=str(session.pk))
    assert (response.status_code, response.json()["id"]) == (200, str(session.pk))
    assert Session.objects.get(pk=session.pk).status == SessionStatus.REVOKED


def test_r_qrmi_1_release_without_header_is_403_as_in_warden_and_unknown_session_404(qpu, qrmi, alice):
    assert qrmi(ROOT).delete(f"{BASE}/sessions").status_code == 403
    assert qrmi(ROOT).delete(f"{BASE}/sessions/not-a-uuid").status_code == 404
    assert qrmi(ROOT).delete(f"{BASE}/sessions/00000000-0000-0000-0000-000000000000").status_code == 404


def test_r_qrmi_2_release_by_another_uid_is_403_and_by_the_owner_200(qpu, qrmi, alice, bob, open_qrmi_session):
    session = open_qrmi_session()
    assert qrmi(1001).delete(f"{BASE}/sessions/{session.pk}").status_code == 403
    assert Session.objects.get(pk=session.pk).status == SessionStatus.ACTIVE
    response = qrmi(USER_UID).delete(f"{BASE}/sessions/{session.pk}")
    assert (response.status_code, response.json()["user_id"]) == (200, str(USER_UID))


# -- jobs ----------------------------------------------------------------------------------------
def test_r_qrmi_3_task_start_is_an_ordinary_pending_job(qpu, qrmi, alice, open_qrmi_session):
    session = open_qrmi_session()
    response = submit(qrmi, session, shots=25)
    assert response.status_code == 200
    body = response.json()
    job = Job.objects.get(pk=body["id"])
    assert isinstance(body["id"], int)
    assert {key: body[key] for key in ("id", "user_id", "status", "results", "shots", "session_id")} == {
        "id": job.pk,
        "user_id": str(USER_UID),
        "status": "PENDING",
        "results": None,
        "shots": 25,
        "session_id": str(session.pk),
    }
    assert body["created_at"] and body["started_at"] is None
    assert (job.session, job.user, job.shots, job.status) == (session, alice, 25, JobStatus.PENDING)


def test_r_qrmi_1_task_start_validates_the_sequence_like_the_api(qpu, qrmi, alice, open_qrmi_session):
    session = open_qrmi_session()
    wrong_device = submit(qrmi, session, sequence=analog_sequence(device_name="DigitalAnalogDevice"))
    assert wrong_device.status_code == 422  # Warden's status for a request it cannot take
    (error,) = wrong_device.json()["detail"]
    assert error["loc"] == ["body", "sequence"] and "runs 'AnalogDevice'" in error["msg"]
    assert submit(qrmi, session, sequence="{not json").status_code == 422
    assert not Job.objects.exists()


def test_a_422_never_repeats_the_session_header_or_what_the_body_sent(qpu, qrmi, alice, open_qrmi_session):
    """Warden's 422 (FastAPI's) carries the input; the next qrmi client redacts it because it
    repeats the session header. Gridgate's carry none, nor does a 404 or 403 about a session."""
    session = open_qrmi_session()
    token = str(session.pk)
    bad = qrmi(USER_UID).post(f"{BASE}/jobs", {"sequence": "", "shots": -1}, format="json", HTTP_X_WARDEN_SESSION=token)
    assert bad.status_code == 422 and token not in bad.content.decode()
    assert all(set(error) == {"type", "loc", "msg"} for error in bad.json()["detail"])
    assert [error["loc"] for error in bad.json()["detail"]] == [["body", "sequence"], ["body", "shots"]]
    elsewhere = qrmi(USER_UID).post(
        "/qrmi/nope/jobs", {"sequence": "{}", "shots": 1}, format="json", HTTP_X_WARDEN_SESSION=token
    )
    assert elsewhere.status_code == 404 and token not in elsewhere.content.decode()
    for answer in (
        qrmi(ROOT).delete(f"/qrmi/nope/sessions/{token}"),
        qrmi(1001).delete(f"{BASE}/sessions", HTTP_X_WARDEN_SESSION=token),
    ):
        assert answer.status_code in (403, 404) and token not in answer.content.decode()


def test_a_cudaq_analog_program_is_refused_with_a_422_saying_what_to_send(qpu, qrmi, alice, open_qrmi_session):
    program = {
        "setup": {"ahs_register": {"sites": [[0.0, 0.0], [5e-6, 0.0]], "filling": [1, 1]}},
        "hamiltonian": {"drivingFields": [], "localDetuning": []},
    }
    response = submit(qrmi, open_qrmi_session(), sequence=json.dumps(program))
    assert response.status_code == 422 and "CUDA-Q analog (AHS)" in response.json()["detail"][0]["msg"]


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


def test_a_job_dispatched_that_its_device_has_not_started_is_pending_as_warden_reports_it(
    qpu, qrmi, alice, open_qrmi_session
):
    job_id = submit(qrmi, open_qrmi_session()).json()["id"]
    Job.objects.filter(pk=job_id).update(status=JobStatus.RUNNING, device=Device.objects.get(pool=qpu))
    assert qrmi(USER_UID).get(f"{BASE}/jobs/{job_id}").json()["status"] == "PENDING"
    Job.objects.filter(pk=job_id).update(started_at=timezone.now())
    assert qrmi(USER_UID).get(f"{BASE}/jobs/{job_id}").json()["status"] == "RUNNING"


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
    started = timezone.now() if status != JobStatus.PENDING else None
    Job.objects.filter(pk=job_id).update(status=status, device=device, result=result, started_at=started)
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
    response = qrmi(None).get(f"{BASE}/qpu-slots")
    assert response.status_code == 404
    assert response.json() == {"detail": "QPU slots are not configured."}  # Warden's words


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


@pytest.mark.parametrize("route", ["", "accessible", "qpu-slots", "qpu/specs"])
def test_the_routes_warden_serves_open_need_no_credential_and_say_nothing_of_sessions(qpu, qrmi, route):
    """Warden's next client and the schedulers' load sensors send no credential to these: they
    say how the pool is (as ``accessible`` always did), never whose sessions or jobs it holds."""
    response = qrmi(None).get(f"{BASE}/{route}")
    assert response.status_code == 200
    assert "session" not in response.content.decode() and "user" not in response.content.decode()
    assert qrmi(None).get(f"/qrmi/no-such-pool/{route}").status_code == 404


@pytest.mark.parametrize("route", ["", "accessible", "qpu-slots", "qpu/specs"])
def test_a_private_pools_open_routes_answer_only_its_users_and_the_load_sensors(
    private_qpu, qrmi, alice, bob, settings, route
):
    """F11: a private pool's ``accessible`` and ``qpu-slots`` answered anyone. Now anyone else gets
    the 404 of an unknown pool; a MUNGE credential of one of its users, or a request from
    GRIDGATE_LOAD_SENSOR_NETWORKS, gets the answer."""
    assert qrmi(None).get(f"{BASE}/{route}").status_code == 404
    assert qrmi(USER_UID).get(f"{BASE}/{route}").status_code == 404  # alice may not use it
    assert qrmi(1001).get(f"{BASE}/{route}").status_code == 200  # bob's group is granted
    settings.GRIDGATE_LOAD_SENSOR_NETWORKS = (ipaddress.ip_network("127.0.0.0/8"),)
    assert qrmi(None).get(f"{BASE}/{route}").status_code == 200


def test_a_private_pools_job_list_is_the_404_of_an_unknown_pool_to_a_user_who_may_not_use_it(
    private_qpu, qrmi, alice, bob
):
    """R-POOL-8: ``GET jobs`` answered ``[]`` on a private pool to any linked uid, and 404 on a
    pool that does not exist, so the answer told which private pools exist."""
    unknown = qrmi(USER_UID).get("/qrmi/no-such-pool/jobs")
    hidden = qrmi(USER_UID).get(f"{BASE}/jobs")  # alice may not use it
    assert unknown.status_code == hidden.status_code == 404
    assert qrmi(1001).get(f"{BASE}/jobs").status_code == 200  # bob's group is granted


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


def test_r_dev_1_task_start_with_an_unmeasured_or_parametrized_sequence_is_422(qpu, qrmi, alice, open_qrmi_session):
    from tests.scheduling.pulser_sequences import custom_sequence

    session = open_qrmi_session()
    unmeasured = submit(qrmi, session, sequence=custom_sequence(measured=False))
    assert unmeasured.status_code == 422 and "no measurement" in unmeasured.content.decode()
    parametrized = submit(qrmi, session, sequence=custom_sequence(parametrized=True))
    assert parametrized.status_code == 422 and "parametrized" in parametrized.content.decode()
    too_many_shots = submit(qrmi, session, shots=5000)
    assert too_many_shots.status_code == 422 and "at most 2000" in too_many_shots.content.decode()
    assert not Job.objects.exists()


# -- user_id parsing -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "user_id", ["\u0666\u0665\u0665\u0663\u0664", "65534\n", " 65534", "65534 ", "+1", "-1", "1e3", ""]
)
def test_r_qrmi_1_user_id_must_be_ascii_digits_without_whitespace(qpu, qrmi, alice, user_id):
    response = qrmi(ROOT).post(f"{BASE}/sessions", {"user_id": user_id}, format="json")
    assert response.status_code == 422, response.content
    assert response.json()["detail"][0]["loc"] == ["body", "user_id"]
    assert not Session.objects.exists()


def test_r_qrmi_1_user_id_beyond_the_uid_range_is_422(qpu, qrmi, alice):
    response = qrmi(ROOT).post(f"{BASE}/sessions", {"user_id": "9999999999"}, format="json")
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body", "user_id"]


# -- Warden's next protocol: status, the recovery list, the greeting, empty logs ------------------
def test_status_is_for_service_uids_and_lists_pending_running_and_open_sessions(qpu, qrmi, alice, open_qrmi_session):
    session = open_qrmi_session()
    jobs = [submit(qrmi, session).json()["id"] for _ in range(3)]
    Job.objects.filter(pk=jobs[0]).update(
        status=JobStatus.RUNNING, device=Device.objects.get(pool=qpu), started_at=timezone.now(), remote_id="r1"
    )
    assert qrmi(USER_UID).get(f"{BASE}/status").status_code == 403
    assert qrmi(None).get(f"{BASE}/status").status_code == 401
    body = qrmi(ROOT).get(f"{BASE}/status").json()
    assert body["pending_jobs_count"] == 2
    assert (body["current_job"]["id"], body["current_job"]["session_id"]) == (jobs[0], str(session.pk))
    assert body["current_job"]["user_id"] == str(USER_UID) and body["current_job"]["backend_id"] == "r1"
    assert [s["id"] for s in body["open_sessions"]] == [str(session.pk)]
    assert body["status"] == "online" and body["busy"] is True


def test_the_recovery_list_finds_sessions_by_uid_job_and_activity_for_service_uids(
    qpu, qrmi, alice, bob, open_qrmi_session
):
    mine = acquire(qrmi, slurm_job_id="10").json()["id"]
    ended = acquire(qrmi, slurm_job_id="11").json()["id"]
    qrmi(ROOT).delete(f"{BASE}/sessions/{ended}")
    theirs = qrmi(ROOT).post(f"{BASE}/sessions", {"user_id": "1001", "slurm_job_id": "10"}, format="json").json()["id"]

    def ids(query):
        response = qrmi(ROOT).get(f"{BASE}/sessions{query}")
        assert response.status_code == 200, response.content
        return {s["id"] for s in response.json()}

    assert ids("") == {mine, ended, theirs}
    assert ids(f"?user_id={USER_UID}") == {mine, ended}
    assert ids("?scheduler_job_id=10") == {mine, theirs} == ids("?slurm_job_id=10")
    assert ids(f"?user_id={USER_UID}&active=true") == {mine}
    assert ids("?active=false") == {ended}
    assert ids("?user_id=4242") == set()
    assert qrmi(ROOT).get(f"{BASE}/sessions?active=maybe").status_code == 422
    assert qrmi(USER_UID).get(f"{BASE}/sessions").status_code == 403


def test_the_base_url_answers_as_wardens_greeting(qpu, qrmi):
    response = qrmi(None).get(f"{BASE}/")
    assert response.status_code == 200 and "is operational" in response.json()["message"]


def test_a_job_without_logs_answers_wardens_words(qpu, qrmi, alice, open_qrmi_session):
    job_id = submit(qrmi, open_qrmi_session()).json()["id"]
    assert qrmi(USER_UID).get(f"{BASE}/jobs/{job_id}/logs").json() == {"logs": "There are no logs for this job"}


@pytest.mark.parametrize(
    "reason, warden",
    [
        (RevocationReason.MAX_LIFETIME, "max_lifetime_expired"),
        (RevocationReason.IDLE_TIMEOUT, "idle_timeout"),
        (RevocationReason.MANUAL, "manual"),
    ],
)
def test_revocation_reasons_read_as_wardens_names(qpu, qrmi, alice, open_qrmi_session, reason, warden):
    """Warden's clients read `max_lifetime_expired` where Gridgate says `max_lifetime`."""
    from apps.sessions import services

    session = open_qrmi_session(external_id="77")
    services.revoke(session_ids=[session.pk], reason=reason)
    found = qrmi(ROOT).get(f"{BASE}/sessions?scheduler_job_id=77").json()
    assert [s["revocation_reason"] for s in found] == [warden]
