"""R-RES-3's times: scontrol reads and prints a reservation's times without a zone, in its own
local time zone (the one of the process that runs it), so Gridgate must hand it times in the zone
scontrol uses. Here scontrol is replaced by a double that reads and prints times as the C library
does: in the zone its environment's ``TZ`` names, else in the host's ``/etc/localtime``."""

import os
import time
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from zoneinfo import ZoneInfo

import pytest

from apps.licences import sacctmgr, scontrol

FORMAT = "%Y-%m-%dT%H:%M:%S"


def zone_of(env: dict):
    """The zone a C program started with ``env`` reads local times in."""
    name = env.get("TZ")
    if name in ("UTC0", "UTC", "Etc/UTC", ":UTC"):
        return UTC
    if name:
        return ZoneInfo(name.lstrip(":"))
    localtime = Path("/etc/localtime")
    return ZoneInfo.from_file(localtime.open("rb")) if localtime.exists() else UTC


class FakeScontrol:
    """``scontrol create|update|show reservation`` with the reservations as instants in memory."""

    def __init__(self):
        self.reservations: dict[str, dict] = {}

    def __call__(self, command, *, env, **_):
        zone = zone_of(env)
        args = command[1:]
        if args[:2] == ["show", "reservation"]:
            lines = [
                f"ReservationName={name} StartTime={r['start'].astimezone(zone).strftime(FORMAT)} "
                f"EndTime={r['end'].astimezone(zone).strftime(FORMAT)} Users={r['users']} "
                f"Licenses={r['licenses']} Flags={r['flags']} State=INACTIVE"
                for name, r in self.reservations.items()
            ]
            return SimpleNamespace(returncode=0, stdout="\n".join(lines) + "\n", stderr="")
        fields = dict(arg.split("=", 1) for arg in args if "=" in arg)
        name = fields["reservationname"]
        row = self.reservations.setdefault(name, {})
        for key in ("starttime", "endtime"):
            if key in fields:
                row["start" if key == "starttime" else "end"] = datetime.strptime(fields[key], FORMAT).replace(
                    tzinfo=zone, fold=0
                )
        if row["end"] <= row["start"]:
            return SimpleNamespace(returncode=1, stdout="", stderr="Error creating the reservation: Invalid time")
        row.update(users=fields.get("users", ""), licenses=fields.get("licenses", ""), flags="LICENSE_ONLY")
        return SimpleNamespace(returncode=0, stdout="", stderr="")


@pytest.fixture
def worker_in_zurich(monkeypatch):
    """The worker runs with ``TZ=Europe/Zurich`` (as a container is often started)."""
    before = os.environ.get("TZ")
    monkeypatch.setenv("TZ", "Europe/Zurich")
    time.tzset()
    yield
    if before is None:
        monkeypatch.delenv("TZ")
    else:
        monkeypatch.setenv("TZ", before)
    time.tzset()  # the process's local time as it was, for the tests that follow


@pytest.fixture
def fake_scontrol(monkeypatch):
    fake = FakeScontrol()
    monkeypatch.setattr(sacctmgr.subprocess, "run", fake)
    return fake


@pytest.mark.parametrize(
    ("start", "end"),
    [
        # Europe/Zurich falls back at 03:00 CEST = 01:00 UTC: 02:00-03:00 local happens twice
        (datetime(2026, 10, 25, 0, 0, tzinfo=UTC), datetime(2026, 10, 25, 1, 0, tzinfo=UTC)),
        (datetime(2026, 10, 25, 0, 30, tzinfo=UTC), datetime(2026, 10, 25, 2, 0, tzinfo=UTC)),
        # and springs forward at 02:00 CET = 01:00 UTC
        (datetime(2026, 3, 29, 0, 30, tzinfo=UTC), datetime(2026, 3, 29, 1, 30, tzinfo=UTC)),
        (datetime(2026, 7, 1, 8, 0, tzinfo=UTC), datetime(2026, 7, 1, 9, 0, tzinfo=UTC)),
    ],
)
def test_r_res_3_a_slurm_reservation_holds_the_windows_instants_across_dst_and_whatever_the_workers_tz(
    worker_in_zurich, fake_scontrol, start, end
):
    wanted = scontrol.Wanted("gridgate_qpu_1", start, end, ("nobody",), "qpu@gridgate:1", False)
    scontrol.create(wanted, now=datetime(2026, 1, 1, tzinfo=UTC))
    made = fake_scontrol.reservations["gridgate_qpu_1"]
    assert (made["start"], made["end"]) == (start, end)
    # Read back, it is in step: the licence sync changes nothing.
    assert not scontrol.differs(wanted, scontrol.present()["gridgate_qpu_1"])
