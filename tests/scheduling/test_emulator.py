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
