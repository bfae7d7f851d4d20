"""SPEC §10: stopping the web or worker process with SIGTERM (or Ctrl-C of `make run`) ends it and
everything it started within its grace period. Bounded waits, no timing assertions."""

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


def alive(pid: int) -> bool:
    """Running (a zombie nobody reaped yet has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def wait_until(predicate, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


STUBBORN = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # like a django-q2 cluster wedged in its handler
deaf = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
grandchild = subprocess.Popen([sys.executable, "-c", deaf])
open(sys.argv[1], "w").write(f"{os.getpid()} {grandchild.pid}")
time.sleep(600)
"""


def test_supervisor_kills_a_command_that_ignores_sigterm_after_the_grace_period(tmp_path):
    """The django-q2 #346 hang: a cluster that never honours SIGTERM is killed with its children."""
    pids_file = tmp_path / "pids"
    runner = (
        "import sys; from apps.core.supervise import supervise; "
        f"sys.exit(supervise([sys.executable, '-c', {STUBBORN!r}, {str(pids_file)!r}], grace=1))"
    )
    supervisor = subprocess.Popen([sys.executable, "-c", runner], cwd=ROOT)
    try:
        assert wait_until(lambda: pids_file.exists() and pids_file.read_text().strip(), 60)
        pids = [int(p) for p in pids_file.read_text().split()]
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(timeout=60) == 1  # killed, not a clean stop
        assert wait_until(lambda: not any(alive(p) for p in pids), 30), "a supervised process survived"
    finally:
        supervisor.kill()


def test_supervisor_stops_a_cooperative_command_cleanly(tmp_path):
    ready = tmp_path / "ready"
    child = f"import time, pathlib; pathlib.Path({str(ready)!r}).touch(); time.sleep(600)"
    runner = (
        "import sys; from apps.core.supervise import supervise; "
        f"sys.exit(supervise([sys.executable, '-c', {child!r}], grace=60))"
    )
    supervisor = subprocess.Popen([sys.executable, "-c", runner], cwd=ROOT)
    try:
        assert wait_until(ready.exists, 60)
        supervisor.send_signal(signal.SIGINT)  # Ctrl-C reaches the supervisor only
        assert supervisor.wait(timeout=60) == 0
    finally:
        supervisor.kill()


def test_supervisor_stops_the_ticker_when_the_cluster_dies():
    """`manage.py worker` runs the cluster and the ticker side by side; a ticker left alone would
    beat the heartbeat of a worker that runs no tasks. One exits: both end."""
    survivor = "import time; time.sleep(600)"
    crash = "import sys, time; time.sleep(0.5); sys.exit(3)"
    runner = (
        "import sys; from apps.core.supervise import supervise; "
        f"sys.exit(supervise([sys.executable, '-c', {survivor!r}], [sys.executable, '-c', {crash!r}], grace=30))"
    )
    supervisor = subprocess.Popen([sys.executable, "-c", runner], cwd=ROOT)
    try:
        # It returns only once every child has ended: the survivor was stopped, not left behind.
        assert supervisor.wait(timeout=60) == 3  # the crash's own code, for the service manager
    finally:
        supervisor.kill()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers(port: int) -> bool:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/", timeout=5)  # noqa: S310 - local
    except urllib.error.HTTPError:
        return True  # 401: the application answered
    except OSError:
        return False
    return True


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_make_run_stops_web_and_worker_on_ctrl_c_and_sigterm(signum, tmp_path):
    """scripts/run.sh (what `make run` starts): gunicorn and the supervised worker both end."""
    db = connection.settings_dict
    port = free_port()
    env = dict(
        os.environ,
        DATABASE_URL=f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
        PYTHON=sys.executable,
        PORT=str(port),
        DEBUG="true",
        GRIDGATE_STOP_GRACE="5",
        GRIDGATE_WEB_WORKERS="1",
        GRIDGATE_WEB_THREADS="2",
        GRIDGATE_VAR_DIR=str(tmp_path),
    )
    # As from a terminal: SIGINT at its default (a shell cannot trap a signal ignored on entry, and
    # a test runner started in the background inherits SIGINT ignored).
    run = subprocess.Popen(
        ["scripts/run.sh"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509 - no threads touched
    )
    started: set[int] = set()
    try:
        assert wait_until(lambda: answers(port), 180), "the web server never answered"
        assert wait_until(lambda: any("qcluster" in _cmdline(p) for p in descendants(run.pid)), 180)
        started = descendants(run.pid)
        assert any("gunicorn" in _cmdline(p) for p in started)
        run.send_signal(signum)
        run.wait(timeout=180)  # grace 5 s for each; generous for a loaded machine
        assert wait_until(lambda: not any(alive(p) for p in started), 30), [_cmdline(p) for p in started if alive(p)]
    finally:
        if run.poll() is None:
            run.kill()
        # A failed stop must not leak processes, including those a cluster forked after `started`
        # was taken: each of web and worker leads its own process group (setsid in run.sh).
        for pid in started | descendants(run.pid):
            try:
                group = os.getpgid(pid)
                if group != os.getpgrp():  # never this test run's own group
                    os.killpg(group, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


LIFELINE_CHILD = """
import os, subprocess, sys, time
from apps.core.supervise import watch_lifeline
assert watch_lifeline()  # what Django's start does in a supervised child (apps.core.apps)
forked = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # like a cluster's workers
open(sys.argv[1], "w").write(f"{os.getpid()} {forked.pid}")
time.sleep(600)
"""


def test_a_supervisor_killed_with_sigkill_takes_its_children_and_theirs_with_it(tmp_path):
    """What the OOM killer or `systemctl kill -s KILL` does to `manage.py worker`: the supervisor
    runs no code, and its children, each in a session of its own, were left running (a restart
    then ran a second cluster beside them). The lifeline's end of file ends each child's group."""
    pids_file = tmp_path / "pids"
    runner = (
        "import sys; from apps.core.supervise import supervise; "
        f"sys.exit(supervise([sys.executable, '-c', {LIFELINE_CHILD!r}, {str(pids_file)!r}], grace=30))"
    )
    supervisor = subprocess.Popen([sys.executable, "-c", runner], cwd=ROOT)
    pids: list[int] = []
    try:
        assert wait_until(lambda: pids_file.exists() and len(pids_file.read_text().split()) == 2, 60)
        pids = [int(p) for p in pids_file.read_text().split()]
        supervisor.kill()
        supervisor.wait(timeout=30)
        assert wait_until(lambda: not any(alive(p) for p in pids), 30), "a supervised process outlived its supervisor"
    finally:
        supervisor.kill()
        for pid in pids:
            try:
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def test_the_lifeline_is_not_watched_outside_a_supervisor(monkeypatch):
    from apps.core.supervise import LIFELINE_ENV, watch_lifeline

    monkeypatch.delenv(LIFELINE_ENV, raising=False)
    assert watch_lifeline() is False
    monkeypatch.setenv(LIFELINE_ENV, "9999")  # inherited without its pipe: never acted on
    assert watch_lifeline() is False
