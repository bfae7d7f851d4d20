"""R-BACK-6: the user's launch options checked against what the backend declared
(``apps.backends.base.validate_launch_options``), without a database: case creation and launch
reach it through ``apps.cases.services`` (tested in tests/cases/ and tests/backends/)."""

import pytest

from apps.backends.base import Choice, LaunchOption, LaunchOptions, validate_launch_options
from apps.core.exceptions import Invalid


def declared(degraded=False):
    return LaunchOptions(
        options=[
            LaunchOption("partition", "Partition", [Choice("normal", "normal"), Choice("debug", "debug")], "normal"),
            LaunchOption("nodes", "Nodes", [], minimum=1, maximum=4),
        ],
        degraded=degraded,
    )


def refused(chosen, options=None) -> Invalid:
    with pytest.raises(Invalid) as caught:
        validate_launch_options(options or declared(), chosen)
    return caught.value


@pytest.mark.parametrize(
    ("chosen", "kept"),
    [
        ({"partition": "debug", "nodes": 2}, {"partition": "debug", "nodes": 2}),
        ({"nodes": "3"}, {"nodes": 3}),  # posted as digits: returned as a whole number
        ({"partition": "", "nodes": None}, {}),  # empty means the default: dropped
    ],
)
def test_declared_values_are_accepted_digits_as_whole_numbers_and_empty_ones_dropped(chosen, kept):
    assert validate_launch_options(declared(), chosen) == kept


def test_an_undeclared_key_is_refused_naming_the_declared_ones():
    error = refused({"qos": "high"})
    assert "partition, nodes" in error.extra["launch_options"]["qos"][0]


def test_a_value_outside_the_choices_is_refused_naming_the_allowed_ones():
    error = refused({"partition": "gpu"})
    assert "one of normal, debug" in error.extra["launch_options"]["partition"][0]


def test_every_refused_key_is_a_400_naming_its_allowed_values():
    error = refused({"partition": "gpu-premium", "nodes": 9})
    assert error.status == 400
    assert "normal, debug" in error.detail and "from 1 to 4" in error.detail
    assert set(error.extra["launch_options"]) == {"partition", "nodes"}


@pytest.mark.parametrize("value", [0, 5, -1, "5", "-1", "1.5", "1e3", "8.0", 2.5, True, "²", "٣", "1" * 10])
def test_a_number_outside_the_range_or_not_a_whole_number_is_refused(value):
    error = refused({"nodes": value})
    assert "a whole number from 1 to 4" in error.extra["launch_options"]["nodes"][0]


@pytest.mark.parametrize("value", ["normal\n", "normal\n#SBATCH --uid=0", "nor\x00mal", "normal\r", "\x1b[2J"])
def test_control_characters_are_refused_even_around_an_allowed_value(value):
    error = refused({"partition": value})
    assert "control characters" in error.extra["launch_options"]["partition"][0]


@pytest.mark.parametrize("value", [["debug"], {"x": 1}, 3])
def test_a_value_of_the_wrong_type_is_refused(value):
    refused({"partition": value})


def test_options_that_are_not_an_object_are_refused():
    assert refused(["partition"]).extra == {"launch_options": ["Must be a JSON object."]}


def test_when_nothing_is_declared_nothing_is_accepted():
    """The local backend declares no options: any key is refused."""
    assert "declared options: none" in refused({"partition": "debug"}, LaunchOptions()).detail


def test_a_refusal_while_the_provider_could_not_be_asked_says_so():
    assert "could not be asked" in refused({"partition": "gpu"}, declared(degraded=True)).detail


def test_a_long_refused_value_is_shown_cut_short():
    error = refused({"partition": "x" * 500})
    assert len(error.extra["launch_options"]["partition"][0]) < 200


@pytest.mark.parametrize("make", [declared, LaunchOptions], ids=["declared", "undeclared"])
def test_a_pinned_option_accepts_only_its_value_and_pinning_an_undeclared_one_declares_it(make):
    options = make()
    options.pin("partition", "big")
    assert validate_launch_options(options, {"partition": "big"}) == {"partition": "big"}
    refused({"partition": "normal"}, options)


def test_declared_options_survive_a_round_trip_through_their_stored_form():
    assert LaunchOptions.from_dict(declared(degraded=True).as_dict()) == declared(degraded=True)
