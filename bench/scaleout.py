"""Dispatch throughput across pools with one and with two worker clusters.

4 pools × 2 emulator devices (one job at a time each), trivial jobs (1 atom, 100 ns, 10 shots):
the jobs completed per second from the first submission to the last completion, with one
``manage.py worker`` cluster and then two (worker hosts ``host-a`` and ``host-b``, separate
processes, one PostgreSQL database, one Redis at db 10, or the ORM broker without Redis). The
ratio two/one is the figure: on a 2-core machine the work is CPU-bound (simulation, Django), so
a second cluster adds availability more than throughput. About a minute.

``BENCH_SCALEOUT_JOBS`` (default 96), ``BENCH_SCALEOUT_Q_WORKERS`` (workers per cluster, 4).
"""

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])
from bench._setup import django_on_bench_database  # noqa: E402

POOLS, DEVICES = 4, 2
JOBS = int(os.environ.get("BENCH_SCALEOUT_JOBS", "96"))
Q_WORKERS = os.environ.get("BENCH_SCALEOUT_Q_WORKERS", "4")
REDIS_URL = "redis://127.0.0.1:6379/10"
SECRET = "bench-scaleout-key-" + "x" * 40  # django-q2 signs tasks: one key for the bench and clusters


def submit(sessions, sequence, count: int) -> list[int]:
    from apps.scheduling import services

    ids = []
    for i in range(count):
        session = sessions[i % len(sessions)]
        job = services.submit_job(user=session.user, session_id=session.pk, payload={"sequence": sequence}, shots=10)
        ids.append(job.pk)
    return ids


def wait_done(ids, seconds: float) -> bool:
    from apps.scheduling.models import TERMINAL, Job

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if Job.objects.filter(pk__in=ids).exclude(status__in=list(TERMINAL)).count() == 0:
            return True
        time.sleep(0.1)
    return False


def timed(clusters: int, sessions, sequence, procs) -> float | None:
    """Warm the newly started cluster up (untimed: Pulser imported in its worker processes), then
    time ``JOBS`` jobs from the first submission to the last completion."""
    from apps.scheduling.models import Job, JobStatus

    warm = submit(sessions, sequence, 2 * POOLS * DEVICES)
    if not wait_done(warm, 180):
        print(f"  {clusters} cluster(s): warm-up did not finish\n{procs.log_tail()}")
        return None
    started = time.monotonic()
    ids = submit(sessions, sequence, JOBS)
    if not wait_done(ids, 300):
        print(f"  {clusters} cluster(s): jobs did not finish\n{procs.log_tail()}")
        return None
    elapsed = time.monotonic() - started
    done = Job.objects.filter(pk__in=ids, status=JobStatus.COMPLETED).count()
    rate = done / elapsed
    print(
        f"  {clusters} cluster(s): {done}/{JOBS} jobs completed in {elapsed:5.1f} s = {rate:6.1f} jobs/s; "
        f"median dispatch → run start {stage(ids, 'start'):4.0f} ms, run {stage(ids, 'run'):4.0f} ms, "
        f"run end → job finished {stage(ids, 'end'):4.0f} ms",
        flush=True,
    )
    return rate


def run(sessions, sequence, database_url: str, redis_url: str | None) -> tuple[float | None, float | None]:
    """One cluster (host-a) measured, then a second (host-b) added and both measured."""
    from tests.scaleout.harness import Processes, flush_redis

    if redis_url:
        flush_redis(redis_url)
    with tempfile.TemporaryDirectory(prefix="bench-scaleout-") as var:
        procs = Processes(database_url, Path(var), redis_url=redis_url, extra_env={"GRIDGATE_Q_WORKERS": Q_WORKERS})
        try:
            procs.worker("host-a")
            one = timed(1, sessions, sequence, procs)
            procs.worker("host-b")
            two = timed(2, sessions, sequence, procs) if one else None
        finally:
            procs.stop_all()
    return one, two


def stage(ids, which: str) -> float:
    """Median milliseconds of one stage of the timed jobs (where a job's time goes)."""
    import statistics

    from apps.scheduling.models import DriverRun, Job

    jobs = {
        f"emu-{pk}": (at, end)
        for pk, at, end in Job.objects.filter(pk__in=ids).values_list("pk", "scheduled_at", "finished_at")
    }
    spans = []
    for remote_id, started, finished in DriverRun.objects.filter(remote_id__in=list(jobs)).values_list(
        "remote_id", "started_at", "finished_at"
    ):
        scheduled, job_end = jobs[remote_id]
        pair = {"start": (scheduled, started), "run": (started, finished), "end": (finished, job_end)}[which]
        if None not in pair:
            spans.append((pair[1] - pair[0]).total_seconds() * 1000)
    return statistics.median(spans) if spans else float("nan")


def main() -> int:
    from tests.scaleout.harness import redis_problem

    redis_url = None if redis_problem(REDIS_URL) else REDIS_URL
    os.environ["SECRET_KEY"] = SECRET
    if redis_url:
        os.environ["GRIDGATE_REDIS_URL"] = redis_url  # this process enqueues the submissions' wake-ups
        os.environ["GRIDGATE_REDIS_ALLOW_NO_AUTH"] = "true"  # the bench machine's Redis has no password
    database_url = django_on_bench_database("gridgate_bench_scaleout")
    if database_url is None:
        print("scaleout: skipped (needs PostgreSQL)")
        return 0
    from django.contrib.auth import get_user_model

    from apps.core.models import Lease, WorkerHeartbeat
    from apps.resources.models import ResourcePool
    from apps.scheduling.models import DriverRun, Job
    from apps.sessions import services as session_services
    from apps.sessions.models import Session
    from tests.scaleout.harness import seed_pools, trivial_sequence

    Job.objects.all().delete()
    DriverRun.objects.all().delete()
    Session.objects.all().delete()
    ResourcePool.objects.filter(name__startswith="bench-scale-").delete()
    Lease.objects.all().delete()
    WorkerHeartbeat.objects.all().delete()
    user, _ = get_user_model().objects.get_or_create(username="bench-scaleout")
    pools = seed_pools(pools=POOLS, devices=DEVICES, prefix="bench-scale")
    sessions = [
        session_services.admit(user=user, resource_class=pool.classes.get()).session for pool in pools for _ in (0, 1)
    ]
    sequence = trivial_sequence(atoms=1)
    broker = f"Redis {redis_url}" if redis_url else "the ORM broker (Redis not answering)"
    print(
        f"scaleout: {JOBS} trivial emulator jobs over {POOLS} pools × {DEVICES} devices, "
        f"{Q_WORKERS} workers per cluster, {broker}"
    )
    one, two = run(sessions, sequence, database_url, redis_url)
    if one and two:
        print(f"  ratio two/one: {two / one:.2f}")
    Job.objects.all().delete()
    Session.objects.all().delete()
    return 0 if one and two else 1


if __name__ == "__main__":
    sys.exit(main())
