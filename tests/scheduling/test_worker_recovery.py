"""Real worker clusters (``manage.py worker``: qcluster + ticker, in subprocesses), on the ORM
broker and on Redis: a job runs to completion, and a cluster killed with SIGKILL mid-simulation
loses nothing: the other cluster's ticker takes the loop over, its recovery pass re-runs the run,
and the job completes. Short cadences come from the environment; every wait is a bounded poll.

Redis is the machine's (127.0.0.1:6379), database index 7 only (flushed before and after, never
FLUSHALL). Under CI (CI=true) a Redis that does not answer fails these tests instead of skipping
them; `.ci/run` starts redis-server when `redis-cli ping` does not answer.
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from apps.core.models import Lease, WorkerHeartbeat
from apps.core.ticker import TICK_LEASE
from apps.scheduling import services
from apps.scheduling.models import Device, DriverRun, Job, JobStatus
from tests.core.test_process_stop import alive, descendants, wait_until
from tests.scheduling.pulser_sequences import analog_sequence, custom_sequence

ROOT = Path(__file__).resolve().parents[2]
REDIS_URL = os.environ.get("GRIDGATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/7")

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture(params=["orm", "redis"])
def broker(request, monkeypatch):
    """The broker the clusters use: None for the ORM broker (the default), else Redis db 7,
    emptied, which this test process enqueues to as well (as a web process would)."""
    if request.param == "orm":
        yield None
        return
    import redis
    from django_q.conf import Conf

    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"Redis is not answering at {REDIS_URL} ({exc}); .ci/run starts it")
        pytest.skip(f"Redis is not answering at {REDIS_URL}")
    client.flushdb()  # this index only
    monkeypatch.setattr(Conf, "ORM", None)
    monkeypatch.setattr(Conf, "REDIS", REDIS_URL)
    yield REDIS_URL
    client.flushdb()


class Clusters:
    """Worker clusters this test started; each is killed with everything it started at the end."""

    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.started: dict[str, subprocess.Popen] = {}

    def start(self, host: str, redis_url: str | None, **settings) -> subprocess.Popen:
        db = connection.settings_dict
        env = dict(
            os.environ,
            DATABASE_URL=f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
            DEBUG="true",
            GRIDGATE_VAR_DIR=str(self.tmp_path),
            GRIDGATE_WORKER_HOST=host,
            GRIDGATE_Q_WORKERS="2",
            GRIDGATE_STOP_GRACE="5",
            GRIDGATE_TICK_LEASE_SECONDS="2",
            GRIDGATE_WORKER_HEARTBEAT_SECONDS="1",
            GRIDGATE_EMULATOR_HEARTBEAT_SECONDS="1",
            GRIDGATE_EMULATOR_DEAD_AFTER="3",
        )
        env.update(settings)
        env.pop("GRIDGATE_REDIS_URL", None)
        if redis_url:
            env["GRIDGATE_REDIS_URL"] = redis_url
            env["GRIDGATE_REDIS_ALLOW_NO_AUTH"] = "true"  # the test machine's Redis has no password
        log = open(self.tmp_path / f"worker-{host}.log", "ab")  # noqa: SIM115 - closed with the process
        process = subprocess.Popen(
            [sys.executable, "manage.py", "worker", "--grace", "5"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.started[host] = process
        return process

    def kill(self, host: str) -> None:
        """SIGKILL the cluster and every process it started (a machine's death)."""
        process = self.started[host]
        for pid in {process.pid} | descendants(process.pid):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        process.wait(timeout=30)

    def log(self, host: str) -> str:
        return (self.tmp_path / f"worker-{host}.log").read_text(errors="replace")[-4000:]

    def kill_all(self) -> None:
        for host, process in self.started.items():
            if process.poll() is None:
                self.kill(host)


@pytest.fixture
def clusters(tmp_path):
    started = Clusters(tmp_path)
    yield started
    started.kill_all()  # a clean stop is tested in tests/core/test_process_stop.py
    connection.close()


def beating(host: str) -> bool:
    seen = WorkerHeartbeat.objects.filter(name=host).values_list("seen_at", flat=True).first()
    return seen is not None and (timezone.now() - seen).total_seconds() < 5


@pytest.mark.parametrize("broker", ["redis"], indirect=True)  # the ORM broker: the kill test below
def test_worker_runs_an_emulator_job_to_completion(broker, clusters, qpu_pool, owner, open_session):
    from django_q.models import OrmQ, Success

    clusters.start("solo", broker)
    Device.objects.create(pool=qpu_pool, name="emu", driver="emulator")
    session = open_session(qpu_pool, owner)
    job = services.submit_job(
        user=owner, session_id=session.pk, payload={"sequence": analog_sequence(atoms=3)}, shots=50
    )
    done = wait_until(lambda: Job.objects.get(pk=job.pk).status in (JobStatus.COMPLETED, JobStatus.FAILED), 120)
    job.refresh_from_db()
    assert done and job.status == JobStatus.COMPLETED, (job.status, job.error, clusters.log("solo"))
    assert sum(job.result["counts"].values()) == 50
    # The cluster records the task's success once it returns (the job completed inside it).
    assert wait_until(Success.objects.filter(func="apps.scheduling.tasks.run_emulation").exists, 30)
    if broker:
        assert not OrmQ.objects.exists()  # the tasks went through Redis, not the database
    assert beating("solo")


def test_cluster_killed_mid_simulation_loses_nothing(broker, clusters, qpu_pool, owner, open_session):
    """SIGKILL the cluster running a simulation; the other cluster re-runs it (the heartbeat
    stopped: not the broker's retry, 6 minutes later) and the job completes. With the ORM broker
    the killed cluster's task stays locked until that retry, and is then skipped."""
    clusters.start("kill-a", broker)
    clusters.start("kill-b", broker)
    assert wait_until(lambda: beating("kill-a") and beating("kill-b"), 120), clusters.log("kill-a")
    Device.objects.create(pool=qpu_pool, name="emu", driver="emulator", config={"max_atoms": 12})
    session = open_session(qpu_pool, owner)
    # 12 atoms for 5.5 µs: seconds of simulation, long enough to be killed in the middle.
    payload = {"sequence": custom_sequence(rows=3, columns=4, duration=5500)}
    job = services.submit_job(user=owner, session_id=session.pk, payload=payload, shots=20)

    def started():
        return DriverRun.objects.filter(remote_id=f"emu-{job.pk}", status="running").first()

    assert wait_until(lambda: started() is not None, 120), clusters.log("kill-a") + clusters.log("kill-b")
    victim = started().worker.split(":")[0]
    survivor = "kill-b" if victim == "kill-a" else "kill-a"
    killed_at = timezone.now()
    clusters.kill(victim)

    done = wait_until(lambda: Job.objects.get(pk=job.pk).status in (JobStatus.COMPLETED, JobStatus.FAILED), 120)
    job.refresh_from_db()
    run = DriverRun.objects.get(remote_id=job.remote_id)
    assert done and job.status == JobStatus.COMPLETED, (job.status, job.error, clusters.log(survivor))
    assert sum(job.result["counts"].values()) == 20
    assert run.attempts == 2 and run.worker.startswith(f"{survivor}:")  # re-run once, by the survivor
    print(f"killed → re-run started after {(run.started_at - killed_at).total_seconds():.1f} s")
    assert wait_until(lambda: Lease.objects.filter(name=TICK_LEASE, owner__startswith=f"{survivor}:").exists(), 30)
    assert beating(survivor) and not beating(victim)


def terminate_other_connections() -> int:
    """``pg_terminate_backend`` of every connection to this database but the test's own (what a
    PostgreSQL restart, ``pg_ctlcluster … restart -m fast``, does to the workers' connections)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


@pytest.mark.parametrize("broker", ["orm", "redis"], indirect=True)
def test_a_database_blip_mid_emulation_costs_seconds_not_the_device(broker, clusters, qpu_pool, owner, open_session):
    """Every connection of the worker is terminated while it simulates. The simulation's outcome
    is recorded by its own worker once the database answers again, and the job completes: the
    device is given back within seconds, the simulation run once. Before, the task failed on
    "terminating connection due to administrator command" and the run kept its device slot until
    the dead-worker timeout (here 600 s, far beyond this test's bounded wait: only the worker's
    own recording can complete the job in time)."""
    clusters.start("blip", broker, GRIDGATE_EMULATOR_DEAD_AFTER="600")
    assert wait_until(lambda: beating("blip"), 120), clusters.log("blip")
    Device.objects.create(pool=qpu_pool, name="emu", driver="emulator", config={"max_atoms": 14})
    session = open_session(qpu_pool, owner)
    # 14 atoms for 5.5 µs: about ten seconds of simulation, time to pull the database away.
    payload = {"sequence": custom_sequence(rows=2, columns=7, duration=5500)}
    job = services.submit_job(user=owner, session_id=session.pk, payload=payload, shots=20)
    assert wait_until(lambda: DriverRun.objects.filter(remote_id=f"emu-{job.pk}", status="running").exists(), 120)
    blip_at = timezone.now()
    assert terminate_other_connections() > 0
    done = wait_until(lambda: Job.objects.get(pk=job.pk).status in (JobStatus.COMPLETED, JobStatus.FAILED), 120)
    job.refresh_from_db()
    run = DriverRun.objects.get(remote_id=job.remote_id)
    assert done and job.status == JobStatus.COMPLETED, (job.status, job.error, clusters.log("blip"))
    assert run.finished_at > blip_at  # the blip hit the simulation, not after it
    assert run.attempts == 1  # recorded by its own worker: not re-run
    assert sum(job.result["counts"].values()) == 20
    assert not Job.objects.filter(device__name="emu", status=JobStatus.RUNNING).exists()  # the device is free
    print(f"database blip → job completed {(job.finished_at - blip_at).total_seconds():.1f} s later")
