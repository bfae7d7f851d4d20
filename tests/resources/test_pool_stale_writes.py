"""A pool's PATCH and its admin page write only what they change: a column another request or a
worker wrote since they read the pool (the accessibility a load sensor PUT, another operator's
edit) is never written back with the value they read."""

import pytest
from django.urls import reverse

from apps.resources.api.views import ResourcePoolViewSet
from apps.resources.models import ResourcePool
from apps.scheduling.admin import PoolAdmin
from tests.admin_forms import change_form_data

pytestmark = pytest.mark.django_db


def meanwhile_in_api(monkeypatch, write):
    """Run ``write`` (another request's commit) after the PATCH read and checked the pool, before
    it saves."""
    original = ResourcePoolViewSet.perform_update

    def perform_update(self, serializer):
        write(serializer.instance)
        return original(self, serializer)

    monkeypatch.setattr(ResourcePoolViewSet, "perform_update", perform_update)


def test_a_patch_never_writes_back_the_accessibility_a_sensor_changed_meanwhile(api, staff, local_pool, monkeypatch):
    meanwhile_in_api(
        monkeypatch,
        lambda pool: ResourcePool.objects.filter(pk=pool.pk).update(is_accessible=False, accessibility_message="down"),
    )
    response = api(staff).patch(f"/api/v1/resource-pools/{local_pool.pk}/", {"idle_timeout": 600}, format="json")
    assert response.status_code == 200, response.content
    local_pool.refresh_from_db()
    assert (local_pool.idle_timeout, local_pool.is_accessible, local_pool.accessibility_message) == (
        600,
        False,
        "down",
    )
    assert response.json()["is_accessible"] is False  # the answer is the pool as stored


def test_a_patch_never_writes_back_a_column_changed_while_it_runs(api, staff, local_pool, monkeypatch):
    """A sensor's PUT that commits after the PATCH read the pool again, while its checks run."""
    full_clean = ResourcePool.full_clean

    def checked(pool, *args, **kwargs):
        ResourcePool.objects.filter(pk=pool.pk).update(is_accessible=False, accessibility_message="down")
        return full_clean(pool, *args, **kwargs)

    monkeypatch.setattr(ResourcePool, "full_clean", checked)
    response = api(staff).patch(f"/api/v1/resource-pools/{local_pool.pk}/", {"idle_timeout": 600}, format="json")
    assert response.status_code == 200, response.content
    local_pool.refresh_from_db()
    assert (local_pool.idle_timeout, local_pool.is_accessible) == (600, False)


def test_two_operators_patching_different_fields_of_a_pool_keep_both_edits(api, staff, local_pool, monkeypatch):
    meanwhile_in_api(monkeypatch, lambda pool: ResourcePool.objects.filter(pk=pool.pk).update(slots_total=7))
    response = api(staff).patch(f"/api/v1/resource-pools/{local_pool.pk}/", {"max_lifetime": 7200}, format="json")
    assert response.status_code == 200, response.content
    local_pool.refresh_from_db()
    assert (local_pool.max_lifetime, local_pool.slots_total) == (7200, 7)


def test_saving_a_pools_page_never_writes_back_the_accessibility_changed_meanwhile(
    admin_client, local_pool, monkeypatch
):
    url = reverse("admin:resources_resourcepool_change", args=[local_pool.pk])
    data = change_form_data(admin_client.get(url)) | {"idle_timeout": "900"}
    original = PoolAdmin.save_form

    def save_form(self, request, form, change):  # a load sensor's PUT commits between read and save
        obj = original(self, request, form, change)
        ResourcePool.objects.filter(pk=obj.pk).update(is_accessible=False, accessibility_message="down")
        return obj

    monkeypatch.setattr(PoolAdmin, "save_form", save_form)
    response = admin_client.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    local_pool.refresh_from_db()
    assert (local_pool.idle_timeout, local_pool.is_accessible, local_pool.accessibility_message) == (
        900,
        False,
        "down",
    )


def test_saving_a_pools_page_writes_the_values_its_rules_completed(admin_client):
    """A quota typed with cpu and memory and no gpu: the pool's clean() completes gpu as 0. The
    page writes that too, not only the fields typed (a quota of cpu and memory with a NULL gpu
    breaks the quota's constraint: a 500)."""
    from tests import factories

    pool = factories.pool("quota-less", public=True)
    url = reverse("admin:resources_resourcepool_change", args=[pool.pk])
    data = change_form_data(admin_client.get(url)) | {"quota_cpu": "8", "quota_memory": "16", "quota_gpu": ""}
    response = admin_client.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    pool.refresh_from_db()
    assert (pool.quota_cpu, pool.quota_memory, pool.quota_gpu) == (8, 16, 0)


def test_an_edit_of_a_column_not_read_with_the_pool_is_written(local_pool):
    pool = ResourcePool.objects.only("id", "name").get(pk=local_pool.pk)
    pool.slots_total = 9
    pool.name = pool.name  # read, unchanged: not written
    assert pool.changed_columns() == ["slots_total", "updated_at"]
