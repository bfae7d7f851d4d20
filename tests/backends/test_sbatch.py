"""R-BACK-6: the one #SBATCH renderer (Slurm and FirecREST) never lets a value out of its place."""

import subprocess
from pathlib import Path

import pytest

from apps.backends import sbatch

CASE_ID = "0b7c3c1e-4a39-4d0b-9d43-6c7d2b8f0e11"


def render(**overrides):
    arguments = {
        "job_name": CASE_ID,
        "run_dir": "/scratch/gg/" + CASE_ID,
        "batch_directives": ["--partition=debug", "--account=proj1"],
        "launch_options": {},
        "environment": {"RSC_REMOTE_KIND": "firecrest"},
        "command": "echo hello",
        "export_none": True,
        "make_progress_dir": False,
        "wall_seconds": 3600,
    }
    arguments.update(overrides)
    return sbatch.render(**arguments)


HOSTILE = [
    "$(touch pwned)",
    "`touch pwned`",
    'it\'s "quoted"',
    "two words; touch pwned",
    "${HOME}",
    "a\\b",
]


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_environment_values_reach_the_shell_as_one_literal_word(value, tmp_path):
    """R-BACK-6: no value reaches a script unquoted: the shell sees exactly the text, nothing runs."""
    script = render(environment={"GG_VALUE": value}, command='printf %s "$GG_VALUE"', run_dir=str(tmp_path))
    body = "\n".join(line for line in script.splitlines() if not line.startswith("#SBATCH"))
    # Payloads only ever touch a marker file, and the shell runs in tmp_path with HOME there: if
    # quoting is broken (as when checking this test can fail) nothing outside tmp_path is hit.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run(["bash", "-c", body], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout == value
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("value", ["debug\n#SBATCH --uid=0", "debug\ntouch pwned", "$(id)", "`id`", "a b", "'x'"])
def test_a_launch_option_value_outside_the_safe_alphabet_is_refused_not_rendered(value):
    """R-BACK-6, a test that can fail: SAFE_VALUE accepting anything, newlines included, lets a
    second #SBATCH line or a command into the script; this test then fails."""
    with pytest.raises(sbatch.ScriptError):
        render(launch_options={"partition": value})


def test_a_trailing_newline_is_refused_too():
    """``re.match(r"...$")`` accepts "debug\\n": values are matched whole (fullmatch)."""
    with pytest.raises(sbatch.ScriptError):
        render(launch_options={"time": "01:00:00\n"})


@pytest.mark.parametrize("value", ["line\nnext", "tab\there", "nul\x00", "esc\x1b[31m", "del\x7f"])
def test_control_characters_in_an_exported_value_are_refused(value):
    with pytest.raises(sbatch.ScriptError, match="control characters"):
        render(environment={"GG_VALUE": value})


@pytest.mark.parametrize("name", ["BAD NAME", "X;id", "1ABC", "A\nB", ""])
def test_an_invalid_environment_name_is_refused(name):
    with pytest.raises(sbatch.ScriptError):
        render(environment={name: "x"})


@pytest.mark.parametrize("run_dir", ["/scratch/with space", "/scratch/$(id)", "/scratch/x\n#SBATCH --uid=0", "rel"])
def test_an_unsafe_run_directory_is_refused(run_dir):
    """Paths go into #SBATCH --output/--chdir, which sbatch reads without shell quoting."""
    with pytest.raises(sbatch.ScriptError):
        render(run_dir=run_dir)


def test_an_unsafe_directive_from_the_launch_specification_is_refused():
    with pytest.raises(sbatch.ScriptError):
        render(batch_directives=["--partition=debug\n#SBATCH --uid=0"])


def test_a_launch_option_replaces_the_directive_of_the_same_flag_once():
    script = render(launch_options={"partition": "normal", "time": "00:10:00"})
    sbatch_lines = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert sbatch_lines.count("#SBATCH --partition=normal") == 1
    assert "#SBATCH --partition=debug" not in sbatch_lines
    assert "#SBATCH --time=00:10:00" in sbatch_lines
    assert "#SBATCH --account=proj1" in sbatch_lines


def test_every_job_gets_the_class_wall_time_unless_a_launch_option_chose_one():
    """F15: without --time a job inherits the partition's limit (UNLIMITED on many sites)."""
    lines = render(wall_seconds=90 * 60).splitlines()
    assert "#SBATCH --time=0-01:30:00" in lines
    assert [line for line in render(wall_seconds=2 * 86400 + 1).splitlines() if "--time" in line] == [
        "#SBATCH --time=2-00:01:00"  # rounded up to Slurm's whole minutes, never below the class
    ]
    chosen = render(launch_options={"time": "00:10:00"}, wall_seconds=90 * 60).splitlines()
    assert [line for line in chosen if "--time" in line] == ["#SBATCH --time=00:10:00"]


def test_the_time_choices_stay_within_the_class_maximum_and_default_to_its_wall_time():
    from apps.backends.base import Choice, LaunchOption, LaunchOptions
    from apps.backends.slurm import TIME_CHOICES
    from apps.resources.models import ResourceClass

    offered = LaunchOptions(options=[LaunchOption("time", "Time", [Choice(v, label) for v, label in TIME_CHOICES])])
    pinned = sbatch.pin_class_time(offered, ResourceClass(wall_time=2 * 3600, max_wall_time=4 * 3600))
    (time,) = pinned.options
    assert time.default == "0-02:00:00"
    assert [choice.value for choice in time.choices] == ["00:10:00", "01:00:00", "0-02:00:00", "04:00:00"]


def test_the_intended_differences_are_named_parameters():
    """Slurm: --export=NONE; FirecREST: the script creates .gridgate/ itself (STYLE example 5)."""
    slurm = render(export_none=True, make_progress_dir=False)
    firecrest = render(export_none=False, make_progress_dir=True)
    assert "#SBATCH --export=NONE" in slurm and "mkdir -p .gridgate" not in slurm
    assert "#SBATCH --export=NONE" not in firecrest and "mkdir -p .gridgate" in firecrest
    assert slurm.splitlines()[0] == firecrest.splitlines()[0] == "#!/bin/bash"
    assert slurm.endswith("echo hello\n") and firecrest.endswith("echo hello\n")


def test_slurm_and_firecrest_render_through_the_same_function(monkeypatch):
    from apps.backends.firecrest import FirecrestBackend
    from apps.backends.slurm import SlurmBackend
    from tests.backends.conftest import submit_spec

    calls = []
    monkeypatch.setattr(sbatch, "render", lambda **kwargs: calls.append(kwargs) or "")
    spec = submit_spec(
        CASE_ID, Path("/nonexistent"), batch_directives=["--partition=debug"], launch_options={"time": "00:10:00"}
    )
    SlurmBackend().job_script(spec, "/scratch/gg/x")
    FirecrestBackend().job_script(spec, "/scratch/gg/x")
    assert [call["export_none"] for call in calls] == [True, False]
    assert all(call["launch_options"] == {"time": "00:10:00"} for call in calls)
