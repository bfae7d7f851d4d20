"""The one ``#SBATCH`` job-script renderer (``apps.backends.sbatch``, R-BACK-4, R-BACK-6), Slurm's and
FirecREST's, without a database: what reaches the script, and what is refused before anything is
written; no value ever leaves its place."""

import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from apps.backends import sbatch
from apps.backends.base import Choice, LaunchOption, LaunchOptions
from apps.backends.sbatch import (
    ScriptError,
    directive,
    merged_directives,
    pin_class_partition,
    pin_class_time,
    quote,
    render,
    slurm_duration,
    time_limit_seconds,
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


def test_the_intended_differences_are_named_parameters():
    """Slurm: --export=NONE; FirecREST: the script creates .gridgate/ itself (STYLE example 5)."""
    slurm = script(export_none=True, make_progress_dir=False)
    firecrest = script(export_none=False, make_progress_dir=True)
    assert "#SBATCH --export=NONE" in slurm and "mkdir -p .gridgate" not in slurm
    assert "#SBATCH --export=NONE" not in firecrest
    assert firecrest.splitlines()[-2:] == ["mkdir -p .gridgate", "python main.py"]
    assert slurm.splitlines()[0] == firecrest.splitlines()[0] == "#!/bin/bash"
    assert slurm.endswith("python main.py\n")


def test_slurm_and_firecrest_render_through_the_same_function(monkeypatch):
    from apps.backends.firecrest import FirecrestBackend
    from apps.backends.slurm import SlurmBackend
    from tests.backends.conftest import submit_spec

    calls = []
    monkeypatch.setattr(sbatch, "render", lambda **kwargs: calls.append(kwargs) or "")
    spec = submit_spec(
        "0b7c3c1e-4a39-4d0b-9d43-6c7d2b8f0e11",
        Path("/nonexistent"),
        batch_directives=["--partition=debug"],
        launch_options={"time": "00:10:00"},
    )
    SlurmBackend().job_script(spec, "/scratch/gg/x")
    FirecrestBackend().job_script(spec, "/scratch/gg/x")
    assert [call["export_none"] for call in calls] == [True, False]
    assert all(call["launch_options"] == {"time": "00:10:00"} for call in calls)


HOSTILE = ["$(touch pwned)", "`touch pwned`", 'it\'s "quoted"', "two words; touch pwned", "${HOME}", "a\\b"]


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_environment_values_reach_the_shell_as_one_literal_word(value, tmp_path):
    """R-BACK-6: no value reaches a script unquoted: the shell sees exactly the text, nothing runs."""
    text = script(environment={"GG_VALUE": value}, command='printf %s "$GG_VALUE"', run_dir=str(tmp_path))
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#SBATCH"))
    # Payloads only ever touch a marker file, and the shell runs in tmp_path with HOME there: if
    # quoting is broken (as when checking this test can fail) nothing outside tmp_path is hit.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run(["bash", "-c", body], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout == value
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(
    "value", ["debug\n#SBATCH --uid=0", "debug\ntouch pwned", "$(id)", "`id`", "a b", "'x'", "x\n"]
)
def test_a_launch_option_value_outside_the_safe_alphabet_is_refused_not_rendered(value):
    """R-BACK-6, a test that can fail: SAFE_VALUE accepting anything, newlines included, lets a
    second #SBATCH line or a command into the script; this test then fails. So does a match that
    accepts a trailing newline (``re.match(r"...$")`` on "x\\n"): values are matched whole."""
    with pytest.raises(ScriptError):
        script(launch_options={"partition": value})


@pytest.mark.parametrize("run_dir", ["/scratch/with space", "/scratch/$(id)", "/scratch/x\n#SBATCH --uid=0", "rel"])
def test_an_unsafe_run_directory_is_refused(run_dir):
    """Paths go into #SBATCH --output/--chdir, which sbatch reads without shell quoting."""
    with pytest.raises(ScriptError):
        script(run_dir=run_dir)


def test_an_unsafe_directive_from_the_launch_specification_is_refused():
    with pytest.raises(ScriptError):
        script(batch_directives=["--partition=debug\n#SBATCH --uid=0"])


def test_a_launch_option_replaces_the_directive_of_the_same_flag_once():
    lines = script(launch_options={"partition": "debug", "time": "0-00:10:00"}).splitlines()
    assert lines.count("#SBATCH --partition=debug") == 1 and "#SBATCH --partition=normal" not in lines
    assert [line for line in lines if line.startswith("#SBATCH --time")] == ["#SBATCH --time=0-00:10:00"]
    assert "#SBATCH --account=proj" in lines


def test_every_job_gets_the_class_wall_time_unless_a_launch_option_chose_one():
    """F15: without --time a job inherits the partition's limit (UNLIMITED on many sites)."""
    assert "#SBATCH --time=0-01:30:00" in script(wall_seconds=90 * 60).splitlines()
    chosen = script(launch_options={"time": "00:10:00"}, wall_seconds=90 * 60).splitlines()
    assert [line for line in chosen if "--time" in line] == ["#SBATCH --time=00:10:00"]


def test_an_empty_launch_option_keeps_the_specification_directive():
    assert merged_directives(["--partition=normal"], {"partition": ""}) == [("--partition", "normal")]


@pytest.mark.parametrize(
    ("directives", "options", "words"), [([], {"partition": 3}, "invalid value"), (["--partition"], {}, "malformed")]
)
def test_a_launch_option_that_is_not_text_or_a_malformed_batch_directive_is_refused(directives, options, words):
    with pytest.raises(ScriptError, match=words):
        merged_directives(directives, options)


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


@pytest.mark.parametrize("value", ["line\nnext", "tab\there", "nul\x00", "esc\x1b[31m", "del\x7f"])
def test_an_export_value_with_control_characters_is_refused(value):
    with pytest.raises(ScriptError, match="control characters"):
        script(environment={"GG_VALUE": value})


@pytest.mark.parametrize("name", ["1ABC", "A-B", "A B", "A=B", "A;id", "A\nB", ""])
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
    [("1-02:03:04", 93784), ("02:03:04", 7384), ("10:30", 630), ("45", 2700), ("2-05", 190800), ("1-02:03", 93780)]
    + [("UNLIMITED", None), ("1:2:3:4", None), ("a-01:00:00", None), ("", None)],
)
def test_slurm_time_limits_are_read_in_each_of_their_forms_and_an_unreadable_one_is_none(text, seconds):
    assert time_limit_seconds(text) == seconds


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
