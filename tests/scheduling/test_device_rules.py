"""A device's driver rules (apps.scheduling.devices) give the same fields and messages on the
admin's device page, the pool page's devices inline and the API, and bad input never a 500."""

import pytest
from django.urls import reverse

from apps.scheduling.models import Device
from tests.resources.test_admin import inline_data, pool_form

pytestmark = pytest.mark.django_db

ONE_JOB = "A pasqal_qpu device runs at most 1 job at a time: a new job would drop the running one."
QPU = '{"url": "http://qpu.example.org:8000"}'


def device_form(pool, **fields):
    return {"pool": str(pool.pk), "name": "d", "driver": "fake", "config": "{}", "max_concurrent_jobs": "1"} | fields


def test_admin_device_page_refuses_a_config_its_driver_refuses(admin_client, qpu_pool):
    data = device_form(qpu_pool, config='{"script": ["exploded"]}')
    response = admin_client.post(reverse("admin:scheduling_device_add"), data)
    assert response.status_code == 200
    assert response.context["adminform"].form.errors["config"][0].startswith("'script' must be a list of")
    assert not Device.objects.filter(name="d").exists()


def test_admin_device_page_keys_the_concurrency_cap_to_its_field(admin_client, qpu_pool):
    data = device_form(qpu_pool, driver="pasqal_qpu", config=QPU, max_concurrent_jobs="2")
    response = admin_client.post(reverse("admin:scheduling_device_add"), data)
    assert response.status_code == 200
    assert response.context["adminform"].form.errors == {"max_concurrent_jobs": [ONE_JOB]}
    response = admin_client.post(reverse("admin:scheduling_device_add"), dict(data, max_concurrent_jobs="1"))
    assert response.status_code == 302
    assert Device.objects.get(name="d").driver == "pasqal_qpu"


def test_admin_device_page_refuses_a_config_that_is_not_an_object(admin_client, qpu_pool):
    response = admin_client.post(reverse("admin:scheduling_device_add"), device_form(qpu_pool, config="[1, 2]"))
    assert response.status_code == 200
    assert response.context["adminform"].form.errors == {"config": ["Must be a JSON object."]}


def test_pool_page_devices_inline_checks_the_driver_rules(admin_client, qpu_pool):
    assert admin_client.get(reverse("admin:resources_resourcepool_change", args=[qpu_pool.pk])).status_code == 200
    data = pool_form(name=qpu_pool.name, public="on", slots_total=str(qpu_pool.slots_total))
    klass = qpu_pool.classes.get()
    data |= inline_data(
        [
            {
                "id": str(klass.pk),
                "pool": str(qpu_pool.pk),
                "name": klass.name,
                "cpu": str(klass.cpu),
                "memory": str(klass.memory),
                "gpu": str(klass.gpu),
                "max_storage": str(klass.max_storage),
                "default_storage": str(klass.default_storage),
                "max_tasks": str(klass.max_tasks),
                "wall_time": str(klass.wall_time),
                "max_wall_time": str(klass.max_wall_time),
                "default": "on",
            }
        ],
        initial=1,
    )
    qpu = {"name": "q", "driver": "pasqal_qpu", "config": QPU, "online": "on", "max_concurrent_jobs": "3"}
    response = admin_client.post(
        reverse("admin:resources_resourcepool_change", args=[qpu_pool.pk]),
        data | inline_data([qpu], prefix="devices"),
    )
    assert response.status_code == 200
    assert ONE_JOB in response.content.decode()
    assert not Device.objects.filter(name="q").exists()
    response = admin_client.post(
        reverse("admin:resources_resourcepool_change", args=[qpu_pool.pk]),
        data | inline_data([dict(qpu, max_concurrent_jobs="1")], prefix="devices"),
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    assert Device.objects.get(name="q").max_concurrent_jobs == 1


def test_api_patch_checks_the_new_driver_against_the_stored_values(api, staff, qpu_pool):
    device = Device.objects.create(pool=qpu_pool, name="d", driver="fake", max_concurrent_jobs=3)
    url = f"/api/v1/devices/{device.pk}/"
    response = api(staff).patch(url, {"driver": "pasqal_qpu", "config": {"url": "http://qpu:8000"}}, format="json")
    assert response.status_code == 400
    assert response.json()["max_concurrent_jobs"] == [ONE_JOB]
    response = api(staff).patch(url, {"driver": "pasqal_qpu"}, format="json")
    assert response.status_code == 400 and "'url' must be" in str(response.json()["config"])
    assert api(staff).patch(url, {"config": ["not", "an", "object"]}, format="json").status_code == 400
    device.refresh_from_db()
    assert device.driver == "fake"
