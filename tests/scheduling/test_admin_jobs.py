"""The admin's job list tells operators why a job waits, in constant queries."""

import json
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from apps.scheduling import services
from apps.scheduling.admin import FairShareAdmin, JobAdmin
from apps.scheduling.models import Device, FairShare, Job, JobStatus
from apps.scheduling.services import submit_job
from apps.sessions.admin import SessionAdmin
from apps.sessions.models import Session
from tests import factories
from tests.admin_forms import change_form_data

pytestmark = pytest.mark.django_db

EXAMPLE = json.loads((Path(settings.BASE_DIR) / "examples" / "bell-like-analog.json").read_text())


def _changelist(admin_client) -> tuple[str, int]:
    with CaptureQueriesContext(connection) as ctx:
        response = admin_client.get(reverse("admin:scheduling_job_changelist"))
    assert response.status_code == 200
    return response.content.decode(), len(ctx.captured_queries)


def test_admin_job_list_shows_why_a_pending_job_waits(admin_client, owner, qpu_pool, parked_device, open_session):
    session = open_session(qpu_pool, owner)
    submit_job(user=owner, session_id=session.pk, payload=EXAMPLE["payload"], shots=10)
    page, _ = _changelist(admin_client)
    assert "Waiting because" in page
    assert 'class="field-waiting_because">no device online (#1)<' in page  # its one device is offline


def test_admin_job_list_queries_do_not_grow_with_jobs(
    admin_client, owner, member, qpu_pool, parked_device, open_session
):
    session = open_session(qpu_pool, owner)
    submit_job(user=owner, session_id=session.pk, payload=EXAMPLE["payload"], shots=10)
    _, few = _changelist(admin_client)
    other = open_session(qpu_pool, member)
    for target in (session, other) * 5:
        submit_job(user=target.user, session_id=target.pk, payload=EXAMPLE["payload"], shots=10)
    _, many = _changelist(admin_client)
    assert many <= few + 1  # +1: a second session's row in the ranking query at most


def test_driver_run_admin_shows_which_worker_ran_an_emulation_and_how_often(admin_client, qpu_pool):
    """An operator sees a re-run emulation's attempts and its last worker."""
    from apps.scheduling.models import Device, DriverRun

    device = Device.objects.create(pool=qpu_pool, name="emu", driver="emulator")
    DriverRun.objects.create(
        remote_id="emu-7", device=device, payload={}, shots=1, status="running", attempts=2, worker="host-b:4242"
    )
    page = admin_client.get(reverse("admin:scheduling_driverrun_changelist") + "?q=host-b").content.decode()
    assert "emu-7" in page and "host-b:4242" in page
    assert admin_client.get(reverse("admin:scheduling_driverrun_change", args=["emu-7"])).status_code == 200
    assert admin_client.get(reverse("admin:scheduling_driverrun_add")).status_code == 403


def test_a_running_job_is_not_deleted_by_the_admin(admin_client, owner, qpu_pool, fake_device, open_session):
    """A running job's row is how the worker polls, stops and charges its run on the device:
    deleting it would leave the run going there, never charged, and the device's capacity count
    would drop while it is still busy. Operators cancel it; finished jobs may go."""
    from apps.scheduling.models import Job, JobStatus

    session = open_session(qpu_pool, owner)
    job = submit_job(user=owner, session_id=session.pk, payload=EXAMPLE["payload"], shots=10)
    Job.objects.filter(pk=job.pk).update(status=JobStatus.RUNNING, device=fake_device, remote_id="fake-1")
    admin_client.post(reverse("admin:scheduling_job_delete", args=[job.pk]), {"post": "yes"})
    admin_client.post(
        reverse("admin:scheduling_job_changelist"),
        {"action": "delete_selected", "_selected_action": [str(job.pk)], "post": "yes"},
    )
    assert Job.objects.filter(pk=job.pk, status=JobStatus.RUNNING).exists()
    Job.objects.filter(pk=job.pk).update(status=JobStatus.COMPLETED)
    admin_client.post(reverse("admin:scheduling_job_delete", args=[job.pk]), {"post": "yes"})
    assert not Job.objects.filter(pk=job.pk).exists()


def test_the_pool_pages_devices_inline_deletes_no_device_in_use(admin_client, owner, qpu_pool, open_session):
    """The pool page's devices inline is a delete path too: a device running a job stays (its
    deletion would null a running job's device: the database refuses, a 500), and so does a
    device a pending job asked for (the job would go to any device)."""
    from apps.scheduling.models import Device, Job, JobStatus

    busy = Device.objects.create(pool=qpu_pool, name="busy", driver="fake")
    asked = Device.objects.create(pool=qpu_pool, name="asked", driver="fake", online=False)
    Device.objects.create(pool=qpu_pool, name="idle", driver="fake", online=False)
    session = open_session(qpu_pool, owner)
    running = submit_job(user=owner, session_id=session.pk, payload={"x": 1}, shots=1)
    Job.objects.filter(pk=running.pk).update(status=JobStatus.RUNNING, device=busy, remote_id="fake-1")
    waiting = submit_job(user=owner, session_id=session.pk, payload={"x": 1}, shots=1, device_id=asked.pk)
    url = reverse("admin:resources_resourcepool_change", args=[qpu_pool.pk])
    data = change_form_data(admin_client.get(url))
    for i in range(int(data["devices-TOTAL_FORMS"])):
        data[f"devices-{i}-DELETE"] = "on"
    response = admin_client.post(url, data)
    assert response.status_code == 200 and "Not deleted" in response.content.decode()
    data = {key: value for key, value in data.items() if not key.endswith("-DELETE")}
    data["devices-2-DELETE"] = "on"  # the idle one alone: deleted
    assert admin_client.post(url, data).status_code == 302
    assert set(Device.objects.values_list("name", flat=True)) == {"busy", "asked"}
    assert Job.objects.get(pk=waiting.pk).target_device_id == asked.pk


def test_bringing_a_device_online_on_its_page_wakes_the_dispatcher(admin_client, qpu_pool, parked_device, monkeypatch):
    """R-SCHED-5: "device back online" dispatches, from the device page as from the API and the
    list's bulk action (services.set_device_online)."""
    woken = []
    monkeypatch.setattr(services, "wake_pool", woken.append)
    url = reverse("admin:scheduling_device_change", args=[parked_device.pk])
    data = change_form_data(admin_client.get(url)) | {"online": "on"}
    response = admin_client.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert Device.objects.get(pk=parked_device.pk).online
    assert woken == [qpu_pool.pk]


def meanwhile(monkeypatch, admin_class, write):
    """Run ``write`` (a worker's commit) between the admin's read of the object and its save."""
    original = admin_class.save_form

    def save_form(self, request, form, change):
        obj = original(self, request, form, change)
        write(obj)
        return obj

    monkeypatch.setattr(admin_class, "save_form", save_form)


def test_saving_a_jobs_page_never_undoes_its_end(admin_client, qpu_pool, fake_device, owner, monkeypatch):
    now = timezone.now()
    job = Job.objects.create(
        session=factories.session(qpu_pool, owner),
        pool=qpu_pool,
        user=owner,
        payload={},
        shots=1,
        status=JobStatus.RUNNING,
        device=fake_device,
        created_at=now,
        started_at=now,
    )
    meanwhile(
        monkeypatch,
        JobAdmin,
        lambda obj: Job.objects.filter(pk=obj.pk).update(status=JobStatus.COMPLETED, finished_at=timezone.now()),
    )
    response = admin_client.post(reverse("admin:scheduling_job_change", args=[job.pk]), {})
    assert response.status_code == 302
    assert Job.objects.get(pk=job.pk).status == JobStatus.COMPLETED


def test_saving_a_sessions_page_never_undoes_its_scheduler_state(admin_client, qpu_pool, owner, monkeypatch):
    session = factories.session(qpu_pool, owner)
    later = timezone.now() + timedelta(hours=5)
    meanwhile(
        monkeypatch,
        SessionAdmin,
        lambda obj: Session.objects.filter(pk=obj.pk).update(vruntime=42.0, idle_expires_at=later),
    )
    response = admin_client.post(reverse("admin:compute_sessions_session_change", args=[session.pk]), {})
    assert response.status_code == 302
    session.refresh_from_db()
    assert (session.vruntime, session.idle_expires_at) == (42.0, later)


def test_changing_a_weight_never_undoes_the_usage_charged_meanwhile(admin_client, qpu_pool, owner, monkeypatch):
    share = FairShare.objects.create(pool=qpu_pool, user=owner, weight=1.0, usage=10.0, usage_at=time.time())
    original = FairShareAdmin.save_form

    def save_form(self, request, form, change):  # a job of this user is charged between read and save
        obj = original(self, request, form, change)
        FairShare.objects.filter(pk=obj.pk).update(usage=500.0, vtime=7.0)
        return obj

    monkeypatch.setattr(FairShareAdmin, "save_form", save_form)
    response = admin_client.post(
        reverse("admin:scheduling_fairshare_changelist"),
        {
            "form-TOTAL_FORMS": "1",
            "form-INITIAL_FORMS": "1",
            "form-0-id": str(share.pk),
            "form-0-weight": "3",
            "_save": "Save",
        },
    )
    assert response.status_code == 302
    share.refresh_from_db()
    assert (share.weight, share.usage, share.vtime) == (3.0, 500.0, 7.0)


@pytest.mark.parametrize("action", ["bring_online", "take_offline", "check_provider_status"])
def test_device_bulk_actions_are_refused_to_staff_who_may_only_view_devices(
    client, qpu_pool, fake_device, parked_device, monkeypatch, action
):
    """Turning devices on or off (or asking their provider) changes them: the list's bulk actions
    need ``change_device``, like the device page, not just the permission to read the list."""
    from django.contrib.auth.models import Permission

    queued = []
    monkeypatch.setattr("apps.scheduling.admin.enqueue", lambda *args: queued.append(args))
    monkeypatch.setattr("apps.scheduling.device_status.PROVIDER_DRIVERS", {"fake"})
    viewer = factories.user("device-viewer", is_staff=True)
    viewer.user_permissions.set(Permission.objects.filter(codename="view_device"))
    client.force_login(viewer)
    assert client.get(reverse("admin:scheduling_device_changelist")).status_code == 200
    selected = [str(fake_device.pk), str(parked_device.pk)]
    client.post(reverse("admin:scheduling_device_changelist"), {"action": action, "_selected_action": selected})
    assert dict(Device.objects.values_list("name", "online")) == {"fake1": True, "parked": False}
    assert queued == []
