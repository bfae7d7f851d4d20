"""Fixtures of the Slurm licence tests: a licensed QPU pool, Slurm's side faked in-process
(``fake_slurm``) or the real accounting cluster that .ci/run starts (``acct_cluster``)."""

import os
import shutil
import subprocess
import uuid

import pytest

from apps.licences import sacctmgr
from apps.licences.models import LicenceState
from tests import factories
from tests.qrmi.conftest import munged  # noqa: F401 - the jobs sign their acquires with the real munged

#: the accounting cluster of scripts/slurm-local.sh (SLURM_LOCAL_ACCOUNTING=1): slurmdbd + MariaDB
ACCT_CONF = os.environ.get("GRIDGATE_SLURM_ACCT_CONF", "/etc/slurm-acct/slurm.conf")
ACCT_CLUSTER = "gridgate-acct"


def slurm_env() -> dict:
    return {**os.environ, "SLURM_CONF": ACCT_CONF}


def acct_problem() -> str:
    if not shutil.which("sacctmgr") or not os.path.exists(ACCT_CONF):
        return f"no Slurm accounting cluster ({ACCT_CONF}): SLURM_LOCAL_ACCOUNTING=1 scripts/slurm-local.sh start"
    try:
        done = subprocess.run(
            ["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"],
            env=slurm_env(),
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"sacctmgr does not answer: {exc}"
    if ACCT_CLUSTER not in done.stdout.split():
        return f"slurmdbd does not know cluster {ACCT_CLUSTER}: {(done.stdout + done.stderr).strip()[-300:]}"
    return ""


@pytest.fixture(scope="session")
def acct_cluster():
    problem = acct_problem()
    if problem:
        if os.environ.get("CI", "").lower() == "true" or os.environ.get("GRIDGATE_SLURM_TESTS") == "1":
            pytest.fail(f"the licence tests need Slurm with accounting here, but {problem}")
        pytest.skip(problem)


@pytest.fixture
def licensed_pool(db):
    """A two-slot QPU pool with an online emulator and a licence name of its own."""
    name = f"qpu_t{uuid.uuid4().hex[:10]}"
    pool = factories.pool(name, slots_total=2, slurm_licence=f"{name}@gridgate")
    factories.emulator(pool, "emu")
    # No worker runs here: the sync that creating the pool asked for was never taken.
    LicenceState.objects.filter(pool=pool).update(pending_since=None)
    return pool


@pytest.fixture
def real_licences(acct_cluster, settings, licensed_pool):
    """The licence sync on the accounting cluster; the test's licence deleted after."""
    settings.GRIDGATE_LICENCE_SLURM_CONF = ACCT_CONF
    settings.GRIDGATE_LICENCE_CLUSTERS = [ACCT_CLUSTER]
    yield sacctmgr.Licence.parse(licensed_pool.slurm_licence)
    licence = sacctmgr.Licence.parse(licensed_pool.slurm_licence)
    subprocess.run(
        ["sacctmgr", "-i", "delete", "resource", f"name={licence.name}", f"server={licence.server}"],
        env=slurm_env(),
        capture_output=True,
        timeout=30,
    )


class FakeSlurm:
    """slurmdbd's licences in memory: what ``sacctmgr.count``/``set_count`` read and write."""

    def __init__(self):
        self.counts: dict[str, int] = {}
        self.calls: list[tuple] = []
        self.failing = ""

    def count(self, licence):
        if self.failing:
            raise sacctmgr.SlurmError(self.failing)
        return self.counts.get(str(licence))

    def set_count(self, licence, value):
        if self.failing:
            raise sacctmgr.SlurmError(self.failing)
        before = self.counts.get(str(licence))
        self.counts[str(licence)] = value
        self.calls.append((str(licence), value))
        return "created" if before is None else ("unchanged" if before == value else f"set from {before}")

    def ours(self):
        return [sacctmgr.Licence.parse(name) for name in self.counts]


@pytest.fixture
def fake_slurm(monkeypatch):
    fake = FakeSlurm()
    monkeypatch.setattr(sacctmgr, "count", fake.count)
    monkeypatch.setattr(sacctmgr, "set_count", fake.set_count)
    monkeypatch.setattr(sacctmgr, "ours", fake.ours)
    return fake
