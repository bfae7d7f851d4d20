"""R-ALLOC-1 under real concurrency (PostgreSQL, threads): four workers dispatch, poll and record
at once; every job is charged exactly once and the allocations' spending equals the ledger."""

from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection
from django.db.models import Sum

from apps.allocations.models import Allocation, Charge
from apps.core.retry import retry_aborted
from apps.scheduling import passes, services
from apps.scheduling.models import Device, Job, JobStatus
from tests.allocations.conftest import DEVICE_TIME

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def workers(pool, n=4, rounds=60):
    def worker(_):
        try:
            for _ in range(rounds):
                passes.run_pool(pool.pk)
                retry_aborted(lambda: Job.objects.filter(status=JobStatus.RUNNING).update(next_poll_at=None))
                if not Job.objects.filter(status=JobStatus.RUNNING).exists() and not _dispatchable(pool):
                    break
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=n) as executor:
        list(executor.map(worker, range(n)))


def _dispatchable(pool):
    return Job.objects.filter(pool=pool, status=JobStatus.PENDING, session__allocation__device_seconds__gt=0).exists()


def test_each_job_is_charged_once_under_four_concurrent_workers(qpu, owner, member, team, grant, open_session):
    Device.objects.filter(pool=qpu).update(max_concurrent_jobs=2)
    for i in range(2):
        Device.objects.create(
            pool=qpu,
            name=f"more{i}",
            driver="fake",
            max_concurrent_jobs=2,
            config={"script": ["completed"], "runtime_seconds": DEVICE_TIME},
        )
    mine = grant(qpu, user=owner, device_seconds=10**9)
    theirs = grant(qpu, group=team, device_seconds=10**9)
    sessions = [open_session(qpu, owner), open_session(qpu, member)]
    for i in range(40):
        session = sessions[i % 2]
        services.submit_job(user=session.user, session_id=session.pk, payload={"i": i}, shots=1)

    workers(qpu)

    assert Job.objects.filter(status=JobStatus.COMPLETED).count() == 40
    assert Charge.objects.count() == 40
    assert Charge.objects.values("job").distinct().count() == 40
    measured = Job.objects.aggregate(s=Sum("runtime_seconds"))["s"]
    assert Charge.objects.aggregate(s=Sum("device_seconds"))["s"] == measured
    for allocation in (mine, theirs):
        allocation.refresh_from_db()
        ledger = Charge.objects.filter(allocation=allocation).aggregate(s=Sum("device_seconds"))["s"]
        assert allocation.used_device_seconds == ledger == 20 * DEVICE_TIME


def test_a_project_at_its_limit_overdraws_by_at_most_one_job_under_concurrent_workers(
    qpu, owner, member, team, grant, open_session
):
    mine = grant(qpu, user=owner, device_seconds=60)
    grant(qpu, group=team, device_seconds=10**9)
    sessions = [open_session(qpu, owner), open_session(qpu, member)]
    for i in range(12):
        session = sessions[i % 2]
        services.submit_job(user=session.user, session_id=session.pk, payload={"i": i}, shots=1)

    workers(qpu)

    mine = Allocation.objects.get(pk=mine.pk)
    assert mine.used_device_seconds == DEVICE_TIME  # 60 s left, one 120 s job ran: no more
    assert Job.objects.filter(user=owner, status=JobStatus.PENDING).count() == 5
    assert Job.objects.filter(user=member, status=JobStatus.COMPLETED).count() == 6
