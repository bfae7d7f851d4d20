"""R-POOL-6: kind changes convert classes, or are refused naming the classes; PATCH is atomic."""

import pytest

from apps.resources.models import ResourceClass, ResourcePool
from tests.conftest import FIRECREST_REMOTE

pytestmark = pytest.mark.django_db


@pytest.fixture
def fractional_local_pool(db):
    pool = ResourcePool.objects.create(name="lab", kind="local", public=True)
    ResourceClass.objects.create(pool=pool, name="half", cpu="0.5", memory=1, default=True)
    ResourceClass.objects.create(pool=pool, name="two", cpu=2, memory=4)
    return pool


def test_local_to_firecrest_with_fractional_cpu_is_refused_naming_the_class(api, staff, fractional_local_pool):
    response = api(staff).patch(
        f"/api/v1/resource-pools/{fractional_local_pool.pk}/",
        {"kind": "firecrest", "remote": FIRECREST_REMOTE},
        format="json",
    )
    assert response.status_code == 400
    message = " ".join(response.json()["kind"])
    assert "half (cpu 0.5)" in message and "two" not in message
    fractional_local_pool.refresh_from_db()
    assert fractional_local_pool.kind == "local" and fractional_local_pool.remote == {}


def test_model_full_clean_refuses_the_same_kind_change(fractional_local_pool):
    from django.core.exceptions import ValidationError

    pool = ResourcePool.objects.get(pk=fractional_local_pool.pk)
    pool.kind, pool.remote = "firecrest", FIRECREST_REMOTE
    with pytest.raises(ValidationError) as info:
        pool.full_clean()
    assert "half (cpu 0.5)" in info.value.message_dict["kind"][0]


def test_patch_changing_kind_and_fixing_classes_succeeds_atomically(api, staff, fractional_local_pool):
    half = fractional_local_pool.classes.get(name="half")
    response = api(staff).patch(
        f"/api/v1/resource-pools/{fractional_local_pool.pk}/",
        {
            "kind": "firecrest",
            "remote": FIRECREST_REMOTE,
            "classes": [{"id": half.pk, "cpu": 1, "remote": {"partition": "debug"}}],
        },
        format="json",
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["kind"] == "firecrest"
    assert {c["name"]: c["kind"] for c in body["classes"]} == {"half": "firecrest", "two": "firecrest"}
    half.refresh_from_db()
    assert half.cpu == 1 and half.remote == {"partition": "debug"}


def test_refused_patch_changes_nothing(api, staff, fractional_local_pool):
    two = fractional_local_pool.classes.get(name="two")
    response = api(staff).patch(
        f"/api/v1/resource-pools/{fractional_local_pool.pk}/",
        {
            "kind": "firecrest",
            "remote": FIRECREST_REMOTE,
            "accessibility_message": "moved to Alps",
            # fixes one class, renames another, but 'half' stays fractional: all refused.
            "classes": [{"id": two.pk, "name": "two-renamed"}, {"name": "new", "cpu": 4, "memory": 4}],
        },
        format="json",
    )
    assert response.status_code == 400
    assert "half" in " ".join(response.json()["kind"])
    pool = ResourcePool.objects.get(pk=fractional_local_pool.pk)
    assert (pool.kind, pool.accessibility_message) == ("local", "")
    assert sorted(pool.classes.values_list("name", flat=True)) == ["half", "two"]


def test_firecrest_to_local_with_overrides_is_refused(api, staff, firecrest_pool):
    node = firecrest_pool.classes.get()
    node.remote = {"partition": "debug"}
    node.save()
    response = api(staff).patch(
        f"/api/v1/resource-pools/{firecrest_pool.pk}/", {"kind": "local", "remote": {}}, format="json"
    )
    assert response.status_code == 400
    assert "node" in " ".join(response.json()["kind"])
    firecrest_pool.refresh_from_db()
    assert firecrest_pool.kind == "firecrest"


def test_firecrest_to_local_clearing_overrides_in_same_request(api, staff, firecrest_pool):
    node = firecrest_pool.classes.get()
    node.remote = {"partition": "debug"}
    node.save()
    response = api(staff).patch(
        f"/api/v1/resource-pools/{firecrest_pool.pk}/",
        {"kind": "local", "remote": {}, "classes": [{"id": node.pk, "remote": None}]},
        format="json",
    )
    assert response.status_code == 200, response.content
    node.refresh_from_db()
    assert node.remote is None and node.kind == "local"


def test_firecrest_to_slurm_refused_while_a_class_sets_system_name(api, staff, firecrest_pool):
    node = firecrest_pool.classes.get()
    node.remote = {"system_name": "eiger"}
    node.save()
    response = api(staff).patch(
        f"/api/v1/resource-pools/{firecrest_pool.pk}/", {"kind": "slurm", "remote": {}}, format="json"
    )
    assert response.status_code == 400
    assert "system_name" in " ".join(response.json()["kind"])


def test_inline_class_errors_are_reported_per_entry(api, staff, local_pool):
    response = api(staff).patch(
        f"/api/v1/resource-pools/{local_pool.pk}/",
        {"classes": [{"name": "neg", "cpu": -1, "memory": 1}]},
        format="json",
    )
    assert response.status_code == 400
    assert "cpu" in response.json()["classes"][0]
    assert not local_pool.classes.filter(name="neg").exists()


def test_switching_the_default_class_in_one_patch_sticks(api, staff, local_pool):
    small = local_pool.classes.get(name="small")
    big = ResourceClass.objects.create(pool=local_pool, name="big", cpu=4, memory=8)
    response = api(staff).patch(
        f"/api/v1/resource-pools/{local_pool.pk}/",
        {"classes": [{"id": big.pk, "default": True}, {"id": small.pk, "cpu": 2}]},
        format="json",
    )
    assert response.status_code == 200, response.content
    assert list(local_pool.classes.filter(default=True).values_list("name", flat=True)) == ["big"]
