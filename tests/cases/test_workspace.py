"""Case workspaces on disk: the cases root's mode and what a workspace listing holds."""

import logging
import os
import stat
from contextlib import contextmanager
from datetime import UTC, datetime

import pytest

from apps.core import hosts
from apps.core.cases_root import CasesRootError, ensure_cases_root

pytestmark = pytest.mark.django_db


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@contextmanager
def umask(value: int):
    previous = os.umask(value)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.mark.parametrize("mask", [0o022, 0o077], ids=["umask-022", "umask-077"])
def test_cases_root_is_0711_after_the_first_case_even_when_it_did_not_exist(make_case, cases_root, mask):
    """0711 whatever the umask: 077 would make it 0700 and shut out the Slurm jobs that traverse it."""
    assert not cases_root.exists()
    with umask(mask):
        make_case()
    assert mode(cases_root) == 0o711


def test_a_worker_heartbeat_before_any_case_leaves_the_cases_root_0711(make_case, cases_root):
    """The heartbeat's marker was the first to create the root, 0755, and the case code only set
    0711 on a root it created itself, so the root stayed listable by every account."""
    hosts.write_marker("host-a", datetime.now(UTC))
    assert mode(cases_root) == 0o711
    make_case()
    assert mode(cases_root) == 0o711


def test_an_existing_cases_root_others_can_list_is_closed_to_0711_by_the_next_case(make_case, cases_root):
    cases_root.mkdir()
    os.chmod(cases_root, 0o755)  # noqa: S103 - what an earlier version or a mkdir -p left
    make_case()
    assert mode(cases_root) == 0o711


def test_a_cases_root_0700_of_the_service_is_left_as_the_operator_chose(cases_root):
    cases_root.mkdir(mode=0o700)
    ensure_cases_root()
    assert mode(cases_root) == 0o700


@pytest.fixture
def foreign_root(cases_root):
    """A cases root other accounts can list, owned by another account than the service."""
    if os.geteuid() != 0:
        pytest.skip("giving the cases root to another account needs root")
    cases_root.mkdir()
    os.chmod(cases_root, 0o755)  # noqa: S103
    os.chown(cases_root, 65534, -1)  # nobody
    return cases_root


def test_a_listable_cases_root_of_another_account_is_refused_naming_the_fix(
    api, owner, local_pool, foreign_root, caplog
):
    with pytest.raises(CasesRootError, match="chmod 0711"):
        ensure_cases_root()
    with caplog.at_level(logging.ERROR):
        response = api(owner).post(
            "/api/v1/cases/", {"name": "c", "resource_class": local_pool.classes.get().pk, "command": "true"}
        )
    assert response.status_code == 503 and "operator" in response.json()["detail"]
    assert f"chmod 0711 {foreign_root}" in caplog.text
    assert mode(foreign_root) == 0o755 and not list(foreign_root.iterdir())  # nothing created there


def test_a_heartbeat_still_writes_its_marker_under_a_root_it_cannot_close(foreign_root, caplog):
    now = datetime.now(UTC)
    with caplog.at_level(logging.WARNING):
        hosts.write_marker("host-a", now)
    assert hosts.read_marker("host-a") == now and "chmod 0711" in caplog.text
