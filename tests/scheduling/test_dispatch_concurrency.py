"""R-SCHED-4 under real concurrency: several dispatchers at once on PostgreSQL."""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from apps.core.retry import retry_aborted
from apps.resources.models import ResourceClass, ResourcePool
from apps.scheduling import passes, services
from apps.scheduling.drivers.fake import FakeDriver
from apps.scheduling.models import Device, FairShare, Job, JobStatus
from apps.sessions import services as session_services

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("strategy", ["weighted_fair", "usage_fair"])
def test_concurrent_dispatchers_never_double_dispatch_or_overfill(owner, member, monkeypatch, strategy):
    pool = ResourcePool.objects.create(name="qpu", kind="local", public=True, strategy=strategy)
    klass = ResourceClass.objects.create(pool=pool, name="c", cpu=1, memory=1, default=True)
    devices = [
        Device.objects.create(
            pool=pool, name=f"d{i}", driver="fake", max_concurrent_jobs=2, config={"script": ["completed"]}
        )
        for i in range(3)
    ]
    offline = Device.objects.create(pool=pool, name="off", driver="fake", online=False, max_concurrent_jobs=5)
    sessions = [
        session_services.admit(user=user, resource_class=klass, slots=slots).session
        for user, slots in ((owner, 1), (member, 3), (owner, 2))
    ]
    for i in range(60):
        services.submit_job(user=sessions[i % 3].user, session_id=sessions[i % 3].pk, payload={"i": i}, shots=1)

    submissions: list[int] = []
    overfills: list[str] = []
    guard = threading.Lock()
    original_submit = FakeDriver.submit

    def recording_submit(self, device, job):
        # Observed at the moment the driver is called: the claim is committed, so the count
        # of running jobs on the device includes this one and must be within its capacity.
        running = Job.objects.filter(device=device, status=JobStatus.RUNNING).count()
        with guard:
            submissions.append(job.pk)
            if running > device.max_concurrent_jobs:
                overfills.append(f"{device.name}: {running}")
        return original_submit(self, device, job)

    monkeypatch.setattr(FakeDriver, "submit", recording_submit)

    def worker(_):
        try:
            for _ in range(60):
                passes.run_pool(pool.pk)
                # Every running job due for a poll at once: a bulk UPDATE racing the other
                # threads' passes, which PostgreSQL may pick as a deadlock victim (as it may pick a
                # pass, which run_pool absorbs): run again then, as the services do.
                retry_aborted(lambda: Job.objects.filter(status=JobStatus.RUNNING).update(next_poll_at=None))
                if not Job.objects.filter(status__in=[JobStatus.PENDING, JobStatus.RUNNING]).exists():
                    break
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=4) as executor:
        list(executor.map(worker, range(4)))

    assert Job.objects.filter(status=JobStatus.COMPLETED).count() == 60
    assert len(submissions) == len(set(submissions)) == 60  # each job handed to a driver once
    assert overfills == []
    assert not Job.objects.filter(device=offline).exists()
    assert {j.device_id for j in Job.objects.all()} <= {d.pk for d in devices}
    if strategy == "usage_fair":  # R-SCHED-6: each job's device time charged to its user once
        assert sum(FairShare.objects.filter(pool=pool).values_list("usage", flat=True)) == pytest.approx(60.0, rel=1e-3)
        assert Job.objects.filter(charged=True).count() == 60
