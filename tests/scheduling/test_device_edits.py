"""An operator's edit of a device never writes back what the worker's status pass wrote meanwhile
(provider status, message, specs, check time, and ``online`` when the edit did not touch it)."""

import pytest
from django.urls import reverse

from apps.scheduling import device_status
from apps.scheduling.admin import DeviceAdmin
from apps.scheduling.drivers import ProviderStatus
from apps.scheduling.models import Device
from tests.admin_forms import change_form_data

pytestmark = pytest.mark.django_db

SPECS = {"name": "Fresnel", "version": "2"}


@pytest.fixture
def qpu(qpu_pool):
    device = Device.objects.create(
        pool=qpu_pool, name="fresnel", driver="pasqal_qpu", config={"url": "http://qpu.invalid"}
    )
    device_status.record_status(device, ProviderStatus("up", message="ready", specs=SPECS, specs_text="{}"))
    return Device.objects.get(pk=device.pk)


def goes_down(device):
    """The worker's status pass: the provider now reports the QPU down."""
    device_status.record_status(Device.objects.get(pk=device.pk), ProviderStatus("down", message="calibrating"))


def assert_down(device):
    device.refresh_from_db()
    assert (device.online, device.provider_status, device.provider_message) == (False, "down", "calibrating")
    assert device.provider_specs == SPECS


def test_renaming_a_device_by_the_api_never_brings_a_qpu_that_went_down_back_online(qpu, api, staff, monkeypatch):
    original = Device.full_clean

    def full_clean(self, *args, **kwargs):  # the status pass commits between the PATCH's read and its save
        original(self, *args, **kwargs)
        goes_down(self)

    monkeypatch.setattr(Device, "full_clean", full_clean)
    response = api(staff).patch(f"/api/v1/devices/{qpu.pk}/", {"name": "fresnel-2"}, format="json")
    assert response.status_code == 200, response.json()
    monkeypatch.setattr(Device, "full_clean", original)
    assert_down(qpu)
    assert qpu.name == "fresnel-2"


def test_saving_a_devices_page_never_undoes_the_status_pass(qpu, admin_client, monkeypatch):
    url = reverse("admin:scheduling_device_change", args=[qpu.pk])
    data = change_form_data(admin_client.get(url)) | {"name": "fresnel-2"}
    original = DeviceAdmin.save_form

    def save_form(self, request, form, change):
        obj = original(self, request, form, change)
        goes_down(obj)
        return obj

    monkeypatch.setattr(DeviceAdmin, "save_form", save_form)
    response = admin_client.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert_down(qpu)
    assert qpu.name == "fresnel-2"


@pytest.mark.parametrize("where", ["api", "admin"])
def test_a_device_added_online_wakes_the_dispatcher_in_the_api_as_in_the_admin(
    where, qpu_pool, owner, open_session, api, staff, admin_client, monkeypatch, django_capture_on_commit_callbacks
):
    """R-SCHED-5: jobs waiting in a pool whose only device is offline start when one is added
    online, at once (a dispatcher pass is enqueued), whether it is added on the admin's page or by
    ``POST /api/v1/devices/``; the API's waited for the next sweep."""
    from apps.scheduling import services

    Device.objects.create(pool=qpu_pool, name="parked", driver="fake", online=False)
    session = open_session(qpu_pool, owner)
    services.submit_job(user=owner, session_id=session.pk, payload={}, shots=1)
    sent = []
    monkeypatch.setattr(services, "enqueue", lambda func, *args: sent.append((func, args)))
    with django_capture_on_commit_callbacks(execute=True):
        if where == "api":
            body = {"pool": qpu_pool.pk, "name": "emu", "driver": "fake", "config": {}, "online": True}
            response = api(staff).post("/api/v1/devices/", body, format="json")
            assert response.status_code == 201, response.json()
        else:
            data = {"pool": qpu_pool.pk, "name": "emu", "driver": "fake", "config": "{}", "online": "on"}
            data |= {"max_concurrent_jobs": "1", "paused_reason": ""}
            response = admin_client.post(reverse("admin:scheduling_device_add"), data)
            assert response.status_code == 302, response.content.decode()[:2000]
    assert ("apps.scheduling.tasks.run_pool", (qpu_pool.pk,)) in sent
