"""R-BACK-6: launch options are an allow-list, checked in one place (``validate_launch_options``)
against what the backend declares; class overrides are pinned over any backend default."""

import pytest

from apps.backends.base import Choice, LaunchOption, LaunchOptions, validate_launch_options
from apps.backends.slurm import SlurmBackend
from apps.core.exceptions import Invalid
from apps.resources.models import ResourceClass, ResourcePool

DECLARED = LaunchOptions(
    options=[
        LaunchOption("partition", "Partition", [Choice("debug", "debug"), Choice("normal", "normal")], "debug"),
        LaunchOption("time", "Time limit", [Choice("00:10:00", "10 minutes"), Choice("01:00:00", "1 hour")]),
        LaunchOption("ranks", "MPI ranks", [], None, minimum=1, maximum=64),
    ]
)


def refused(chosen, declared=DECLARED) -> Invalid:
    with pytest.raises(Invalid) as info:
        validate_launch_options(declared, chosen)
    return info.value


def test_declared_values_pass_and_ranges_come_back_as_whole_numbers():
    assert validate_launch_options(DECLARED, {"partition": "normal", "time": "00:10:00", "ranks": "8"}) == {
        "partition": "normal",
        "time": "00:10:00",
        "ranks": 8,
    }


def test_the_issue_11_example_is_refused_naming_the_allowed_values():
    error = refused({"partition": "gpu-premium", "time": "365-00:00:00"})
    assert error.status == 400
    assert "debug, normal" in error.detail and "00:10:00, 01:00:00" in error.detail
    assert set(error.extra["launch_options"]) == {"partition", "time"}


def test_an_undeclared_key_is_refused_naming_the_declared_options():
    error = refused({"qos": "high"})
    assert "partition, time, ranks" in error.extra["launch_options"]["qos"][0]


@pytest.mark.parametrize("value", [0, 65, -1, "1e3", "8.0", True, 2.5, "٣"])
def test_a_value_outside_a_declared_range_is_refused_naming_the_range(value):
    assert "from 1 to 64" in refused({"ranks": value}).detail


@pytest.mark.parametrize("value", ["debug\n", "debug\n#SBATCH --uid=0", "deb\x00ug", "debug\r", "\x1b[2J"])
def test_control_characters_are_refused_even_around_an_allowed_value(value):
    assert "control characters" in refused({"partition": value}).detail


@pytest.mark.parametrize("value", [["debug"], {"x": 1}, 3])
def test_a_value_of_the_wrong_type_is_refused(value):
    refused({"partition": value})


def test_an_empty_value_means_the_default():
    assert validate_launch_options(DECLARED, {"partition": "", "time": None}) == {}


def test_options_must_be_an_object():
    refused(["partition", "debug"])


def test_when_nothing_is_declared_nothing_is_accepted():
    """The local backend declares no options: any key is refused."""
    assert "declared options: none" in refused({"partition": "debug"}, LaunchOptions()).detail


def test_a_degraded_answer_says_only_the_defaults_are_offered():
    degraded = LaunchOptions(
        options=[LaunchOption("partition", "Partition", [Choice("debug", "debug")])], degraded=True
    )
    assert "could not be asked" in refused({"partition": "normal"}, degraded).detail


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
