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


# -- Pasqal Cloud: one double of its API served two ways (test_pasqal_cloud.py says which) -------
@pytest.fixture(params=["loopback", "sdk-mock-server"])
def cloud(request, monkeypatch):
    """The cloud double (``tests/doubles``), its credentials in the environment. A module that
    needs one way only narrows it: ``parametrize("cloud", ["loopback"], indirect=True)``."""
    from tests.doubles.pasqal_cloud_mock import SdkMockCloud
    from tests.doubles.pasqal_cloud_server import CloudDouble

    double = {"loopback": CloudDouble, "sdk-mock-server": SdkMockCloud}[request.param]().start()
    monkeypatch.setenv("GRIDGATE_CRED_CLOUD_USER", double.username)
    monkeypatch.setenv("GRIDGATE_CRED_CLOUD_PASSWORD", double.password)
    yield double
    double.stop()


@pytest.fixture
def streaming_device(qpu_pool, cloud):
    """A pasqal_cloud device that streams a session's jobs into one open batch."""
    from apps.scheduling import device_status
    from apps.scheduling.models import Device

    config = cloud.config(open_batches=True)
    device = Device.objects.create(pool=qpu_pool, name="fresnel-open", driver="pasqal_cloud", config=config)
    assert device_status.check_device(device) == "up"
    return device
