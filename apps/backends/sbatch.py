"""The one ``#SBATCH`` job-script renderer for the Slurm and FirecREST backends (R-BACK-6, R-BACK-4;
docs/backends.md, "One job-script renderer"). The backends' intended differences are named
parameters of :func:`render`, not a second copy: ``export_none`` (the local Slurm job inherits
nothing of the submitting worker, R-BACK-1; FirecREST submits from its own server) and
``make_progress_dir`` (FirecREST's script creates ``.gridgate/`` itself).

Every job gets a ``--time``: the user's ``time`` launch option (offered within the class's
maximum, :func:`pin_class_time`), else the class's wall time. Without one a job inherits the
partition's limit, which is ``UNLIMITED`` on many sites: a case would hold its nodes for ever.

``#SBATCH`` lines are parsed by ``sbatch``, not by a shell, so quoting cannot make them safe:
their values must match :data:`SAFE_VALUE` (or :data:`SAFE_PATH` for paths). ``export`` values
go through :func:`quote` after control characters are refused. The case's command is the user's
own script and is written as is.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping

from apps.backends.base import BackendError, Choice, LaunchOptions
from apps.core.text import has_control_characters

# Always matched with ``fullmatch``: ``re.match`` with ``$`` would accept a trailing newline.
#: a directive value (partition, account, time, memory…): what Slurm's own names and durations use
SAFE_VALUE = re.compile(r"[A-Za-z0-9_.:,=+-]{1,64}")
#: an absolute path in a directive (``--output``, ``--chdir``): no whitespace, quotes or ``$``
SAFE_PATH = re.compile(r"/[A-Za-z0-9_.,+=@%/-]{0,4000}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")

#: launch options that become directives, and their flags. Which keys a backend accepts at all is
#: what it declares in ``launch_options`` (checked before anything is rendered).
OPTION_FLAGS = {"partition": "--partition", "time": "--time"}
PATH_FLAGS = ("--output", "--error", "--chdir")


class ScriptError(BackendError):
    """A value cannot be written into a job script safely: the launch fails, nothing is sent."""


def quote(value) -> str:
    """``value`` as one shell word. Control characters are refused rather than quoted: a newline
    inside quotes is harmless to the shell but not to every reader of the script (R-BACK-6)."""
    text = str(value)
    if has_control_characters(text):
        raise ScriptError(f"the value {text[:40]!r}… contains control characters and cannot go into a job script")
    return shlex.quote(text)


def directive(flag: str, value) -> str:
    """One ``#SBATCH`` line; ``value`` must be a safe word (paths: a safe absolute path)."""
    text = str(value)
    pattern = SAFE_PATH if flag in PATH_FLAGS else SAFE_VALUE
    if not pattern.fullmatch(text):
        raise ScriptError(f"{flag} has an invalid value {text[:80]!r} for a job script")
    return f"#SBATCH {flag}={text}"


def merged_directives(batch_directives: list[str], launch_options: Mapping) -> list[tuple[str, str]]:
    """The launch specification's directives, each user option replacing the directive of the same
    flag. The options were checked against the backend's declaration (and a class override pins
    its partition there), so an option replacing a directive is one the user was offered."""
    pairs: list[tuple[str, str]] = []
    for text in batch_directives:
        flag, sep, value = text.partition("=")
        if not sep:
            raise ScriptError(f"malformed batch directive {text[:80]!r}")
        pairs.append((flag, value))
    for key, flag in OPTION_FLAGS.items():
        value = launch_options.get(key)
        if value in (None, ""):
            continue
        if not isinstance(value, str):
            raise ScriptError(f"launch option '{key}' has an invalid value {value!r}")
        pairs = [(f, v) for f, v in pairs if f != flag] + [(flag, value)]
    return pairs


def render(
    *,
    job_name: str,
    run_dir: str,
    batch_directives: list[str],
    launch_options: Mapping,
    environment: Mapping[str, str],
    command: str,
    export_none: bool,
    make_progress_dir: bool,
    wall_seconds: int,
) -> str:
    """The job script. Raises :class:`ScriptError` before anything is written or sent when a
    value is unsafe. ``run_dir`` holds ``stdout``/``stderr``; ``run_dir/work`` is the job's
    working directory; ``wall_seconds`` (the class's wall time) is its ``--time`` unless the
    launch options chose one."""
    lines = [
        "#!/bin/bash",
        directive("--job-name", job_name),
        directive("--output", f"{run_dir}/stdout"),
        directive("--error", f"{run_dir}/stderr"),
        directive("--chdir", f"{run_dir}/work"),
    ]
    if export_none:
        lines.append(directive("--export", "NONE"))
    pairs = merged_directives(batch_directives, launch_options)
    if not any(flag == "--time" for flag, _ in pairs):
        pairs.append(("--time", slurm_duration(wall_seconds)))
    lines += [directive(flag, value) for flag, value in pairs]
    for name, value in sorted(environment.items()):
        if not ENV_NAME.fullmatch(str(name)):
            raise ScriptError(f"{str(name)[:80]!r} is not a valid environment variable name")
        lines.append(f"export {name}={quote(value)}")
    if make_progress_dir:
        lines.append("mkdir -p .gridgate")
    lines.append(command)
    return "\n".join(lines) + "\n"


def pin_class_partition(answer: LaunchOptions, resource_class) -> LaunchOptions:
    """R-BACK-6: a class's partition override wins over any default or choice the provider
    offers (FirecREST's first listed partition, ``sinfo``'s default): it becomes the only choice."""
    partition = resource_class.remote_value("partition")
    if partition:
        answer.pin("partition", partition)
    return answer


def slurm_duration(seconds: int) -> str:
    """``D-HH:MM:SS``, Slurm's form of a time limit (whole minutes, rounded up: Slurm counts
    minutes, and a limit below the class's wall time would end a case early)."""
    minutes = max(1, -(-int(seconds) // 60))
    days, rest = divmod(minutes * 60, 86400)
    hours, rest = divmod(rest, 3600)
    return f"{days}-{hours:02d}:{rest // 60:02d}:00"


def time_limit_seconds(text: str) -> int | None:
    """Seconds of a Slurm time limit (``[D-]HH:MM:SS``, ``MM:SS``, ``MM``: a bare number is minutes,
    unlike an elapsed time: ``base.duration_seconds``); None when unreadable."""
    days, _, clock = text.rpartition("-")
    try:
        parts = [int(part) for part in clock.split(":")]
        whole_days = int(days) if days else 0
    except ValueError:
        return None
    if len(parts) == 3:
        hours, minutes, seconds = parts
    elif len(parts) == 2 and days:
        hours, minutes, seconds = parts[0], parts[1], 0
    elif len(parts) == 2:
        hours, minutes, seconds = 0, parts[0], parts[1]
    elif len(parts) == 1:
        hours, minutes, seconds = (parts[0], 0, 0) if days else (0, parts[0], 0)
    else:
        return None
    return ((whole_days * 24 + hours) * 60 + minutes) * 60 + seconds


def pin_class_time(answer: LaunchOptions, resource_class) -> LaunchOptions:
    """The ``time`` choices a class allows: those within its maximum wall time, with its own wall
    time as the default (and a choice), so no launch asks Slurm for more than the class gives."""
    for option in answer.options:
        if option.key != "time":
            continue
        default = slurm_duration(resource_class.wall_time)
        kept = [
            choice
            for choice in option.choices
            if (time_limit_seconds(choice.value) or 0) <= resource_class.max_wall_time and choice.value != default
        ]
        kept.append(Choice(default, f"{default} (the class's wall time)"))
        option.choices = sorted(kept, key=lambda choice: time_limit_seconds(choice.value) or 0)
        option.default = default
    return answer


#: a case without bounds (a spec built by hand) gets the model's default wall time: never none
DEFAULT_WALL_SECONDS = 24 * 3600


def wall_seconds(spec) -> int:
    """The class's wall time of the case ``spec`` describes."""
    return spec.bounds.wall_seconds if spec.bounds is not None else DEFAULT_WALL_SECONDS
