"""The FirecREST backend against the local FirecREST v2 double (tests/doubles/firecrest_server.py),
with the real pyfirecrest client over HTTP (R-BACK-1, R-BACK-4, R-CASE-1 … 6)."""

import pytest

from apps.backends import firecrest as fc
from apps.cases import services, workspace
from apps.cases.models import CaseStatus
from apps.resources.models import ResourceClass, ResourcePool
from tests.backends.conftest import wait_for_terminal
from tests.doubles.firecrest_server import FirecrestDouble

pytestmark = pytest.mark.django_db

SECRET = "s3cr3t-client-VALUE-42"


@pytest.fixture
def double(tmp_path, monkeypatch):
    monkeypatch.setenv("GG_FC_ID", "gridgate-client")
    monkeypatch.setenv("GG_FC_SECRET", SECRET)
    monkeypatch.setattr(fc, "TIMEOUT", 5.0)
    monkeypatch.setattr(fc, "FIND_AFTER_TIMEOUT_SLEEP", 0.05)
    fc._clients.clear()
    server = FirecrestDouble(tmp_path / "hpc", client_secret=SECRET).start()
    yield server
    server.stop()
    fc._clients.clear()


@pytest.fixture
def fc_pool(double):
    pool = ResourcePool.objects.create(
        name="daint",
        kind="firecrest",
        public=True,
        remote={
            "api_url": double.url,
            "token_uri": double.token_uri,
            "system_name": double.system,
            "partition": "debug",
            "working_root": str(double.fs_root / "scratch"),
            "client_id_env": "GG_FC_ID",
            "client_secret_env": "GG_FC_SECRET",
        },
    )
    ResourceClass.objects.create(pool=pool, name="node", cpu=1, memory=1, default=True)
    return pool


def test_smoke_lifecycle(fc_pool, make_case, double):
    case = make_case(
        resource_class=fc_pool.classes.get(),
        command="cat in.txt > out.txt; echo hello; mkdir -p out; echo 0.5 > .gridgate/progress; echo part > out/p.txt; sleep 1",
    )
    (workspace.case_dir(case.id) / "inputs" / "in.txt").write_text("input\n")
    case = services.launch_case(case)
    assert case.status == CaseStatus.PENDING, case.last_error
    case = wait_for_terminal(case, timeout=30)
    assert case.status == CaseStatus.DONE, case.last_error
    assert (workspace.case_dir(case.id) / "results" / "out.txt").read_text() == "input\n"
