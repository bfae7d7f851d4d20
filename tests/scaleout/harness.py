"""Real processes on one database and one Redis, on loopback: production web servers (gunicorn,
as ``scripts/run.sh`` starts them) and worker clusters (``manage.py worker``), each worker with
its own ``GRIDGATE_WORKER_HOST``. Shared by the scale-out test and ``bench/scaleout.py``.

Every process is started in a session of its own and stopped (or SIGKILLed) through its own
process group: nothing here signals a process it did not start.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REDIS_URL = os.environ.get("GRIDGATE_SCALEOUT_REDIS_URL", "redis://127.0.0.1:6379/9")

#: short cadences, leases and heartbeats, so recovery happens within the test's bounds. Settings
#: that do not exist on a given revision are ignored (an older revision lacks the recovery ones).
FAST = {
    "GRIDGATE_Q_WORKERS": "2",
    "GRIDGATE_STOP_GRACE": "5",
    "GRIDGATE_DISPATCH_TICK": "1",
    "GRIDGATE_JOB_POLL_INTERVAL": "1",
    "GRIDGATE_CASE_TICK_INTERVAL": "1",
    "GRIDGATE_CASE_POLL_SECONDS": "1",
    "GRIDGATE_CASE_LEASE_SECONDS": "10",
    "GRIDGATE_WORKER_STALE_SECONDS": "10",
    "GRIDGATE_WORKER_HEARTBEAT_SECONDS": "1",
    "GRIDGATE_TICK_LEASE_SECONDS": "2",
    "GRIDGATE_EMULATOR_HEARTBEAT_SECONDS": "1",
    # Eight missed beats before a live run is presumed dead and started again (which the test
    # would count as a second start): on a loaded 2-core CI host a worker's heartbeat thread can
    # wait seconds for the CPU or a WAL flush (the killed host's runs are then re-run 4 s later).
    "GRIDGATE_EMULATOR_DEAD_AFTER": "8",
    "GRIDGATE_EMULATOR_REQUEUE_SECONDS": "3",
    "GRIDGATE_LOG_LEVEL": "WARNING",
}


def redis_problem(url: str = REDIS_URL) -> str | None:
    """Why Redis cannot serve as the broker here (None when it can)."""
    try:
        import redis
    except ImportError as exc:
        return f"the redis package is not installed ({exc})"
    try:
        redis.Redis.from_url(url, socket_connect_timeout=2).ping()
    except Exception as exc:
        return f"Redis does not answer at {url}: {exc}"
    return None


def flush_redis(url: str = REDIS_URL) -> None:
    """Empty the dedicated database index of ``url`` only (FLUSHDB, never FLUSHALL)."""
    import redis

    redis.Redis.from_url(url).flushdb()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(predicate, seconds: float, every: float = 0.25) -> bool:
    """Poll ``predicate`` until true or ``seconds`` have passed (a bounded wait, not a timing test)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every)
    return bool(predicate())


@dataclass
class Processes:
    """The processes of one run; :meth:`stop_all` ends every one of them (SIGTERM, then SIGKILL)."""

    database_url: str
    var_dir: Path
    redis_url: str | None = REDIS_URL
    extra_env: dict = field(default_factory=dict)
    started: list = field(default_factory=list)

    def env(self, **more) -> dict:
        env = dict(os.environ)
        for name in ("DJANGO_SETTINGS_MODULE", "PYTEST_CURRENT_TEST", "GRIDGATE_TASKS_EAGER"):
            env.pop(name, None)
        env.update(FAST)
        env.update(
            DATABASE_URL=self.database_url,
            # One key for all: django-q2 signs each task with SECRET_KEY, and a web process's
            # task must be readable by every cluster.
            SECRET_KEY="scale-out-test-key-" + "x" * 40,
            DEBUG="false",
            ALLOWED_HOSTS="127.0.0.1",
            GRIDGATE_VAR_DIR=str(self.var_dir),
            GRIDGATE_CASES_ROOT=str(self.var_dir / "cases"),
        )
        if self.redis_url:
            env["GRIDGATE_REDIS_URL"] = self.redis_url
            env["GRIDGATE_REDIS_ALLOW_NO_AUTH"] = "true"  # the test machine's Redis has no password
        else:
            env.pop("GRIDGATE_REDIS_URL", None)
        env.update(self.extra_env)
        env.update(more)
        return env

    def _spawn(self, argv: list[str], name: str, env: dict) -> subprocess.Popen:
        log = open(self.var_dir / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        process = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        process.name = name
        self.started.append(process)
        return process

    def worker(self, host: str) -> subprocess.Popen:
        """``manage.py worker`` (a supervised django-q2 cluster) as worker host ``host``; its
        database connections name themselves after the host (:func:`database_sessions`)."""
        joiner = "&" if "?" in self.database_url else "?"
        url = f"{self.database_url}{joiner}application_name={application_name(host)}"
        env = self.env(GRIDGATE_WORKER_HOST=host, DATABASE_URL=url)
        return self._spawn([sys.executable, "manage.py", "worker"], f"worker-{host}", env)

    def web(self, name: str) -> tuple[subprocess.Popen, int]:
        """The production web server, as ``scripts/run.sh`` starts it, on a free port."""
        port = free_port()
        env = self.env(
            HOST="127.0.0.1",
            PORT=str(port),
            GRIDGATE_WORKER_HOST=name,
            GRIDGATE_WEB_WORKERS="1",
            GRIDGATE_WEB_THREADS="6",
        )
        argv = [sys.executable, "-m", "gunicorn", "-c", "config/gunicorn.conf.py", "config.wsgi:application"]
        return self._spawn(argv, name, env), port

    @staticmethod
    def kill(process: subprocess.Popen) -> None:
        """SIGKILL what we started there, all at once (a host losing power, as far as Gridgate
        sees): the supervisor's process group and its descendants' own groups (the supervisor
        starts the cluster in a session of its own). Case processes started by the local backend
        are not descendants (they are reparented to init, as they outlive a worker by design)."""
        tree = [process.pid, *descendants(process.pid)]
        for pid in tree:
            try:
                os.kill(pid, signal.SIGSTOP)  # freeze first: nobody reacts to a sibling's death
            except ProcessLookupError:
                pass
        for pid in tree:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        process.wait(timeout=30)

    def stop_all(self) -> None:
        trees = {process.pid: descendants(process.pid) for process in self.started}
        for process in self.started:
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 15
        for process in self.started:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            for pid in [process.pid, *trees[process.pid]]:  # whatever the stop left behind
                if alive(pid):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            if process.poll() is None:
                process.wait(timeout=30)

    def log_tail(self, lines: int = 15) -> str:
        out = []
        for process in self.started:
            path = self.var_dir / f"{process.name}.log"
            text = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else []
            out.append(f"--- {process.name} (exit {process.poll()})\n" + "\n".join(text))
        return "\n".join(out)


def application_name(host: str) -> str:
    """What the database connections of worker host ``host`` call themselves in pg_stat_activity."""
    return f"gridgate-worker-{host}"


def database_sessions(host: str) -> int:
    """How many PostgreSQL backends still serve worker host ``host`` (a killed host's last ones
    end once PostgreSQL has finished what they were doing, e.g. a COMMIT already sent)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [application_name(host)])
        return cursor.fetchone()[0]


def alive(pid: int) -> bool:
    """Running (a zombie has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, grandchildren…), from /proc."""
    children: dict[int, list[int]] = defaultdict(list)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children[ppid].append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def answers(port: int) -> bool:
    import requests

    try:
        requests.get(f"http://127.0.0.1:{port}/api/v1/health/", timeout=2)
    except requests.RequestException:
        return False
    return True


def trivial_sequence(atoms: int = 1, duration: int = 100) -> str:
    """A Pulser sequence the emulator simulates in tens of milliseconds (1 atom) or seconds."""
    import pulser.devices
    from pulser import Pulse, Register, Sequence

    columns = min(atoms, 4)
    rows = -(-atoms // columns)
    register = Register.rectangle(rows, columns, spacing=6, prefix="q")
    sequence = Sequence(register, pulser.devices.AnalogDevice)
    sequence.declare_channel("rydberg", "rydberg_global")
    sequence.add(Pulse.ConstantPulse(duration, 2.0, 0.0, 0.0), "rydberg")
    sequence.measure("ground-rydberg")
    return sequence.to_abstract_repr()


def seed_pools(*, pools: int, devices: int, prefix: str = "scale") -> list:
    """``pools`` public emulator pools with ``devices`` one-job devices each (in this process's
    database connection, committed)."""
    from apps.resources.models import ResourceClass, ResourcePool
    from apps.scheduling.models import Device

    made = []
    for p in range(pools):
        pool = ResourcePool.objects.create(name=f"{prefix}-{p}", kind="local", public=True)
        ResourceClass.objects.create(pool=pool, name="qpu", cpu=1, memory=1, default=True)
        for d in range(devices):
            Device.objects.create(
                pool=pool,
                name=f"emu-{d}",
                driver="emulator",
                config={"pulser_device": "AnalogDevice", "max_atoms": 12},
                max_concurrent_jobs=1,
            )
        made.append(pool)
    return made


def max_overlap(intervals) -> int:
    """The most intervals ``[start, end]`` open at one instant (an end before a start at the same
    instant: a device freed and refilled at once is not two runs at once)."""
    edges = sorted(
        [(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals], key=lambda e: (e[0], e[1])
    )
    peak = current = 0
    for _, step in edges:
        current += step
        peak = max(peak, current)
    return peak


def capacity_breaches() -> list[str]:
    """Devices that ever ran more jobs at once than ``max_concurrent_jobs``, proved from the
    recorded intervals: a job holds its device from dispatch (``scheduled_at``) to the poll that
    saw it end (``finished_at``), and an emulator run from ``started_at`` to ``finished_at``.
    Dispatch reads the running count after the previous job's end committed and takes its clock
    (``scheduled_at``) after that read, while the end's ``finished_at`` is taken before its
    commit; so with one clock (all processes on this machine) a device's intervals overlap only if
    it was over capacity."""
    from django.utils import timezone

    from apps.scheduling.models import Device, DriverRun, Job

    now = timezone.now()  # an interval still open holds its device until now
    breaches = []
    for device in Device.objects.all():
        jobs = defaultdict(list)
        for start, end in Job.objects.filter(device=device, scheduled_at__isnull=False).values_list(
            "scheduled_at", "finished_at"
        ):
            jobs["jobs"].append((start, end or now))
        for start, end in DriverRun.objects.filter(device=device, started_at__isnull=False).values_list(
            "started_at", "finished_at"
        ):
            jobs["runs"].append((start, end or now))
        for what, intervals in jobs.items():
            peak = max_overlap(intervals)
            if peak > device.max_concurrent_jobs:
                breaches.append(f"{device}: {peak} {what} at once > {device.max_concurrent_jobs}")
    return breaches
