"""Fixtures for cases: an isolated cases root, the fake backend serving local pools."""

import pytest

from apps.backends.fake import FakeBackend
from apps.cases import passes, services
from apps.cases.models import Case


@pytest.fixture(autouse=True)
def cases_root(settings, tmp_path):
    settings.GRIDGATE_CASES_ROOT = tmp_path / "cases"
    settings.GRIDGATE_CASE_BACKENDS = {"local": "fake", "slurm": "slurm"}
    FakeBackend.reset()
    yield settings.GRIDGATE_CASES_ROOT
    FakeBackend.reset()


@pytest.fixture
def fake():
    return FakeBackend()


@pytest.fixture
def make_case(owner, local_pool):
    def make(user=None, resource_class=None, **kwargs):
        kwargs.setdefault("name", "cavity")
        kwargs.setdefault("command", "run-solver")
        return services.create_case(
            owner=user or owner, resource_class=resource_class or local_pool.classes.get(), **kwargs
        )

    return make


def launched(case, **kwargs):
    """Launch ``case`` (the request half: records it) and run the worker's submit step for it now
    (R-CASE-1); returns the case as the worker left it (pending, failed, or prepared on retry)."""
    services.launch_case(case, **kwargs)
    passes.submit_pass(case_ids=[case.id])
    case.refresh_from_db()
    return case


def drive(case, *, max_passes=10, until=None):
    """Run poll passes on one case until it reaches ``until`` (default: any terminal status)."""
    for _ in range(max_passes):
        passes.poll_pass(case_ids=[case.id])
        case.refresh_from_db()
        if (until and case.status == until) or (until is None and case.is_terminal):
            return case
    return case


def statuses(case: Case) -> list[tuple[str, str]]:
    return list(case.events.exclude(to_status="").values_list("from_status", "to_status"))
