"""R-BACK-6: what the backends declare as launch options, and class overrides pinned over any
backend default; the allow-list check itself (``validate_launch_options``) is tested without a
database in unit/test_launch_options.py."""

import pytest

from apps.backends.base import Choice, LaunchOption, LaunchOptions
from apps.backends.slurm import SlurmBackend
from apps.resources.models import ResourceClass, ResourcePool
from tests.backends.unit.test_launch_options import refused


@pytest.mark.django_db
def test_a_class_partition_is_pinned_over_the_provider_default():
    """R-BACK-6: the class's partition is the only choice and the default, whatever the pool or
    the provider offers (sinfo's default, FirecREST's first partition)."""
    pool = ResourcePool.objects.create(name="s", kind="slurm", remote={"partition": "debug"})
    rc = ResourceClass.objects.create(pool=pool, name="n", cpu=1, memory=1, default=True, remote={"partition": "long"})
    answer = LaunchOptions(options=[LaunchOption("partition", "Partition", [Choice("debug", "debug")], "debug")])
    pinned = SlurmBackend().pin_class_overrides(answer, rc)
    partition = pinned.options[0]
    assert (partition.default, [c.value for c in partition.choices]) == ("long", ["long"])
    assert "long" in refused({"partition": "debug"}, pinned).detail


@pytest.mark.django_db
@pytest.mark.parametrize("driver", ["runai"], indirect=True)
def test_runai_offers_the_projects_and_node_pools_its_credential_sees_and_degrades_to_the_pools(double):
    """Run:AI's options are asked of the provider (projects, their node pools), the
    pool's own values pinned; unreachable, only those remain (degraded). Whether a class declares
    a fraction of a GPU: test_runai.py's gpu_portion tests."""
    from apps.backends import runai

    remote = {"base_url": double.url, "credentials": "service"}
    pool = ResourcePool.objects.create(name="r", kind="runai", remote=remote)
    answer = runai.RunaiBackend().launch_options(pool)
    options = {o.key: [c.value for c in o.choices] for o in answer.options}
    assert not answer.degraded
    assert options["project"] == ["team-a", "team-b"] and options["node_pool"] == ["default", "a100"]
    assert "0.5" in options["gpu_portion"]
    assert "team-c" in refused({"project": "team-c"}, answer).detail
    pool.remote = {**remote, "project": "team-b", "node_pool": "default"}
    pinned = {o.key: [c.value for c in o.choices] for o in runai.RunaiBackend().launch_options(pool).options}
    assert pinned["project"] == ["team-b"] and pinned["node_pool"] == ["default"]
    double.stop()
    runai._clients.clear()
    degraded = runai.RunaiBackend().launch_options(pool)
    assert degraded.degraded and "Run:AI" in degraded.message
    assert {o.key: [c.value for c in o.choices] for o in degraded.options}["project"] == ["team-b"]
