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
