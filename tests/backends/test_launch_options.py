"""R-BACK-6: what the backends declare as launch options, and class overrides pinned over any
backend default; the allow-list check itself (``validate_launch_options``) is tested without a
database in unit/test_launch_options.py."""

import pytest

from apps.backends.base import Choice, LaunchOption, LaunchOptions, validate_launch_options
from apps.backends.slurm import SlurmBackend
from apps.core.exceptions import Invalid
from apps.resources.models import ResourceClass, ResourcePool


def refused(chosen, declared) -> Invalid:
    with pytest.raises(Invalid) as info:
        validate_launch_options(declared, chosen)
    return info.value


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
def test_runai_offers_the_projects_and_node_pools_its_credential_sees_and_degrades_to_the_pools(
    settings, monkeypatch, tmp_path
):
    """Run:AI's options are asked of the provider (projects, their node pools), the
    pool's own values pinned; unreachable, only those remain (degraded)."""
    from apps.backends import runai
    from tests.doubles.runai_server import RunaiDouble

    settings.GRIDGATE_ALLOW_INSECURE_REMOTES = True
    monkeypatch.setenv("GRIDGATE_CRED_RUNAI_CLIENT_ID", "svc")
    monkeypatch.setenv("GRIDGATE_CRED_RUNAI_CLIENT_SECRET", "runai-options-SECRET")
    double = RunaiDouble(client_id="svc", client_secret="runai-options-SECRET").start()
    try:
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
    finally:
        double.stop()
    runai._clients.clear()
    degraded = runai.RunaiBackend().launch_options(pool)
    assert degraded.degraded and "Run:AI" in degraded.message
    assert {o.key: [c.value for c in o.choices] for o in degraded.options}["project"] == ["team-b"]


@pytest.mark.django_db
def test_runai_declares_a_gpu_fraction_only_for_classes_with_gpus():
    from apps.backends import runai

    pool = ResourcePool.objects.create(name="r", kind="runai", remote={"base_url": "https://r.example.org"})
    gpu = ResourceClass.objects.create(pool=pool, name="g", cpu=1, memory=1, gpu=1, default=True)
    cpu = ResourceClass.objects.create(pool=pool, name="c", cpu=1, memory=1, gpu=0)
    answer = runai.RunaiBackend().launch_options(pool)  # per-user: the pool's values only
    assert "gpu_portion" in [o.key for o in runai.RunaiBackend().pin_class_overrides(answer, gpu).options]
    without = runai.RunaiBackend().pin_class_overrides(answer, cpu)
    assert "declared options: project, node_pool" in refused({"gpu_portion": "0.5"}, without).detail
