"""The emulator end to end: a real Pulser sequence through the API, run by the worker code."""

import pytest

from apps.scheduling.models import Device, Job, JobStatus
from tests.scheduling.pulser_sequences import analog_sequence

pytestmark = pytest.mark.django_db


def test_pulser_job_completes_with_counts_summing_to_shots(
    api, owner, qpu_pool, open_session, django_capture_on_commit_callbacks, settings
):
    settings.GRIDGATE_TASKS_EAGER = True  # the worker's tasks run inline, in order
    Device.objects.create(pool=qpu_pool, name="emu", driver="emulator")
    session = open_session(qpu_pool, owner)
    with django_capture_on_commit_callbacks(execute=True):
        response = api(owner).post(
            f"/api/v1/sessions/{session.pk}/jobs/",
            {"payload": {"sequence": analog_sequence(atoms=3)}, "shots": 200},
            format="json",
        )
    assert response.status_code == 201, response.content
    job = api(owner).get(f"/api/v1/jobs/{response.json()['id']}/").json()
    assert job["status"] == "completed", job
    counts = job["result"]["counts"]
    assert sum(counts.values()) == 200
    assert all(len(bits) == 3 and set(bits) <= {"0", "1"} for bits in counts)
    assert Job.objects.get(pk=job["id"]).runtime_seconds > 0


def test_emulator_failure_is_recorded_on_the_job(
    qpu_pool, owner, open_session, django_capture_on_commit_callbacks, settings
):
    from apps.scheduling import services
    from apps.scheduling.models import DriverRun

    settings.GRIDGATE_TASKS_EAGER = True
    Device.objects.create(pool=qpu_pool, name="emu", driver="emulator")
    session = open_session(qpu_pool, owner)
    job = services.submit_job(user=session.user, session=session, payload={"sequence": analog_sequence()}, shots=10)
    # The sequence is corrupted on the device side after submission (validated, then broken).
    Job.objects.filter(pk=job.pk).update(payload={"sequence": "{}"})
    job.refresh_from_db()
    claimed = services.dispatch_once(qpu_pool.pk)
    with django_capture_on_commit_callbacks(execute=True):
        services.submit_claimed(claimed)
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and "Pulser" in job.error
    assert DriverRun.objects.get(remote_id=job.remote_id).status == "failed"


# -- a worker killed mid-emulation (issue 16, item 9) ---------------------------------------------
def running_run(qpu_pool, *, started_ago: float, beat_ago: float | None):
    from datetime import timedelta

    from django.utils import timezone

    from apps.scheduling.models import DriverRun

    device = Device.objects.create(pool=qpu_pool, name="emu", driver="emulator")
    now = timezone.now()
    return device, DriverRun.objects.create(
        remote_id="emu-1",
        device=device,
        payload={"sequence": "{}"},
        shots=1,
        status="running",
        started_at=now - timedelta(seconds=started_ago),
        heartbeat_at=None if beat_ago is None else now - timedelta(seconds=beat_ago),
    )


def test_run_whose_worker_stopped_beating_is_failed_within_dead_after(qpu_pool):
    from apps.scheduling.drivers import emulator

    device, run = running_run(qpu_pool, started_ago=40, beat_ago=emulator.DEAD_AFTER.total_seconds() + 1)
    state = emulator.EmulatorDriver().poll(device, run.remote_id)
    assert state.status == "failed" and "worker stopped" in state.error
    run.refresh_from_db()
    assert run.status == "failed" and run.finished_at is not None


def test_long_run_with_a_live_heartbeat_keeps_running(qpu_pool):
    from apps.scheduling.drivers import emulator

    device, run = running_run(qpu_pool, started_ago=3600, beat_ago=1)
    assert emulator.EmulatorDriver().poll(device, run.remote_id).status == "running"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_heartbeat_is_stamped_while_the_simulation_runs(qpu_pool, monkeypatch):
    """The beat comes from its own thread and connection while the worker's thread is busy."""
    import time

    from django.db import connection

    from apps.scheduling.drivers import emulator
    from apps.scheduling.models import DriverRun

    device, run = running_run(qpu_pool, started_ago=0, beat_ago=0)
    first = run.heartbeat_at
    monkeypatch.setattr(emulator, "HEARTBEAT_SECONDS", 0.05)
    seen = []
    with emulator.Heartbeat(run.pk):
        for _ in range(400):  # bounded wait (a loaded machine): stop at the first new beat
            seen = list(DriverRun.objects.filter(pk=run.pk, heartbeat_at__gt=first).values_list("heartbeat_at"))
            if seen:
                break
            time.sleep(0.05)
    connection.close()
    assert seen, "no heartbeat was written"
