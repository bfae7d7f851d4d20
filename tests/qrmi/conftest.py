"""MUNGE for the QRMI tests: a real munged (started here when it is not running) makes the
credentials, and the server verifies them with it (R-QRMI-2). Under CI=true a missing munged is
a failure; elsewhere the tests skip with the reason."""

import functools
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from django.db import connection
from rest_framework.test import APIClient

from apps.qrmi.models import UnixAccount
from apps.resources.models import ResourceClass, ResourcePool
from apps.scheduling import passes as scheduling
from apps.scheduling.models import Device
from tests import factories

ROOT = Path(__file__).resolve().parents[2]
CI = os.environ.get("CI", "").lower() == "true"
USER_UID = 65534  # "nobody": exists everywhere, so setpriv and munge accept it


@functools.cache
def munge_problem() -> str:
    """Start munged if needed (scripts/munge-local.sh, idempotent); '' when it answers."""
    try:
        done = subprocess.run(
            [str(ROOT / "scripts" / "munge-local.sh"), "start"], capture_output=True, text=True, timeout=300
        )
    except OSError as exc:
        return f"cannot run scripts/munge-local.sh: {exc}"
    if done.returncode != 0:
        return f"munged is not available: {(done.stderr or done.stdout).strip()[-300:]}"
    return ""


def need(problem: str) -> None:
    if problem:
        if CI:
            pytest.fail(f"CI=true: {problem}")
        pytest.skip(problem)


@pytest.fixture(scope="session")
def munged():
    need(munge_problem())


@pytest.fixture
def cred(munged):
    """``cred(uid=0, ttl=None)`` → a fresh MUNGE credential signed by ``uid`` (other uids than
    our own through ``setpriv``, which needs root)."""

    def make(uid: int = 0, ttl: int | None = None) -> str:
        command = ["munge", "--no-input"] + ([f"--ttl={ttl}"] if ttl else [])
        if uid != os.getuid():
            need("" if os.getuid() == 0 else "making credentials for another uid needs root (setpriv)")
            command = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *command]
        return subprocess.run(command, capture_output=True, text=True, check=True, timeout=30).stdout.strip()

    return make


@pytest.fixture
def qrmi(cred):
    """``qrmi(uid)`` → an APIClient whose every request carries a fresh credential of ``uid``
    (``uid=None``: no credential)."""

    class Client(APIClient):
        def __init__(self, uid):
            super().__init__()
            self.uid = uid

        def generic(self, method, path, *args, **extra):
            if self.uid is not None:
                extra.setdefault("HTTP_X_MUNGE_CRED", cred(self.uid))
            return super().generic(method, path, *args, **extra)

    return Client


def link(user, uid: int):
    UnixAccount.objects.create(user=user, unix_uid=uid)
    return user


@pytest.fixture
def qpu(db):
    """A QPU pool with an emulator device (AnalogDevice) and 4 slots."""
    pool = factories.pool("fresnel", slots_total=4)
    factories.emulator(pool, "emu")
    return pool


@pytest.fixture
def alice(owner):
    """The job's user, linked to uid 65534."""
    return link(owner, USER_UID)


@pytest.fixture
def bob(member):
    """Another user, linked to uid 1001."""
    return link(member, 1001)


@pytest.fixture
def open_qrmi_session(qpu, alice):
    """A session of alice on the QPU pool, as acquire would open it."""

    def make(external_id: str = "", slots: int = 1):
        return factories.session(qpu, alice, slots=slots, external_id=external_id)

    return make


@pytest.fixture
def live_qpu(munged, live_server, settings, django_user_model):
    """A live Gridgate for the end-to-end client tests (``live_server``, on a port chosen at
    runtime) whose tasks run eagerly in its request threads, with a ticker thread sweeping the
    pools every half second like the workers' ``scheduling.tick``: a submitted job is
    dispatched, emulated and polled to completion by the code the workers run. Yields the QPU
    pool, the user linked to uid 65534, and the pool's QRMI base URL."""
    need("" if os.getuid() == 0 else "the end-to-end test runs the user's part as uid 65534 (setpriv needs root)")
    probe = subprocess.run(
        [
            "setpriv",
            f"--reuid={USER_UID}",
            f"--regid={USER_UID}",
            "--clear-groups",
            sys.executable,
            "-c",
            "import qrmi",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    need(
        ""
        if probe.returncode == 0
        else f"uid {USER_UID} cannot run {sys.executable} with qrmi (the interpreter, the venv and their parent "
        f"folders must be readable by it): {probe.stderr.strip()[-300:]}"
    )
    settings.GRIDGATE_TASKS_EAGER = True
    pool = ResourcePool.objects.create(name="fresnel", kind="local", public=True, slots_total=2)
    ResourceClass.objects.create(pool=pool, name="access", cpu=1, memory=1, default=True)
    Device.objects.create(pool=pool, name="emu", driver="emulator", config={"pulser_device": "AnalogDevice"})
    user = django_user_model.objects.create_user("nobody-user")
    UnixAccount.objects.create(user=user, unix_uid=USER_UID)
    stop = threading.Event()

    def tick():  # the workers' sweep (R-SCHED-5's safety net): polls what the events did not
        try:
            while not stop.wait(0.5):
                scheduling.sweep()
        finally:
            connection.close()

    ticker = threading.Thread(target=tick, name="ticker", daemon=True)
    ticker.start()
    yield pool, user, f"{live_server.url}/qrmi/{pool.name}"
    stop.set()
    ticker.join(timeout=30)


RESOURCE = "fresnel"  # the QPU resource name a site configures in Slurm (qpu.conf)


def run_client(script: Path, mode: str, url: str, *, uid: int = 0, timeout: int = 180, **variables) -> dict:
    """Run ``script mode`` as ``uid`` (``setpriv``) with a Slurm job's QRMI environment for
    RESOURCE at ``url`` plus ``variables``, in a throwaway HOME; its last output line, as JSON."""
    import json
    import tempfile

    home = tempfile.mkdtemp(prefix="qrmi-home-")
    os.chmod(home, 0o777)  # noqa: S103 - a throwaway HOME the unprivileged uid can write (matplotlib)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": home,
        "MPLCONFIGDIR": home,
        "PYTHONDONTWRITEBYTECODE": "1",
        "QRMI_JOB_QPU_RESOURCES": RESOURCE,
        f"{RESOURCE}_QRMI_WARDEN_URL": url,
        "QRMI_JOB_UID": str(USER_UID),
        "QRMI_JOB_ID": "4242",
        **variables,
    }
    command = [sys.executable, str(script), mode]
    if uid != os.getuid():
        command = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *command]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, cwd=home)
    assert done.returncode == 0, f"{script.name} '{mode}' as uid {uid} failed:\n{done.stdout}\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])
