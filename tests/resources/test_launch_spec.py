"""R-LAUNCH: resources, environment and batch directives computed from a class."""

from decimal import Decimal

import pytest

from apps.resources.launch import launch_spec
from apps.resources.models import ResourceClass, ResourcePool
from tests.conftest import FIRECREST_REMOTE

pytestmark = pytest.mark.django_db


def make_class(pool, **fields):
    defaults = {"name": "c", "cpu": 4, "memory": 8, "gpu": 1, "default": True}
    defaults.update(fields)
    return ResourceClass.objects.create(pool=pool, **defaults)


def test_class_override_wins_over_pool_values(firecrest_pool):
    klass = make_class(
        firecrest_pool, name="eiger", default=False, remote={"system_name": "eiger", "partition": "debug"}
    )
    env = launch_spec(klass)["environment"]
    assert env["RSC_FIRECREST_SYSTEM_NAME"] == "eiger"
    assert env["RSC_FIRECREST_PARTITION"] == "debug"
    assert env["RSC_REMOTE_KIND"] == "firecrest"
    assert env["RSC_FIRECREST_API_URL"] == FIRECREST_REMOTE["api_url"]


def test_pool_values_are_the_fallback(firecrest_pool):
    env = launch_spec(firecrest_pool.classes.get())["environment"]
    assert env["RSC_FIRECREST_SYSTEM_NAME"] == "daint"
    assert env["RSC_FIRECREST_PARTITION"] == "normal"


def test_partition_is_omitted_when_neither_sets_it(db):
    pool = ResourcePool.objects.create(name="nopart", kind="firecrest", remote=FIRECREST_REMOTE)
    spec = launch_spec(make_class(pool))
    assert "RSC_FIRECREST_PARTITION" not in spec["environment"]
    assert not any(d.startswith("--partition") for d in spec["batch_directives"])


def test_forward_flag_is_always_emitted_as_true_or_false(firecrest_pool):
    off = launch_spec(firecrest_pool.classes.get())["environment"]
    on = launch_spec(make_class(firecrest_pool, name="fw", default=False, remote={"forward_resource_values": True}))[
        "environment"
    ]
    assert off["RSC_FIRECREST_FORWARD_RESOURCE_VALUES"] == "false"
    assert on["RSC_FIRECREST_FORWARD_RESOURCE_VALUES"] == "true"


@pytest.mark.parametrize("cpu, expected", [(Decimal("0.5"), 1), (Decimal("2.0"), 2), (Decimal("2.2"), 3)])
def test_cpu_is_rounded_up_for_slurm_like_pools(firecrest_pool, cpu, expected):
    klass = firecrest_pool.classes.get()
    ResourceClass.objects.filter(pk=klass.pk).update(cpu=cpu)  # legacy row: bypasses the write rule
    klass.refresh_from_db()
    spec = launch_spec(klass)
    assert spec["resources"]["cpu"] == expected
    assert spec["environment"]["RSC_SESSION_CPU"] == str(expected)


def test_memory_in_mib_and_gpus_in_environment(firecrest_pool):
    env = launch_spec(firecrest_pool.classes.get())["environment"]
    assert env["RSC_SESSION_MEMORY"] == str(256 * 1024)
    assert env["RSC_SESSION_GPUS"] == "4"


def test_resource_directives_only_when_forwarding(db):
    pool = ResourcePool.objects.create(name="s", kind="slurm", remote={"partition": "debug", "account": "proj1"})
    whole = make_class(pool, name="whole")
    sliced = make_class(pool, name="slice", default=False, remote={"forward_resource_values": True})
    assert launch_spec(whole)["batch_directives"] == ["--partition=debug", "--account=proj1"]
    assert launch_spec(sliced)["batch_directives"] == [
        "--partition=debug",
        "--account=proj1",
        "--cpus-per-task=4",
        "--mem=8G",
        "--gpus=1",
    ]


def test_local_pool_has_no_environment_and_no_directives(local_pool):
    spec = launch_spec(local_pool.classes.get())
    assert spec == {"resources": {"cpu": 1, "memory": 2, "gpu": 0}, "environment": {}, "batch_directives": []}


def test_local_fractional_cpu_is_kept(local_pool):
    klass = make_class(local_pool, name="half", cpu=Decimal("0.5"), default=False)
    assert launch_spec(klass)["resources"]["cpu"] == 0.5


def test_runai_environment(db):
    pool = ResourcePool.objects.create(name="r", kind="runai", remote={"base_url": "https://runai.example.org"})
    env = launch_spec(make_class(pool))["environment"]
    assert env == {"RSC_REMOTE_KIND": "runai", "RSC_RUNAI_BASE_URL": "https://runai.example.org"}


def test_launch_spec_endpoint(api, member, firecrest_pool):
    klass = firecrest_pool.classes.get()
    body = api(member).get(f"/api/v1/resource-classes/{klass.pk}/launch-spec/").json()
    assert body["resources"] == {"cpu": 64, "memory": 256, "gpu": 4}
    assert body["batch_directives"] == ["--partition=normal"]
    assert body["environment"]["RSC_FIRECREST_FORWARD_RESOURCE_VALUES"] == "false"
