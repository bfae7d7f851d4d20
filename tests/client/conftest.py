"""The gridgate CLI and the Python client against a live Gridgate: pytest-django's live server
with a worker thread beside it (the browser tests' ``site`` and ``worker``: tasks run eagerly, the
case passes and the scheduling sweep loop like ``manage.py worker``). The CLI runs as a user runs
it, a subprocess (``python -m gridgate_client``) with its own config directory, its output piped
(so no progress bar), its exit status and stdout/stderr read as a script would."""

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import factories
from tests.backends.conftest import link_account, sandbox_host  # noqa: F401 - local cases run as real accounts
from tests.browser.conftest import site, worker  # noqa: F401 - the live server and its worker thread

ROOT = Path(__file__).resolve().parents[2]
README_SEQUENCE = ROOT / "examples" / "bell-like-analog.json"


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str

    def json(self):
        return json.loads(self.stdout)


@pytest.fixture
def pools(transactional_db):
    """The demo's shape: a local pool for cases, a QPU pool with an emulator for jobs."""
    local = factories.pool("local", default=True, class_name="small", memory=2)
    qpu = factories.pool("qpu", slots_total=4)
    factories.emulator(qpu, "emulator")
    return {"local": local, "qpu": qpu}


@pytest.fixture
def alice(transactional_db):
    return factories.user("alice", password="alice-pw")


@pytest.fixture
def gridgate(site, tmp_path):  # noqa: F811 - the imported fixture, asked for
    """``gridgate(*args, stdin="")`` runs the CLI against the live server; a fresh config dir."""
    home = tmp_path / "home"
    home.mkdir()

    def run(*args, stdin: str = "", env: dict | None = None, timeout: int = 240) -> Run:
        environment = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "GRIDGATE_URL": site.url,
            # the client the tests import (a checkout's client/src first on PYTHONPATH), not another
            **({"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}),
            **(env or {}),
        }
        done = subprocess.run(
            [sys.executable, "-m", "gridgate_client", *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=environment,
            cwd=ROOT,
            timeout=timeout,
        )
        return Run(done.returncode, done.stdout, done.stderr)

    run.home = home
    return run
