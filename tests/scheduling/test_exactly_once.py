"""Exactly-once QPU execution: a worker SIGKILLed at three points of a job's hand-over to the QPU
(before the POST, after the POST before its answer is recorded, after the job's remote id is
committed), 50 times each, against the local double of the QPU API, which records the tag of
every job the QPU created. After each kill the job's claim expires and one poll pass takes it
over: every job ran exactly once on the QPU, none waited for more than that pass.

The worker is a forked child of the test process (Django and Pulser already loaded), killed by
itself at the point; the parent then plays the worker that takes over.
"""

import os
import signal
import traceback
from datetime import timedelta

import pytest
from django.db import connections
from django.utils import timezone

from apps.scheduling import device_status, passes, services
from apps.scheduling.drivers import pasqal_qpu
from apps.scheduling.models import Device, DriverRun, Job, JobStatus
from tests.doubles.pasqal_qpu_server import QpuDouble
from tests.scheduling.pulser_sequences import analog_sequence

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

RUNS = 50
POINTS = ("before_post", "after_post", "after_commit")


@pytest.fixture
def qpu(qpu_pool, settings):
    settings.GRIDGATE_TASKS_EAGER = False  # the test is the worker
    double = QpuDouble().start()
    device = Device.objects.create(
        pool=qpu_pool, name="fresnel", driver="pasqal_qpu", config={"url": double.url, "timeout": 5, "backoff": 0}
    )
    assert device_status.check_device(device) == "up"
    yield double
    double.stop()


def submit(session) -> Job:
    return services.submit_job(
        user=session.user, session_id=session.pk, payload={"sequence": analog_sequence(atoms=2)}, shots=10
    )


def run_to_the_end(pool, job) -> None:
    for _ in range(6):
        Job.objects.filter(pk=job.pk).update(next_poll_at=None)
        passes.run_pool(pool.pk)
        job.refresh_from_db()
        if job.status != JobStatus.RUNNING:
            return


def kill_self():
    os.kill(os.getpid(), signal.SIGKILL)


def worker_killed_at(point: str, pool_id: int) -> None:
    """A worker that dispatches the pool's job and dies at ``point`` (a forked child)."""
    connections.close_all()  # the child opens its own connection
    pid = os.fork()
    if pid == 0:  # the worker
        for alias in connections:  # its own connections, never a socket it inherited
            connections[alias].connection = None
        try:
            post = pasqal_qpu.QpuClient.call

            def call(client, method, path, body=None):
                if method == "POST" and path == "/jobs" and point == "before_post":
                    kill_self()
                answer = post(client, method, path, body)
                if method == "POST" and path == "/jobs" and point == "after_post":
                    kill_self()
                return answer

            pasqal_qpu.QpuClient.call = call
            job = passes.dispatch_once(pool_id)
            if job is None:  # the parent's failure shows what the dispatcher saw
                seen = list(Device.objects.filter(pool_id=pool_id).values()) + list(
                    Job.objects.filter(pool_id=pool_id).values("pk", "status", "device_id", "session_id")
                )
                os.write(2, f"dispatch_once found no job: {seen}\n".encode())
            passes.submit_claimed(job)
            if point == "after_commit":
                kill_self()
        except BaseException:
            os.write(2, traceback.format_exc().encode())  # the parent's failure shows why
        finally:
            os._exit(3)  # never reached the point: the parent's check fails
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"the worker was not killed at {point}"


@pytest.mark.parametrize("point", POINTS)
def test_a_worker_killed_during_a_qpu_submission_never_runs_the_job_twice(qpu, qpu_pool, open_session, owner, point):
    session = open_session(qpu_pool, owner)
    first = submit(session)  # the device has a job on record: a lost answer can be looked up
    run_to_the_end(qpu_pool, first)
    assert first.status == JobStatus.COMPLETED
    for _ in range(RUNS):
        job = submit(session)
        worker_killed_at(point, qpu_pool.pk)
        job.refresh_from_db()
        # Claimed by the dead worker (after_commit: handed over, its remote id recorded).
        assert job.status == JobStatus.RUNNING and bool(job.lease_owner) != bool(job.remote_id)
        # Its claim expires, and so has the QPU API's deadline for a POST that may have left (the
        # QPU API may create a job until then: a walk before it proves nothing, and the taker-over
        # would keep the job on its device until then); the next poll pass takes the job over and
        # settles it in that pass.
        Job.objects.filter(pk=job.pk).update(lease_until=timezone.now() - timedelta(seconds=1), next_poll_at=None)
        DriverRun.objects.filter(remote_id=f"gridgate-job-{job.pk}", sent_at__isnull=False).update(
            sent_at=timezone.now() - timedelta(hours=1)
        )
        passes.poll_running(qpu_pool.pk)
        job.refresh_from_db()
        assert job.remote_id, f"{point}: the job was not settled by the pass that took it over"
        run_to_the_end(qpu_pool, job)
        assert job.status == JobStatus.COMPLETED, (point, job.status, job.error)
        assert qpu.posted.count(f"gridgate-job-{job.pk}") == 1, point
