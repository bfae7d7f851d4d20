"""Slurm's side of a licence: remote licences in slurmdbd, read and set with ``sacctmgr``.

Slurm 22.05 (Debian 12) keeps a remote licence as a *resource* of type ``license`` in slurmdbd:
``name@server``, a ``count``, and per cluster the percentage of it that cluster may hand out.
Its licences have no ``lastconsumed`` (that came in 23.02), so Gridgate sets ``count`` itself.
Every resource Gridgate makes has ``servertype=gridgate``: on an outage of Gridgate's database
the resources of that server type are the ones to close (``close_all``).

The worker's account must be a Slurm operator (``sacctmgr add user <account> adminlevel=Operator``)
to add and modify resources; reading needs no privilege (docs/qrmi.md, "Slurm licences").
"""

import os
import shutil
import subprocess
from dataclasses import dataclass

from django.conf import settings

from apps.backends import files

SERVER_TYPE = "gridgate"


class SlurmError(Exception):
    """sacctmgr failed or could not be run; the message says what it printed."""


@dataclass(frozen=True)
class Licence:
    name: str
    server: str

    @classmethod
    def parse(cls, text: str) -> "Licence":
        name, server = text.split("@", 1)
        return cls(name, server)

    def __str__(self):
        return f"{self.name}@{self.server}"


def _environment() -> dict:
    """What the Slurm client commands run with. ``TZ=UTC0``: scontrol reads and prints times
    without a zone, in its own local time (``apps.licences.scontrol``); in UTC, a window's
    instants are read as meant whatever the worker's zone (its ``TZ`` was not passed on, the
    host's ``/etc/localtime`` was used), and an hour that happens twice at a DST change is never
    ambiguous (a window from 02:00 CEST to 02:00 CET was sent as starting when it ends)."""
    env = files.base_environment(files.INHERITED_ENVIRONMENT + ("SLURM_CONF",))
    env["TZ"] = "UTC0"
    if settings.GRIDGATE_LICENCE_SLURM_CONF:
        env["SLURM_CONF"] = settings.GRIDGATE_LICENCE_SLURM_CONF
    return env


def run_slurm(tool: str, *args: str) -> str:
    """A Slurm client command (``sacctmgr``, ``scontrol``) run with the licence sync's Slurm
    configuration and timeout: its output, or SlurmError saying what it printed."""
    command = [shutil.which(tool) or tool, *args]
    try:
        done = subprocess.run(
            command,
            env=_environment(),
            capture_output=True,
            text=True,
            timeout=settings.GRIDGATE_LICENCE_SACCTMGR_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmError(f"{tool} could not be run: {exc}") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        what = " ".join([arg for arg in args if not arg.startswith("-")][:2])
        raise SlurmError(f"{tool} {what} failed ({done.returncode}): {' '.join(said)[-500:]}")
    return done.stdout


def _run(*args: str) -> str:
    """``sacctmgr --immediate --noheader --parsable2 <args>``'s output; SlurmError otherwise."""
    return run_slurm("sacctmgr", "-i", "-n", "-P", *args)


def clusters() -> list[str]:
    """The clusters a licence is made for: GRIDGATE_LICENCE_CLUSTERS, else the cluster named in
    the slurm.conf the worker reads."""
    if settings.GRIDGATE_LICENCE_CLUSTERS:
        return list(settings.GRIDGATE_LICENCE_CLUSTERS)
    try:
        done = subprocess.run(
            [shutil.which("scontrol") or "scontrol", "show", "config"],
            env=_environment(),
            capture_output=True,
            text=True,
            timeout=settings.GRIDGATE_LICENCE_SACCTMGR_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmError(f"scontrol could not be run: {exc}") from None
    for line in done.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "ClusterName" and value.strip():
            return [value.strip()]
    raise SlurmError("no ClusterName in `scontrol show config`: set GRIDGATE_LICENCE_CLUSTERS")


def count(licence: Licence) -> int | None:
    """The licence's count in slurmdbd; None when it does not exist."""
    out = _run("show", "resource", f"name={licence.name}", f"server={licence.server}", "format=count")
    lines = [line for line in out.splitlines() if line.strip()]
    return int(lines[0].split("|")[0]) if lines else None


def set_count(licence: Licence, value: int) -> str:
    """Make the licence's count ``value``, creating it for ``clusters()`` if it does not exist;
    returns what was done ("unchanged", "set from N", "created")."""
    current = count(licence)
    if current is None:
        _run(
            "add",
            "resource",
            f"name={licence.name}",
            f"server={licence.server}",
            f"servertype={SERVER_TYPE}",
            "type=license",
            f"count={value}",
            f"cluster={','.join(clusters())}",
            "percentallowed=100",
        )
        return "created"
    if current == value:
        return "unchanged"
    _run("modify", "resource", f"name={licence.name}", f"server={licence.server}", "set", f"count={value}")
    return f"set from {current}"


def ours() -> list[Licence]:
    """Every licence in slurmdbd that Gridgate made (server type ``gridgate``)."""
    out = _run("show", "resource", f"servertype={SERVER_TYPE}", "format=name,server")
    return [Licence(*line.split("|")[:2]) for line in out.splitlines() if line.strip()]


def check() -> tuple[bool, str]:
    """doctor: slurmdbd answers sacctmgr, and the clusters to make licences for exist there."""
    if shutil.which("sacctmgr") is None:
        return False, "sacctmgr is not on the worker's PATH: install Slurm's client (slurm-client) on the worker hosts"
    try:
        known = {line.split("|")[0] for line in _run("show", "cluster", "format=cluster").splitlines() if line}
        wanted = clusters()
    except SlurmError as exc:
        return False, f"{exc} (is slurmdbd reachable from this host, and munged running?)"
    missing = [name for name in wanted if name not in known]
    if missing:
        return False, f"cluster(s) {', '.join(missing)} unknown to slurmdbd (known: {', '.join(sorted(known))})"
    who = os.environ.get("USER") or str(os.getuid())
    return True, f"slurmdbd answers; licences are made for cluster(s) {', '.join(wanted)} (as {who})"
