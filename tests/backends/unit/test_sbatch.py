"""The one ``#SBATCH`` job-script renderer (``apps.backends.sbatch``, R-BACK-4, R-BACK-6), without
a database: what reaches the script, and what is refused before anything is written."""

from types import SimpleNamespace

import pytest

from apps.backends.base import Choice, LaunchOption, LaunchOptions
from apps.backends.sbatch import (
    ScriptError,
    directive,
    duration_seconds,
    merged_directives,
    pin_class_partition,
    pin_class_time,
    quote,
    render,
    slurm_duration,
)


def script(**overrides) -> str:
    arguments = {
        "job_name": "gg-case",
        "run_dir": "/cases/abc/run-1",
        "batch_directives": ["--partition=normal", "--account=proj"],
        "launch_options": {},
        "environment": {"GREETING": "hello world"},
        "command": "python main.py",
        "export_none": True,
        "make_progress_dir": False,
        "wall_seconds": 3600,
    }
    return render(**{**arguments, **overrides})


def test_the_script_has_its_directives_then_its_exports_then_the_command():
    assert script().splitlines() == [
        "#!/bin/bash",
        "#SBATCH --job-name=gg-case",
        "#SBATCH --output=/cases/abc/run-1/stdout",
        "#SBATCH --error=/cases/abc/run-1/stderr",
        "#SBATCH --chdir=/cases/abc/run-1/work",
        "#SBATCH --export=NONE",
        "#SBATCH --partition=normal",
        "#SBATCH --account=proj",
        "#SBATCH --time=0-01:00:00",
        "export GREETING='hello world'",
        "python main.py",
    ]


def test_firecrest_scripts_export_the_environment_and_make_the_progress_directory():
    lines = script(export_none=False, make_progress_dir=True).splitlines()
    assert "#SBATCH --export=NONE" not in lines
    assert lines[-2:] == ["mkdir -p .gridgate", "python main.py"]


def test_a_launch_option_replaces_the_directive_of_the_same_flag():
    lines = script(launch_options={"partition": "debug", "time": "0-00:10:00"}).splitlines()
    assert "#SBATCH --partition=debug" in lines and "#SBATCH --partition=normal" not in lines
    assert [line for line in lines if line.startswith("#SBATCH --time")] == ["#SBATCH --time=0-00:10:00"]


def test_an_empty_launch_option_keeps_the_specification_directive():
    assert merged_directives(["--partition=normal"], {"partition": ""}) == [("--partition", "normal")]


def test_a_launch_option_that_is_not_text_is_refused():
    with pytest.raises(ScriptError):
        merged_directives([], {"partition": 3})


def test_a_malformed_batch_directive_is_refused():
    with pytest.raises(ScriptError, match="malformed"):
        merged_directives(["--partition"], {})


@pytest.mark.parametrize("value", ["normal\n#SBATCH --uid=0", "a b", "$(id)", "`id`", "'x'", "", "x" * 65])
def test_a_directive_value_outside_the_safe_words_is_refused(value):
    with pytest.raises(ScriptError):
        directive("--partition", value)


@pytest.mark.parametrize("path", ["relative/out", "/cases/a b", "/cases/$HOME", "/cases/x\n"])
def test_a_directive_path_outside_the_safe_absolute_paths_is_refused(path):
    with pytest.raises(ScriptError):
        directive("--output", path)


def test_an_export_value_is_one_single_quoted_shell_word():
    assert quote("it's $HOME") == "'it'\"'\"'s $HOME'"


def test_an_export_value_with_control_characters_is_refused():
    with pytest.raises(ScriptError, match="control characters"):
        quote("line\nbreak")


@pytest.mark.parametrize("name", ["1ABC", "A-B", "A B", "A=B", "A;id"])
def test_an_invalid_environment_variable_name_is_refused(name):
    with pytest.raises(ScriptError, match="environment variable"):
        script(environment={name: "x"})


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0-00:01:00"), (59, "0-00:01:00"), (61, "0-00:02:00"), (3600, "0-01:00:00"), (90000, "1-01:00:00")],
)
def test_a_time_limit_is_written_in_whole_minutes_rounded_up(seconds, text):
    assert slurm_duration(seconds) == text


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1-02:03:04", 93784), ("02:03:04", 7384), ("10:30", 630), ("45", 2700), ("2-05", 190800), ("1-02:03", 93780)],
)
def test_slurm_durations_are_read_in_each_of_their_forms(text, seconds):
    assert duration_seconds(text) == seconds


@pytest.mark.parametrize("text", ["UNLIMITED", "1:2:3:4", "a-01:00:00", ""])
def test_an_unreadable_duration_is_none(text):
    assert duration_seconds(text) is None


def test_a_class_partition_override_becomes_the_only_choice():
    options = LaunchOptions([LaunchOption("partition", "Partition", [Choice("normal", "normal")], "normal")])
    resource_class = SimpleNamespace(remote_value=lambda key: "big" if key == "partition" else None)
    pinned = pin_class_partition(options, resource_class)
    assert [(o.choices, o.default) for o in pinned.options] == [([Choice("big", "big")], "big")]


def test_time_choices_are_those_within_the_class_maximum_with_its_wall_time_as_default():
    offered = [Choice(value, value) for value in ("0-00:30:00", "0-02:00:00", "1-00:00:00")]
    options = LaunchOptions([LaunchOption("time", "Time", offered, "1-00:00:00")])
    resource_class = SimpleNamespace(wall_time=3600, max_wall_time=7200)
    (option,) = pin_class_time(options, resource_class).options
    assert [choice.value for choice in option.choices] == ["0-00:30:00", "0-01:00:00", "0-02:00:00"]
    assert option.default == "0-01:00:00"
