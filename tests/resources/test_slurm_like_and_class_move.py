"""R-POOL-4/5/6 for both Slurm-like kinds (slurm and firecrest alike), the whole-CPU rounding of
legacy rows, and a class that never moves to another pool."""

from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError

from apps.resources.launch import launch_spec
from apps.resources.models import ResourceClass, ResourcePool
from apps.sessions import services as session_services
from tests.conftest import FIRECREST_REMOTE

pytestmark = pytest.mark.django_db

SLURM_REMOTE = {"partition": "normal"}


def slurm_pool(**fields):
    pool = ResourcePool.objects.create(name="cluster", kind="slurm", public=True, remote=SLURM_REMOTE, **fields)
    ResourceClass.objects.create(pool=pool, name="node", cpu=4, memory=8, default=True)
    return pool


@pytest.mark.parametrize("kind", ["slurm", "firecrest"])
def test_fractional_cpu_is_refused_in_every_slurm_like_pool(kind):
    remote = SLURM_REMOTE if kind == "slurm" else dict(FIRECREST_REMOTE, partition="normal")
    pool = ResourcePool.objects.create(name="hpc", kind=kind, public=True, remote=remote)
    with pytest.raises(ValidationError) as refused:
        ResourceClass(pool=pool, name="half", cpu=Decimal("1.5"), memory=1, default=True).full_clean()
    assert "whole number of CPUs" in " ".join(refused.value.message_dict["cpu"])


@pytest.mark.parametrize("kind", ["slurm", "firecrest"])
def test_converting_to_a_slurm_like_kind_refuses_fractional_classes(kind):
    pool = ResourcePool.objects.create(name="lab", kind="local", public=True)
    ResourceClass.objects.create(pool=pool, name="half", cpu="0.5", memory=1, default=True)
    pool = ResourcePool.objects.get(pk=pool.pk)
    pool.kind = kind
    pool.remote = SLURM_REMOTE if kind == "slurm" else dict(FIRECREST_REMOTE)
    with pytest.raises(ValidationError) as refused:
        pool.full_clean()
    assert "half (cpu 0.5)" in " ".join(refused.value.message_dict["kind"])


@pytest.mark.parametrize("override", [{"forward_resource_values": True}, {"partition": "debug"}])
def test_leaving_a_slurm_like_kind_refuses_any_class_override(override):
    """Not only ``partition``: every class override is Slurm-like-only (R-POOL-5/6)."""
    pool = slurm_pool()
    node = pool.classes.get()
    node.remote = override
    node.save()
    pool = ResourcePool.objects.get(pk=pool.pk)
    pool.kind, pool.remote = "local", {}
    with pytest.raises(ValidationError) as refused:
        pool.full_clean()
    assert "node" in " ".join(refused.value.message_dict["kind"])


@pytest.mark.parametrize("kind", ["slurm", "firecrest"])
def test_legacy_fractional_cpu_is_rounded_up_in_cpus_per_task(kind):
    """Never under-provision: 1.5 CPUs become --cpus-per-task=2 (ceil), not 1 (int)."""
    remote = SLURM_REMOTE if kind == "slurm" else dict(FIRECREST_REMOTE, partition="normal")
    pool = ResourcePool.objects.create(name="hpc", kind=kind, public=True, remote=remote)
    klass = ResourceClass.objects.create(
        pool=pool, name="node", cpu=2, memory=4, default=True, remote={"forward_resource_values": True}
    )
    ResourceClass.objects.filter(pk=klass.pk).update(cpu=Decimal("1.5"))  # a row from before R-POOL-4
    spec = launch_spec(ResourceClass.objects.select_related("pool").get(pk=klass.pk))
    assert "--cpus-per-task=2" in spec["batch_directives"]
    assert spec["resources"]["cpu"] == 2


def test_a_class_cannot_move_to_another_pool():
    first = ResourcePool.objects.create(name="first", kind="local", public=True)
    klass = ResourceClass.objects.create(pool=first, name="only", cpu=1, memory=1, default=True)
    second = ResourcePool.objects.create(name="second", kind="local", public=True)
    ResourceClass.objects.create(pool=second, name="default", cpu=1, memory=1, default=True)
    klass = ResourceClass.objects.get(pk=klass.pk)
    klass.pool = second
    with pytest.raises(ValidationError) as refused:
        klass.full_clean()
    assert "pool" in refused.value.message_dict


def test_class_admin_shows_the_pool_read_only_and_keeps_the_class_in_place(admin_client, owner):
    first = ResourcePool.objects.create(name="first", kind="local", public=True)
    klass = ResourceClass.objects.create(pool=first, name="only", cpu=1, memory=1, default=True)
    second = ResourcePool.objects.create(name="second", kind="local", public=True)
    other_default = ResourceClass.objects.create(pool=second, name="default", cpu=1, memory=1, default=True)
    session = session_services.admit(user=owner, resource_class=klass).session
    url = f"/admin/resources/resourceclass/{klass.pk}/change/"
    page = admin_client.get(url)
    assert page.status_code == 200 and 'name="pool"' not in page.content.decode()
    form = {
        "name": "only",
        "pool": second.pk,  # ignored: read-only
        "cpu": "1",
        "memory": "1",
        "gpu": "0",
        "max_storage": "",
        "default_storage": "",
        "default": "on",
        "remote": "null",
    }
    admin_client.post(url, form)
    klass.refresh_from_db(), other_default.refresh_from_db(), session.refresh_from_db()
    assert klass.pool_id == first.pk
    assert other_default.default  # the other pool's default was not demoted
    assert session.pool_id == klass.pool_id
