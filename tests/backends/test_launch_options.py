"""R-BACK-6: what the backends declare as launch options, and class overrides pinned over any
backend default; the allow-list check itself (``validate_launch_options``) is tested without a
database in unit/test_launch_options.py."""

from pathlib import Path

import pytest

from apps.backends.base import Choice, LaunchOption, LaunchOptions
from apps.backends.slurm import SlurmBackend
from apps.cases import passes
from apps.resources.models import ResourceClass, ResourcePool
from tests.backends.unit.test_launch_options import refused

#: the issue's example: batch options that went straight into ``#SBATCH``
HOSTILE = {"partition": "gpu-premium", "time": "365-00:00:00"}


def launch_with(client, case, options):
    """The launch request of ``case`` with ``options`` (its answer)."""
    return client.post(f"/api/v1/cases/{case.id}/launch/", {"launch_options": options}, format="json")


def assert_class_partition_wins(client, make_case, rc, other: str, script: str):
    """R-BACK-6 through the API on a Slurm-like pool: the form offers only the class's partition,
    a launch with every default the form shows submits to it (the job script ``script`` says so),
    and the ``other`` partition is refused. Returns the launched case and the form."""
    pinned = rc.remote["partition"]
    body = client.get(f"/api/v1/resource-classes/{rc.id}/launch-options/").json()
    partition = next(o for o in body["options"] if o["key"] == "partition")
    assert partition["default"] == pinned and [c["value"] for c in partition["choices"]] == [pinned]
    defaults = {o["key"]: o["default"] for o in body["options"] if o["default"]}

    case = make_case(resource_class=rc, command="true")
    response = launch_with(client, case, defaults)
    assert response.status_code == 202, response.content
    passes.submit_pass(case_ids=[case.id])  # the worker's submit step (R-CASE-1)
    case.refresh_from_db()
    assert case.status == "pending", case.last_error
    text = next((Path(rc.pool.remote["working_root"]) / str(case.id)).glob(script)).read_text()
    assert [line for line in text.splitlines() if "--partition" in line] == [f"#SBATCH --partition={pinned}"]

    response = launch_with(client, make_case(resource_class=rc, command="true"), {"partition": other})
    assert response.status_code == 400 and f"one of {pinned}" in response.json()["detail"]
    return case, body


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
