"""The next qrmi client's protocol (Warden's QPU-slots branch) end to end against a live Gridgate
(SPEC §7b, R-QRMI-1/2/3), beside test_real_client.py's qrmi 0.26.4.

next_client.py sends the requests as that client's source sends them, from subprocesses as on a
cluster: the SPANK plugin's part (status, acquire, release) as root, the user's part as uid
65534, each request signed with a fresh credential from the real munged.
"""

import json
from pathlib import Path

import pytest

from apps.scheduling import passes as scheduling
from apps.scheduling.models import Job, JobStatus
from apps.sessions.models import RevocationReason, Session, SessionStatus
from tests.qrmi.conftest import RESOURCE, USER_UID, run_client

pytestmark = [pytest.mark.munge, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

CLIENT = Path(__file__).with_name("next_client.py")


def next_client(mode: str, url: str, *, uid: int = 0, token: str = "", job_id: str = "4242", **extra) -> dict:
    """Run next_client.py ``mode`` as ``uid`` with a Slurm job's QRMI environment."""
    extra[f"{RESOURCE}_QRMI_JOB_ACQUISITION_TOKEN"] = token
    return run_client(CLIENT, mode, url, uid=uid, QRMI_JOB_ID=job_id, **extra)


def test_r_qrmi_next_client_acquires_with_qpu_slots_runs_a_job_and_revokes_with_the_header(live_qpu):
    pool, user, url = live_qpu

    before = next_client("status", url)
    assert before["accessible"][0] == 200 and before["accessible"][1]["status"] == "online"
    assert before["qpu_slots"] == [200, {"qpu_slots_total": 2, "qpu_slots_used": 0, "qpu_slots_available": 2}]

    acquired = next_client("acquire", url, QRMI_JOB_QPU_SLOTS="2")
    assert acquired["code"] == 200
    token = acquired["session"]["id"]
    assert (acquired["session"]["scheduler_job_id"], acquired["session"]["qpu_slots"]) == ("4242", 2)
    assert acquired["session"]["user_id"] == str(USER_UID) and acquired["session"]["revoked_at"] is None
    session = Session.objects.get(pk=token)
    assert (session.user, session.pool, session.external_id, session.slots) == (user, pool, "4242", 2)
    assert next_client("status", url)["qpu_slots"][1]["qpu_slots_available"] == 0
    again = next_client("acquire", url, QRMI_JOB_QPU_SLOTS="2")  # the prolog run twice: the same session
    assert again["code"] == 200 and again["session"]["id"] == token
    other = next_client("acquire", url, job_id="4243", QRMI_JOB_QPU_SLOTS="1")
    assert other["code"] == 409 and "0 of 2 slots available" in other["session"]["detail"]

    outcome = next_client("run", url, uid=USER_UID, token=token, RUNS="80")
    assert outcome["specs"] == 200
    job = outcome["job"]
    assert job["status"] == "DONE" and job["session_id"] == token and job["shots"] == 80
    assert sum(json.loads(job["results"])["counter"].values()) == 80
    assert outcome["statuses"][-1] == "DONE" and set(outcome["statuses"]) <= {"PENDING", "RUNNING", "DONE"}
    assert outcome["jobs"] == [job["id"]]
    assert "simulated 2 atoms, 80 shots" in outcome["logs"]["logs"]
    refused_code, refused = outcome["refused"]
    assert refused_code == 422 and {tuple(d["loc"]) for d in refused["detail"]} >= {("body", "shots")}
    assert token not in json.dumps(refused)  # the next client need not redact our 422s

    released = next_client("release", url, token=token)
    assert released["code"] == 200 and released["session"]["revoked_at"] is not None
    session.refresh_from_db()
    assert session.status == SessionStatus.REVOKED and session.revocation_reason == RevocationReason.RELEASED
    assert Job.objects.get(session=session).status == JobStatus.COMPLETED
    assert next_client("status", url)["qpu_slots"][1]["qpu_slots_available"] == 2
    assert next_client("release", url, token=token)["code"] == 200  # the epilog run twice


def test_r_qrmi_next_client_reads_a_paused_pool_whose_job_waits_until_it_resumes(live_qpu):
    pool, _, url = live_qpu
    pool.paused_reason = "Calibration until 14:00."
    pool.save()
    status = next_client("status", url)["accessible"][1]
    assert (status["status"], status["status_reason"]) == ("paused", "Calibration until 14:00.")

    token = next_client("acquire", url)["session"]["id"]  # sessions are still admitted
    submitted = next_client("submit", url, uid=USER_UID, token=token, RUNS="10")
    assert submitted["code"] == 200 and submitted["job"]["status"] == "PENDING"
    scheduling.sweep()  # what the workers' tick does: a paused pool dispatches nothing
    job = Job.objects.get(pk=submitted["job"]["id"])
    assert job.status == JobStatus.PENDING and job.device_id is None

    pool.paused_reason = ""
    pool.save()
    done = next_client("wait", url, uid=USER_UID, JOB=str(job.pk))
    assert done["job"]["status"] == "DONE" and done["statuses"][0] == "PENDING"
    assert next_client("status", url)["accessible"][1]["status"] == "online"
