"""Slurm's side of the calendar (R-RES-3): each window of a licensed pool is a Slurm reservation
of the pool's licence, made, changed and removed with ``scontrol`` by the licence sync.

A reservation of licences only (``flags=license_only``, which Slurm shows as ``ANY_NODES``)
holds ``licenses=<licence>:N`` from its start to its end for the jobs that name it
(``sbatch --reservation=gridgate_<licence name>_<id>``) of its ``users``: other jobs asking for the licence
see N fewer (and a job whose time limit would overlap the window is not started on them: Slurm
checks a job's whole run against the reserved licences). A maintenance window reserves all of
the licence (``flags=maint``): no job of anyone takes a QPU slot through Slurm meanwhile.

Creating and changing reservations needs a Slurm administrator or operator (the worker's
account: ``sacctmgr add user <account> adminlevel=Operator``, as for the licence's count).
Reservations Gridgate makes are named ``gridgate_<licence name>_<window id>``; others are never touched.
"""

import getpass
import pwd
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime

from apps.licences.sacctmgr import SlurmError, run_slurm

PREFIX = "gridgate_"


@dataclass(frozen=True)
class Wanted:
    """A Slurm reservation as the calendar wants it."""

    name: str
    start: datetime
    end: datetime
    users: tuple[str, ...]
    licences: str  # name@server:N
    maintenance: bool

    def arguments(self, *, started: bool) -> list[str]:
        out = [f"endtime={_slurm_time(self.end)}", f"users={','.join(self.users)}", f"licenses={self.licences}"]
        return out if started else [f"starttime={_slurm_time(self.start)}", *out]


@dataclass(frozen=True)
class Present:
    """A Slurm reservation Gridgate made, as ``scontrol show reservation`` reads it."""

    name: str
    start: str
    end: str
    users: tuple[str, ...]
    licences: str
    flags: str
    active: bool


def _slurm_time(at: datetime) -> str:
    """A time as scontrol reads and prints it: without a zone, in its local time, which is UTC
    (``sacctmgr._environment`` runs it with ``TZ=UTC0``)."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")


def _run(*args: str) -> str:
    return run_slurm("scontrol", *args)


def present() -> dict[str, Present]:
    """The Slurm reservations Gridgate made (named ``gridgate_…``), by name."""
    out = {}
    for line in _run("show", "reservation", "-o").splitlines():
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        name = fields.get("ReservationName", "")
        if not name.startswith(PREFIX):
            continue
        users = fields.get("Users", "(null)")
        out[name] = Present(
            name=name,
            start=fields.get("StartTime", ""),
            end=fields.get("EndTime", ""),
            users=() if users == "(null)" else tuple(sorted(users.split(","))),
            licences=fields.get("Licenses", ""),
            flags=fields.get("Flags", ""),
            active=fields.get("State") == "ACTIVE",
        )
    return out


def differs(wanted: Wanted, present: Present) -> bool:
    started = present.active
    return (
        present.end != _slurm_time(wanted.end)
        or (not started and present.start != _slurm_time(wanted.start))
        or present.users != tuple(sorted(wanted.users))
        or present.licences != wanted.licences
        or ("MAINT" in present.flags.split(",")) != wanted.maintenance
    )


def create(wanted: Wanted, *, now: datetime) -> None:
    started = wanted.start <= now
    start = "starttime=now" if started else f"starttime={_slurm_time(wanted.start)}"
    flags = "flags=maint,license_only" if wanted.maintenance else "flags=license_only"
    _run("create", "reservation", f"reservationname={wanted.name}", start, *wanted.arguments(started=True), flags)


def update(wanted: Wanted, present: Present) -> None:
    """Change a reservation in place (a started one keeps its start), or make it again when its
    kind changed (Slurm cannot add or remove ``maint`` on a reservation in use)."""
    if ("MAINT" in present.flags.split(",")) != wanted.maintenance:
        delete(present.name)
        create(wanted, now=datetime.now(UTC))
        return
    _run("update", f"reservationname={wanted.name}", *wanted.arguments(started=present.active))


def delete(name: str) -> None:
    _run("delete", f"reservationname={name}")


def account_name(uid: int) -> str | None:
    """The Unix account name of ``uid`` as this host resolves it (Slurm names reservation users
    by name), or None."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def operator() -> str:
    """The account a reservation names when none of its holders has a Unix account Slurm knows
    (Slurm needs at least one user): the worker's own, a Slurm operator."""
    return getpass.getuser()


def check() -> tuple[bool, str]:
    """doctor: ``scontrol show reservation`` answers."""
    if shutil.which("scontrol") is None:
        return False, "scontrol is not on the worker's PATH: install Slurm's client (slurm-client) on the worker hosts"
    try:
        ours = present()
    except SlurmError as exc:
        return False, f"{exc} (is slurmctld reachable from this host, and munged running?)"
    return True, f"slurmctld answers; {len(ours)} Slurm reservation(s) made by Gridgate"
