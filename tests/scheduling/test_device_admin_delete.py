"""The device admin's delete paths (its page's Delete and the list's "delete selected") go through
``services.delete_device``, as the API does: a device that is busy, or that the dispatcher hands a
job while it is being deleted, is refused with a message, never an IntegrityError (a 500)."""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection
from django.db.models.deletion import Collector
from django.urls import reverse

from apps.scheduling import passes, services
from apps.scheduling.models import Device, JobStatus
from tests import factories
from tests.admin_forms import change_form_data


def _delete_on_page(client, device):
    return client.post(reverse("admin:scheduling_device_delete", args=[device.pk]), {"post": "yes"}, follow=True)


def _delete_selected(client, device):
    return client.post(
        reverse("admin:scheduling_device_changelist"),
        {"action": "delete_selected", "_selected_action": [str(device.pk)], "post": "yes"},
        follow=True,
    )


def _delete_in_pool_page(client, device):
    url = reverse("admin:resources_resourcepool_change", args=[device.pool_id])
    data = change_form_data(client.get(url))
    (form,) = [key[: -len("-id")] for key, value in data.items() if key.startswith("devices-") and key.endswith("-id")]
    return client.post(url, {**data, f"{form}-DELETE": "on"}, follow=True)


def _messages(response) -> str:
    return " ".join(str(m) for m in response.context["messages"])


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "delete", [_delete_on_page, _delete_selected, _delete_in_pool_page], ids=["page", "delete_selected", "pool_inline"]
)
def test_a_device_deleted_in_the_admin_while_the_dispatcher_hands_it_a_job_never_answers_500(
    admin_client, owner, monkeypatch, delete
):
    pool = factories.pool("qpu")
    device = factories.device(pool, "d", online=False, config={"script": ["running"]})
    session = factories.session(pool, owner)
    job = services.submit_job(user=owner, session_id=session.pk, payload={}, shots=1)
    Device.objects.filter(pk=device.pk).update(online=True)  # free now, no wake: the dispatch below is the test's

    inside, dispatched = threading.Event(), threading.Event()
    original_delete = Collector.delete

    def delete_rows(self):  # checked "not busy" and collected; the dispatcher runs before the DELETE
        inside.set()
        dispatched.wait(timeout=5)  # where a lock holds the dispatcher back, go on after the timeout
        return original_delete(self)

    # Every delete path (a model's delete(), a queryset's) deletes through a Collector.
    monkeypatch.setattr(Collector, "delete", delete_rows)

    def deleting():
        try:
            return delete(admin_client, device)
        finally:
            connection.close()

    def dispatching():
        try:
            assert inside.wait(timeout=30)
            return passes.dispatch_once(pool.pk)
        finally:
            dispatched.set()
            connection.close()

    with ThreadPoolExecutor(max_workers=2) as executor:
        answered, dispatch = executor.submit(deleting), executor.submit(dispatching)
        response, _ = answered.result(), dispatch.result()

    assert response.status_code == 200  # after the redirect: no 500, no IntegrityError raised
    job.refresh_from_db()
    if Device.objects.filter(pk=device.pk).exists():  # the dispatcher won: refused, and said so
        assert job.device_id == device.pk
        assert "Not deleted" in _messages(response)
    else:  # the deletion won: the job waits for another device
        assert (job.status, job.device_id) == (JobStatus.PENDING, None)
        assert "Not deleted" not in _messages(response)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "delete", [_delete_on_page, _delete_selected, _delete_in_pool_page], ids=["page", "delete_selected", "pool_inline"]
)
def test_a_device_that_becomes_busy_before_the_admin_deletes_it_is_kept_with_a_message(
    admin_client, owner, monkeypatch, delete
):
    """The page offered Delete (the device was idle); the dispatcher hands it a job before the
    service takes its lock: the service refuses, the operator reads why, and no deletion is
    logged."""
    from django.contrib.admin.models import DELETION, LogEntry

    pool = factories.pool("qpu")
    device = factories.device(pool, "d", online=False, config={"script": ["running"]})
    session = factories.session(pool, owner)
    job = services.submit_job(user=owner, session_id=session.pk, payload={}, shots=1)
    Device.objects.filter(pk=device.pk).update(online=True)
    original = services.delete_device

    def dispatch():
        try:
            return passes.dispatch_once(pool.pk)
        finally:
            connection.close()

    def dispatched_first(device):  # the dispatcher's own transaction commits before the lock
        with ThreadPoolExecutor(max_workers=1) as executor:
            assert executor.submit(dispatch).result() is not None
        return original(device)

    monkeypatch.setattr(services, "delete_device", dispatched_first)
    response = delete(admin_client, device)
    assert response.status_code == 200
    assert "Not deleted" in _messages(response) and "d" in _messages(response)
    assert "Successfully deleted" not in _messages(response) and "was deleted" not in _messages(response)
    job.refresh_from_db()
    assert Device.objects.filter(pk=device.pk).exists() and job.device_id == device.pk
    assert not LogEntry.objects.filter(action_flag=DELETION).exists()


@pytest.mark.django_db
def test_a_device_that_ran_jobs_and_a_pool_that_queued_them_are_deleted_in_the_admin_as_in_the_api(
    admin_client, api, staff, owner
):
    """What the system keeps of a device and a pool (a device's driver runs, a pool's queue row,
    the calendar's windows) goes with them, as ``DELETE /api/v1/…`` takes it. The admin asked for
    a permission to delete those rows, which their read-only pages deny everyone: a superuser could
    not delete a device that ever ran a job, nor a pool that ever queued one (403)."""
    from datetime import timedelta

    from django.utils import timezone

    from apps.reservations.models import Reservation
    from apps.resources.models import ResourcePool
    from apps.scheduling.models import DriverRun, PoolQueue
    from apps.sessions import services as sessions

    start = timezone.now() + timedelta(days=1)
    window = {"kind": "maintenance", "start": start, "end": start + timedelta(hours=1), "slots": 0}

    def ran_a_job(pool):
        device = factories.device(pool, f"fake{pool.pk}", config={"script": ["completed"], "runtime_seconds": 0})
        session = factories.session(pool, owner)
        services.submit_job(user=owner, session_id=session.pk, payload={}, shots=1)
        passes.run_pool(pool.pk)
        sessions.revoke(session_ids=[session.pk])
        device.jobs.update(status=JobStatus.COMPLETED)
        Reservation.objects.create(pool=pool, device=device, **window)
        assert DriverRun.objects.filter(device=device).exists()
        return device

    qpu = factories.pool("qpu", slots_total=4, strategy="fifo")
    for delete in (_delete_on_page, _delete_selected):
        device = ran_a_job(qpu)
        delete(admin_client, device)
        assert not Device.objects.filter(pk=device.pk).exists(), delete.__name__

    for name in ("emptied", "emptied-too"):  # its sessions' history would keep it (PROTECT), here and in the API
        pool = factories.pool(name, slots_total=4)
        PoolQueue.objects.get_or_create(pool=pool)
        Reservation.objects.create(pool=pool, **window)
    emptied = ResourcePool.objects.get(name="emptied")
    response = admin_client.post(reverse("admin:resources_resourcepool_delete", args=[emptied.pk]), {"post": "yes"})
    assert response.status_code == 302
    assert not ResourcePool.objects.filter(pk=emptied.pk).exists()
    assert (
        api(staff).delete(f"/api/v1/resource-pools/{ResourcePool.objects.get(name='emptied-too').pk}/").status_code
        == 204
    )
