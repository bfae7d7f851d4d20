"""A worker dies whole, and a worker host name runs one cluster at a time (real `manage.py worker`
processes on PostgreSQL). `kill -9` of the supervisor (the OOM killer, `systemctl kill -s KILL`
with the documented KillMode=process) left its cluster and ticker running as orphans, and a
restart then ran a second cluster under the same name. Every wait is a bounded poll, no timing
assertion."""

import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from apps.core.models import Lease
from apps.core.worker_host import lease_name
from tests.core.test_process_stop import alive, descendants, wait_until

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


class Workers:
    """`manage.py worker` processes of one host name, sharing one var directory (one machine)."""

    def __init__(self, tmp_path: Path, host: str):
        self.tmp_path, self.host = tmp_path, host
        self.started: list[subprocess.Popen] = []
        self.seen: set[int] = set()  # every process any of them ever had, for the clean-up

    def start(self) -> subprocess.Popen:
        db = connection.settings_dict
        env = dict(
            os.environ,
            DATABASE_URL=f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
            DEBUG="true",
            GRIDGATE_VAR_DIR=str(self.tmp_path),
            GRIDGATE_WORKER_HOST=self.host,
            GRIDGATE_Q_WORKERS="2",
            GRIDGATE_STOP_GRACE="5",
            GRIDGATE_WORKER_LEASE_SECONDS="3",
            GRIDGATE_TICK_LEASE_SECONDS="2",
            GRIDGATE_WORKER_HEARTBEAT_SECONDS="1",
        )
        env.pop("GRIDGATE_REDIS_URL", None)
        log = open(self.log_path(len(self.started)), "ab")  # noqa: SIM115 - closed with the process
        process = subprocess.Popen(
            [sys.executable, "manage.py", "worker", "--grace", "5"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # never in this test run's own group
        )
        log.close()
        self.started.append(process)
        return process

    def log_path(self, index: int) -> Path:
        return self.tmp_path / f"worker-{index}.log"

    def log(self, index: int) -> str:
        return self.log_path(index).read_text(errors="replace")[-4000:]

    def tree(self, process: subprocess.Popen) -> set[int]:
        found = {pid for pid in descendants(process.pid) if alive(pid)}
        self.seen |= found
        return found

    def clusters(self, process: subprocess.Popen) -> list[int]:
        """Its cluster masters (a supervisor's child running qcluster)."""
        return [pid for pid in self.tree(process) if "manage.py qcluster" in cmdline(pid) and _ppid(pid) == process.pid]

    def running(self, process: subprocess.Popen) -> bool:
        """Its cluster and its ticker both started."""
        tree = self.tree(process)
        return any("qcluster" in cmdline(p) for p in tree) and any("manage.py ticker" in cmdline(p) for p in tree)

    def kill_all(self) -> None:
        for process in self.started:
            self.tree(process)
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)
        for pid in self.seen:
            if "manage.py" not in cmdline(pid):
                continue  # gone, and its pid maybe another's now (a case's sandbox on the other xdist worker)
            try:
                group = os.getpgid(pid)
                if group != os.getpgrp():
                    os.killpg(group, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


@pytest.fixture
def workers(tmp_path):
    started = Workers(tmp_path, "solo-host")
    yield started
    started.kill_all()
    connection.close()


def test_kill_9_of_a_real_worker_leaves_no_process_and_a_restart_runs_one_cluster(workers):
    first = workers.start()
    assert wait_until(lambda: workers.running(first), 180), workers.log(0)
    old = workers.tree(first)
    first.send_signal(signal.SIGKILL)  # the supervisor alone, as the OOM killer or systemd would
    first.wait(timeout=30)
    assert wait_until(lambda: not any(alive(pid) for pid in old), 30), [cmdline(p) for p in old if alive(p)]

    second = workers.start()
    assert wait_until(lambda: workers.running(second), 180), workers.log(1)
    assert len(workers.clusters(second)) == 1
    assert not any(alive(pid) for pid in old)  # one cluster for the host: the restarted one
    owner = Lease.objects.get(name=lease_name("solo-host")).owner
    assert owner.split(":")[1] == str(second.pid)


def test_a_second_worker_of_the_same_host_name_waits_until_the_first_has_stopped(workers):
    first = workers.start()
    assert wait_until(lambda: workers.running(first), 180), workers.log(0)
    second = workers.start()
    assert wait_until(lambda: "waiting until none of them is left" in workers.log(1), 120), workers.log(1)
    assert workers.tree(second) == set()  # waiting: no cluster, no ticker of its own
    old = workers.tree(first)
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=60) == 0
    assert wait_until(lambda: workers.running(second), 180), workers.log(1)
    assert not any(alive(pid) for pid in old)


def test_a_worker_waits_for_its_host_lease_held_from_another_machine_and_takes_it_once_expired(workers):
    """The same GRIDGATE_WORKER_HOST on another machine (the lock file cannot see it): the lease."""
    Lease.objects.create(
        name=lease_name("solo-host"), owner="node-b:4242:deadbeef", expires_at=timezone.now() + timedelta(minutes=10)
    )
    worker = workers.start()
    assert wait_until(lambda: "node-b:4242:deadbeef" in workers.log(0), 120), workers.log(0)
    assert workers.tree(worker) == set()
    Lease.objects.filter(name=lease_name("solo-host")).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert wait_until(lambda: workers.running(worker), 180), workers.log(0)
    assert Lease.objects.get(name=lease_name("solo-host")).owner.split(":")[1] == str(worker.pid)


def test_a_worker_whose_host_lease_was_taken_over_stops_its_cluster(workers):
    """It could not renew its lease for longer than its length (the database was away) and the
    host's name went to a worker elsewhere: it stops, and its service manager restarts it to wait."""
    worker = workers.start()
    assert wait_until(lambda: workers.running(worker), 180), workers.log(0)
    Lease.objects.filter(name=lease_name("solo-host")).update(
        owner="node-b:4242:deadbeef", expires_at=timezone.now() + timedelta(minutes=10)
    )
    assert worker.wait(timeout=120) == 1, workers.log(0)
    assert "taken over by node-b:4242:deadbeef" in workers.log(0)
