"""Backends run for real here: local pools use the local backend, Slurm pools the Slurm one,
FirecREST, Qarnot and Run:AI pools theirs against the HTTP doubles of ``tests/doubles`` (on 127.0.0.1)."""

import os
import pwd
import shutil
import subprocess
import time

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from apps.cases import passes, workspace
from tests.cases.conftest import cases_root, make_case  # noqa: F401 - shared fixtures


@pytest.fixture(autouse=True)
def real_backends(settings, cases_root):  # noqa: F811
    settings.GRIDGATE_CASE_BACKENDS = {
        "local": "local",
        "slurm": "slurm",
        "firecrest": "firecrest",
        "qarnot": "qarnot",
        "runai": "runai",
    }
    settings.GRIDGATE_ALLOW_INSECURE_REMOTES = True  # the doubles speak plain http on 127.0.0.1
    # The test accounts are system accounts (useradd --system): below the production floor of 1000.
    settings.GRIDGATE_CASE_MIN_UID = 100


def wait_for_terminal(case, *, timeout: float = 60.0, poll_every: float = 0.2):
    """Run poll passes until the case ends (a bounded wait for a real process, not a timing test)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        passes.poll_pass(case_ids=[case.id])
        case.refresh_from_db()
        if case.is_terminal:
            return case
        time.sleep(poll_every)
    raise AssertionError(f"case {case.id} still {case.status} after {timeout} s: {case.last_error}")


def wait_until(predicate, *, timeout: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} not reached within {timeout} s")


def slurm_unavailable_reason() -> str | None:
    if not shutil.which("sbatch"):
        return "sbatch is not installed (run scripts/slurm-local.sh start)"
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"scontrol ping failed: {exc}"
    if "UP" not in ping.stdout:
        return f"slurmctld is not up ({(ping.stdout + ping.stderr).strip()}); run scripts/slurm-local.sh start"
    return None


@pytest.fixture(scope="session")
def slurm_cluster():
    """Skip Slurm tests with the reason outside CI; under CI=true a missing cluster fails them."""
    reason = slurm_unavailable_reason()
    if reason:
        if os.environ.get("CI", "").lower() == "true" or os.environ.get("GRIDGATE_SLURM_TESTS") == "1":
            pytest.fail(f"Slurm tests are required here (CI/GRIDGATE_SLURM_TESTS) but {reason}")
        pytest.skip(f"Slurm not available: {reason}")
    return True


#: Unix accounts the isolation tests run cases as (R-CASE-8); .ci/run creates them too.
TEST_ACCOUNTS = ("gridgate-test1", "gridgate-test2", "gridgate-sandbox")


def _required_or_skip(reason: str):
    if os.environ.get("CI", "").lower() == "true" or os.environ.get("GRIDGATE_SANDBOX_TESTS") == "1":
        pytest.fail(f"sandbox tests are required here (CI/GRIDGATE_SANDBOX_TESTS) but {reason}")
    pytest.skip(f"sandbox not available: {reason}")


@pytest.fixture(scope="session")
def sandbox_host():
    """Root, bubblewrap and the test accounts: cases really run as their owners' accounts.
    Skipped with the reason outside CI; under CI=true a missing piece fails the tests."""
    if shutil.which("bwrap") is None:
        _required_or_skip("bubblewrap is not installed (apt install bubblewrap)")
    if os.geteuid() != 0:
        _required_or_skip("running cases as other accounts needs root")
    for name in TEST_ACCOUNTS:
        try:
            pwd.getpwnam(name)
        except KeyError:
            subprocess.run(
                ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True
            )
    return {name: pwd.getpwnam(name) for name in TEST_ACCOUNTS}


@pytest.fixture
def link_account(sandbox_host):
    """``link_account(user, "gridgate-test1")``: the user's Unix account link (the QRMI one)."""
    from apps.qrmi.models import UnixAccount

    def link(user, name="gridgate-test1"):
        entry = sandbox_host[name]
        UnixAccount.objects.update_or_create(user=user, defaults={"unix_uid": entry.pw_uid})
        return entry

    return link


# -- users of the per-user credential tests ------------------------------------------------------
@pytest.fixture
def ada(db):
    return get_user_model().objects.create_user("ada", password="pw")


@pytest.fixture
def bob(db):
    return get_user_model().objects.create_user("bob", password="pw")


def browser(user) -> Client:
    """A browser logged in as ``user`` (the connections pages)."""
    client = Client()
    client.force_login(user)
    return client


def owned_case(make, user, pool, command, double, owner, *, inputs=None):
    """A case of ``user`` on ``pool`` whose every provider call the double checks is made as
    ``owner`` (``expect_owner``), with its inputs written."""
    case = make(user=user, resource_class=pool.classes.get(), command=command)
    double.expect_owner(case.id, owner)
    for name, text in (inputs or {"in.txt": "input\n"}).items():
        (workspace.case_dir(case.id) / "inputs" / name).write_text(text)
    return case


def raw_sealed(connection_id) -> str:
    """The sealed credential as the database column holds it."""
    from django.db import connection as db

    with db.cursor() as cursor:
        cursor.execute("SELECT sealed_secret FROM backends_remoteconnection WHERE id = %s", [connection_id])
        return cursor.fetchone()[0]
