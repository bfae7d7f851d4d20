import pytest
from django.utils import timezone

from tests import factories


@pytest.fixture
def qpu_pool(db, owner, member):
    return factories.pool("qpu", slots_total=100, strategy="weighted_fair")


@pytest.fixture
def fake_device(qpu_pool):
    return factories.device(qpu_pool, "fake1", config={"script": ["running", "completed"]})


@pytest.fixture
def parked_device(qpu_pool):
    """An offline device: the pool can run jobs (R-DEV-1 refuses jobs on a pool without any
    device), but nothing is dispatched until a test brings a device online."""
    return factories.device(qpu_pool, "parked", online=False)


def complete(job, runtime=1.0):
    """Finish a dispatched job as a device would (frees the device)."""
    from apps.scheduling.drivers import DriverState
    from apps.scheduling.passes import _finish

    job.refresh_from_db()
    assert _finish(
        job, DriverState("completed", result={"counts": {}}, runtime_seconds=runtime), expect_remote_id=job.remote_id
    )


def now():
    return timezone.now()
