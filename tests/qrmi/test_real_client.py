"""The unmodified qrmi 0.26.4 client against a live Gridgate (SPEC §7b, R-QRMI-1/2/3).

A live server (``live_qpu`` in conftest.py: the worker's tasks run eagerly, a ticker thread
sweeps the pools) dispatches, emulates and polls each job by the code the workers run. The client runs in
subprocesses, exactly as on a cluster: the SPANK plugin's part (is_accessible, acquire, release)
as root, the user's Pulser program as uid 65534 (``setpriv``), each signing its requests with the
real munged.
"""

from pathlib import Path

import pytest

from apps.scheduling import device_status
from apps.scheduling.models import Device, Job, JobStatus
from apps.sessions.models import RevocationReason, Session, SessionStatus
from tests.doubles.pasqal_qpu_server import QpuDouble
from tests.qrmi.conftest import RESOURCE, USER_UID, run_client

pytestmark = [pytest.mark.munge, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

CLIENT = Path(__file__).with_name("qrmi_client.py")


def client(mode: str, url: str, *, uid: int = 0, token: str = "", **extra) -> dict:
    """Run qrmi_client.py ``mode`` as ``uid`` with a Slurm job's QRMI environment."""
    if token:
        extra[f"{RESOURCE}_QRMI_JOB_ACQUISITION_TOKEN"] = token
    return run_client(CLIENT, mode, url, uid=uid, timeout=120, QRMI_JOB_QPU_TYPES="pasqal-local", **extra)


def test_r_qrmi_real_client_acquires_runs_pulser_and_releases(live_qpu):
    pool, user, url = live_qpu

    assert client("accessible", url) == {"accessible": True}
    token = client("acquire", url)["token"]
    session = Session.objects.get(pk=token)
    assert (session.user, session.pool, session.external_id, session.status) == (
        user,
        pool,
        "4242",
        SessionStatus.ACTIVE,
    )

    outcome = client("run", url, uid=USER_UID, token=token, RUNS="100")
    assert sum(outcome["counts"].values()) == 100
    assert all(len(bits) == 2 for bits in outcome["counts"])
    assert outcome["devices"] == ["AnalogDevice"]
    assert len(outcome["logs"]) == 1 and "simulated 2 atoms, 100 shots" in outcome["logs"][0]

    client("release", url, token=token)

    session.refresh_from_db()
    assert session.status == SessionStatus.REVOKED
    assert session.revocation_reason == RevocationReason.RELEASED
    job = Job.objects.get(session=session)
    assert job.status == JobStatus.COMPLETED
    assert job.user == user and job.user.unix_account.unix_uid == USER_UID
    assert sum(job.result["counts"].values()) == 100
    assert str(job.pk) == outcome["batch_id"]


def test_r_sess_2_one_slurm_job_acquires_on_two_qpu_pools_through_the_real_client(live_qpu):
    """``--qpu=fresnel,emu`` gives one QRMI_JOB_ID to two resources: the SPANK plugin acquires
    on each (one session per pool for the same scheduler job) and releases each at the end."""
    from apps.resources.models import ResourceClass, ResourcePool

    _, user, url = live_qpu
    emu = ResourcePool.objects.create(name="emu", kind="local", public=True, slots_total=2)
    ResourceClass.objects.create(pool=emu, name="access", cpu=1, memory=1, default=True)
    Device.objects.create(pool=emu, name="emu", driver="emulator", config={"pulser_device": "AnalogDevice"})

    def resource(name: str) -> dict:  # the job's QRMI environment for one of its resources
        return {"QRMI_JOB_QPU_RESOURCES": name, f"{name}_QRMI_WARDEN_URL": url.replace("/fresnel", f"/{name}")}

    tokens = {name: client("acquire", url, **resource(name))["token"] for name in ("fresnel", "emu")}
    sessions = Session.objects.filter(pk__in=tokens.values())
    assert sorted((s.pool.name, s.external_id, s.user, s.status) for s in sessions) == [
        ("emu", "4242", user, SessionStatus.ACTIVE),
        ("fresnel", "4242", user, SessionStatus.ACTIVE),
    ]
    for name, token in tokens.items():
        client("release", url, **resource(name), **{f"{name}_QRMI_JOB_ACQUISITION_TOKEN": token})
    assert {s.status for s in sessions.all()} == {SessionStatus.REVOKED}


def test_r_qrmi_real_client_reports_an_inaccessible_pool(live_qpu):
    pool, _, url = live_qpu
    pool.is_accessible, pool.accessibility_message = False, "Calibration in progress."
    pool.save()
    assert client("accessible", url) == {"accessible": False}


@pytest.fixture
def live_real_qpu(live_qpu):
    """The same pool with a real-QPU device instead of the emulator: the pasqal_qpu driver in
    front of the local double of the QPU API, its specs and status read by the status pass."""
    pool, user, url = live_qpu
    double = QpuDouble().start()
    pool.devices.all().delete()
    device = Device.objects.create(pool=pool, name="qpu", driver="pasqal_qpu", config={"url": double.url, "backoff": 0})
    assert device_status.check_device(device) == "up"
    yield pool, user, url, double
    double.stop()


def test_r_qrmi_warden_parity_real_client_runs_pulser_on_a_pasqal_qpu_pool(live_real_qpu):
    pool, user, url, double = live_real_qpu

    token = client("acquire", url)["token"]
    outcome = client("run", url, uid=USER_UID, token=token, RUNS="60")
    client("release", url, token=token)

    assert sum(outcome["counts"].values()) == 60 and all(len(bits) == 2 for bits in outcome["counts"])
    assert outcome["devices"] == ["AnalogDevice"]  # target(): the QPU's own specs (GET /system)
    (qpu_job,) = double.jobs.values()
    assert qpu_job["nb_run"] == 60 and qpu_job["status"] == "DONE" and double.posts() == 1
    job = Job.objects.get(session_id=token)
    assert job.status == JobStatus.COMPLETED and job.remote_id == str(qpu_job["uid"])
    assert qpu_job["context"]["pasqman_job_id"] == f"gridgate-job-{job.pk}"
    assert outcome["logs"] == [f"QPU job {qpu_job['uid']}: DONE\n"]
