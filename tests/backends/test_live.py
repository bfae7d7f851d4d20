"""Live round trips against real FirecREST, Qarnot and Run:AI accounts (they cost credit).

Skipped, with the reason printed (``-rs``), unless the credentials and the opt-in flag are in the
environment; CI has neither. They assert the three claims the design rests on and a double cannot
prove: inputs arrive in the remote working directory, a partial result comes back while the job
runs, and the full results land on local disk.

- Qarnot: ``GRIDGATE_LIVE_QARNOT=1``, ``GRIDGATE_LIVE_QARNOT_TOKEN``, optionally
  ``GRIDGATE_LIVE_QARNOT_PROFILE`` (default ``docker-batch``) and ``GRIDGATE_LIVE_QARNOT_CLUSTER_URL``.
- Run:AI: ``GRIDGATE_LIVE_RUNAI=1``, ``GRIDGATE_LIVE_RUNAI_BASE_URL``, ``GRIDGATE_LIVE_RUNAI_CLIENT_ID``,
  ``GRIDGATE_LIVE_RUNAI_CLIENT_SECRET``, ``GRIDGATE_LIVE_RUNAI_PROJECT``, ``GRIDGATE_LIVE_RUNAI_WORKING_ROOT``
  (the shared volume as this host sees it) and ``GRIDGATE_LIVE_RUNAI_HOST_PATH`` (the same volume on the
  cluster's nodes), optionally ``GRIDGATE_LIVE_RUNAI_IMAGE`` (default ``busybox:1.36``) and
  ``GRIDGATE_LIVE_RUNAI_NODE_POOL``.
- FirecREST: ``GRIDGATE_LIVE_FIRECREST=1``, ``GRIDGATE_LIVE_FIRECREST_CLIENT_ID``,
  ``GRIDGATE_LIVE_FIRECREST_CLIENT_SECRET``, ``GRIDGATE_LIVE_FIRECREST_API_URL``,
  ``GRIDGATE_LIVE_FIRECREST_TOKEN_URI``, ``GRIDGATE_LIVE_FIRECREST_SYSTEM``,
  ``GRIDGATE_LIVE_FIRECREST_WORKING_ROOT``, optionally ``GRIDGATE_LIVE_FIRECREST_PARTITION``.
"""

import os
import time

import pytest

from apps.cases import passes, workspace
from apps.cases.models import CaseStatus
from tests import factories
from tests.backends.conftest import launch

pytestmark = [pytest.mark.live, pytest.mark.django_db]

COMMAND = (
    "test -s in.txt && cp in.txt seen-input.txt; mkdir -p out; echo partial > out/progress.txt; "
    "sleep 90; echo final > out/final.txt"
)


def require(monkeypatch, provider: str, names: list[str], secrets=("CLIENT_ID", "CLIENT_SECRET")) -> tuple[dict, dict]:
    """The ``GRIDGATE_LIVE_<provider>_<name>`` variables by name, and the remote keys of a service pool
    whose credential is ``secrets``: each is copied to ``GRIDGATE_CRED_LIVE_<provider>_<name>``, which
    its ``<name>_env`` key names, as only GRIDGATE_CRED_* variables may hold credentials (R-BACK-1).
    Skipped, saying what to set, without ``GRIDGATE_LIVE_<provider>=1`` and them all."""
    flag, names = f"GRIDGATE_LIVE_{provider}", [f"GRIDGATE_LIVE_{provider}_{name}" for name in names]
    if os.environ.get(flag) != "1":
        pytest.skip(f"live test: set {flag}=1 and {', '.join(names)} to run it against a real account")
    missing = [name for name in names if not os.environ.get(name)]
    if missing:
        pytest.skip(f"live test: {', '.join(missing)} not set")
    env = {name.removeprefix(f"{flag}_"): os.environ[name] for name in names}
    service = {"credentials": "service"}
    for name in secrets:
        variable = f"GRIDGATE_CRED_LIVE_{provider}_{name}"
        monkeypatch.setenv(variable, env[name])
        service[f"{name.lower()}_env"] = variable
    return env, service


def round_trip(make_case, kind: str, remote: dict, **klass):
    """A case of the one class (``klass``: its name and size) of a new ``kind`` pool with ``remote``,
    there and back."""
    pool = factories.pool(f"live-{kind}", kind=kind, remote=remote, **klass)
    case = launch(make_case, pool, COMMAND, inputs={"in.txt": "live input\n"}, observability_globs=["out/*.txt"])
    assert case.status == CaseStatus.PENDING, case.last_error
    live = workspace.case_dir(case.id) / "live" / "out" / "progress.txt"
    deadline = time.monotonic() + 1800
    while time.monotonic() < deadline and not case.is_terminal:
        passes.poll_pass(case_ids=[case.id])
        passes.sync_pass(case_ids=[case.id])
        case.refresh_from_db()
        time.sleep(10)
    assert live.exists(), "no partial result came back while the job ran"
    assert case.status == CaseStatus.DONE, case.last_error
    results = workspace.case_dir(case.id) / "results"
    assert (results / "seen-input.txt").read_text() == "live input\n"  # the inputs arrived remotely
    assert (results / "out" / "final.txt").read_text() == "final\n"


def test_live_qarnot_round_trip(make_case, monkeypatch):
    env, service = require(monkeypatch, "QARNOT", ["TOKEN"], secrets=["TOKEN"])
    remote = {
        "profile": os.environ.get("GRIDGATE_LIVE_QARNOT_PROFILE", "docker-batch"),
        "snapshot_interval": 30,
        **service,
    }
    if os.environ.get("GRIDGATE_LIVE_QARNOT_CLUSTER_URL"):
        remote["cluster_url"] = os.environ["GRIDGATE_LIVE_QARNOT_CLUSTER_URL"]
    assert env["TOKEN"] not in str(remote)
    round_trip(make_case, "qarnot", remote, class_name="small", memory=2)


def test_live_firecrest_round_trip(make_case, monkeypatch):
    names = ["CLIENT_ID", "CLIENT_SECRET", "API_URL", "TOKEN_URI", "SYSTEM", "WORKING_ROOT"]
    env, service = require(monkeypatch, "FIRECREST", names)
    remote = {
        "api_url": env["API_URL"],
        "token_uri": env["TOKEN_URI"],
        "system_name": env["SYSTEM"],
        "working_root": env["WORKING_ROOT"],
        **service,
    }
    if os.environ.get("GRIDGATE_LIVE_FIRECREST_PARTITION"):
        remote["partition"] = os.environ["GRIDGATE_LIVE_FIRECREST_PARTITION"]
    round_trip(make_case, "firecrest", remote, class_name="node")


def test_live_runai_round_trip(make_case, monkeypatch):
    names = ["BASE_URL", "CLIENT_ID", "CLIENT_SECRET", "PROJECT", "WORKING_ROOT", "HOST_PATH"]
    env, service = require(monkeypatch, "RUNAI", names)
    remote = {
        "base_url": env["BASE_URL"],
        "project": env["PROJECT"],
        "image": os.environ.get("GRIDGATE_LIVE_RUNAI_IMAGE", "busybox:1.36"),
        "working_root": env["WORKING_ROOT"],
        "host_path": env["HOST_PATH"],
        **service,
    }
    if os.environ.get("GRIDGATE_LIVE_RUNAI_NODE_POOL"):
        remote["node_pool"] = os.environ["GRIDGATE_LIVE_RUNAI_NODE_POOL"]
    round_trip(make_case, "runai", remote, class_name="small")
