"""The Qarnot backend against the local Qarnot API double and moto's S3 server, with the real
qarnot SDK over HTTP (R-BACK-1, R-BACK-3, R-CASE-1 … 7). Each test maps to a defect csauto met
on a real account (seed 003), named in its docstring."""

import logging

import pytest

from apps.backends import qarnot as qb
from apps.backends.base import AlreadyFinished, BackendError, BackendStatus
from apps.cases import passes, services, workspace
from apps.cases.models import Campaign, CaseStatus
from apps.resources.models import ResourceClass, ResourcePool
from tests.backends.conftest import wait_until
from tests.doubles.qarnot_server import QarnotDouble

pytestmark = pytest.mark.django_db

TOKEN = "qarnot-TOKEN-value-9f8e7d"


@pytest.fixture(scope="module")
def double():
    server = QarnotDouble(token=TOKEN).start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def fresh(double, monkeypatch):
    monkeypatch.setenv("GG_QARNOT_TOKEN", TOKEN)
    monkeypatch.setattr(qb, "RETRY_WAIT", 0.01)
    monkeypatch.setattr(qb, "TIMEOUT", 3)
    qb._connections.clear()
    double.faults.clear()
    double.calls.clear()
    double.user = {"email": "gridgate@example.org", "maxBucket": 50, "quotaBytesBucket": 10 << 30}
    yield
    qb._connections.clear()


@pytest.fixture
def q_pool(double):
    pool = ResourcePool.objects.create(
        name="qarnot",
        kind="qarnot",
        public=True,
        remote={
            "profile": "docker-batch",
            "docker_image": "registry.example.org/solver:1.2",
            "cluster_url": double.url,
            "snapshot_interval": 1,
            "max_upload_mb": 1,
            "token_env": "GG_QARNOT_TOKEN",
        },
    )
    ResourceClass.objects.create(pool=pool, name="4c", cpu=4, memory=8, default=True)
    return pool


def launch(make_case, pool, command, *, inputs=None, **kwargs):
    case = make_case(resource_class=pool.classes.get(), command=command, **kwargs)
    for name, text in (inputs or {"in.txt": "input\n"}).items():
        (workspace.case_dir(case.id) / "inputs" / name).write_text(text)
    return services.launch_case(case)


def poll_until(case, predicate, timeout=20.0):
    def check():
        passes.poll_pass(case_ids=[case.id])
        case.refresh_from_db()
        return predicate(case)

    wait_until(check, timeout=timeout, what="case state")
    return case


def test_qarnot_case_runs_shows_live_files_and_ends_done_with_results(q_pool, make_case, double):
    """Full lifecycle (R-CASE-2 … 5): launch → running → live/ → done with results on disk."""
    case = launch(
        make_case,
        q_pool,
        "cat in.txt > out.txt; echo started; mkdir -p out; echo 0.5 > .gridgate/progress; "
        "echo partial > out/p.txt; sleep 1.5; echo final > out/p.txt; echo done; echo warn >&2",
        observability_globs=["out/*.txt"],
    )
    assert case.status == CaseStatus.PENDING, case.last_error
    task = double.tasks[case.remote_id]
    assert task.snapshot_whitelist and task.snapshot_interval == 1
    case = poll_until(case, lambda c: c.status == CaseStatus.RUNNING)

    def live_file():
        passes.sync_pass(case_ids=[case.id])
        return (workspace.case_dir(case.id) / "live" / "out" / "p.txt").exists()

    wait_until(live_file, timeout=10, what="a live file")
    case = poll_until(case, lambda c: c.is_terminal)
    assert case.status == CaseStatus.DONE, case.last_error
    root = workspace.case_dir(case.id)
    assert (root / "results" / "out.txt").read_text() == "input\n"
    assert (root / "results" / "out" / "p.txt").read_text() == "final\n"
    assert not (root / "results" / "in.txt").exists()
    assert "started" in (root / "stdout.log").read_text() and "done" in (root / "stdout.log").read_text()
    assert "warn" in (root / "stderr.log").read_text()
