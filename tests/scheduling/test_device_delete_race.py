"""Deleting a device while the dispatcher hands it a job: one of them wins, cleanly (the deletion is
refused, or the dispatcher finds the device gone), never an IntegrityError."""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from apps.core.exceptions import Conflict
from apps.resources.models import ResourceClass, ResourcePool
from apps.scheduling import passes, services
from apps.scheduling.models import Device, JobStatus
from apps.sessions import services as session_services

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_a_device_deleted_while_the_dispatcher_hands_it_a_job_never_fails_either(owner, monkeypatch):
    pool = ResourcePool.objects.create(name="qpu", kind="local", public=True)
    klass = ResourceClass.objects.create(pool=pool, name="c", cpu=1, memory=1, default=True)
    device = Device.objects.create(pool=pool, name="d", driver="fake", online=False, config={"script": ["running"]})
    session = session_services.admit(user=owner, resource_class=klass, slots=1).session
    job = services.submit_job(user=owner, session_id=session.pk, payload={}, shots=1)
    Device.objects.filter(pk=device.pk).update(online=True)  # free now, no wake: the dispatch below is the test's

    inside, dispatched = threading.Event(), threading.Event()
    original_delete = Device.delete

    def delete(self, *args, **kwargs):  # checked "not busy"; the dispatcher runs before the DELETE
        inside.set()
        dispatched.wait(timeout=5)  # where a lock holds the dispatcher back, go on after the timeout
        return original_delete(self, *args, **kwargs)

    monkeypatch.setattr(Device, "delete", delete)

    def deleting():
        try:
            services.delete_device(Device.objects.get(pk=device.pk))
            return None
        except Exception as exc:  # noqa: BLE001 - the outcome under test
            return exc
        finally:
            connection.close()

    def dispatching():
        try:
            assert inside.wait(timeout=30)
            passes.dispatch_once(pool.pk)
            return None
        except Exception as exc:  # noqa: BLE001
            return exc
        finally:
            dispatched.set()
            connection.close()

    with ThreadPoolExecutor(max_workers=2) as executor:
        deleted, dispatch = executor.submit(deleting), executor.submit(dispatching)
        deleted, dispatch = deleted.result(), dispatch.result()

    assert dispatch is None
    assert deleted is None or isinstance(deleted, Conflict), repr(deleted)
    job.refresh_from_db()
    if deleted is None:  # the deletion won: the job waits for another device
        assert not Device.objects.filter(pk=device.pk).exists()
        assert (job.status, job.device_id) == (JobStatus.PENDING, None)
    else:  # the dispatcher won: the job runs there and the device stays
        assert job.device_id == device.pk
