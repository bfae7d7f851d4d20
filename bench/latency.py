"""Freed device → next job started (R-SCHED-5: ≤ 1 s p95 under the default worker set-up).

Starts a real ``manage.py qcluster`` (default settings: ORM broker, 2 workers) on the bench
database, queues jobs on one emulator device that runs one job at a time, and measures, for each
consecutive pair, the gap between one run finishing and the next run starting on the device.
Baseline, same run and cluster: the broker's own latency, from ``async_task`` to a trivial task
(the heartbeat) having run.
"""

import os
import subprocess
import sys
import time

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])
from bench._setup import ROOT, django_on_bench_database, percentile, reset_rows  # noqa: E402

JOBS = 25
PROBES = 25


def main() -> int:
    conninfo = django_on_bench_database()
    if conninfo is None:
        print("latency: skipped (needs PostgreSQL)")
        return 0
    from django.contrib.auth import get_user_model
    from django.utils import timezone
    from django_q.models import OrmQ, Task
    from django_q.tasks import async_task

    from apps.core.models import WorkerHeartbeat
    from apps.resources.models import ResourceClass, ResourcePool
    from apps.scheduling import services
    from apps.scheduling.models import Device, DriverRun, Job
    from apps.sessions import services as session_services
    from tests.scheduling.pulser_sequences import analog_sequence

    Job.objects.all().delete()
    DriverRun.objects.all().delete()
    reset_rows()
    OrmQ.objects.all().delete()
    Task.objects.all().delete()
    user, _ = get_user_model().objects.get_or_create(username="bench")
    pool = ResourcePool.objects.create(name="bench-latency", kind="local")
    klass = ResourceClass.objects.create(pool=pool, name="c", cpu=1, memory=1, default=True)
    Device.objects.create(pool=pool, name="emu", driver="emulator", max_concurrent_jobs=1)
    session = session_services.admit(user=user, resource_class=klass).session

    env = dict(os.environ, DATABASE_URL=conninfo.replace("postgresql://", "postgres://"), GRIDGATE_LOG_LEVEL="WARNING")
    cluster = subprocess.Popen(
        [sys.executable, "manage.py", "qcluster"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(3)  # cluster start-up (not measured)
        # Baseline: broker latency of a no-op task.
        broker = []
        for _ in range(PROBES):
            sent = timezone.now()
            async_task("apps.core.tasks.heartbeat")  # records the time it ran
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                seen = WorkerHeartbeat.objects.filter(seen_at__gte=sent).values_list("seen_at", flat=True).first()
                if seen:
                    broker.append((seen - sent).total_seconds())
                    break
                time.sleep(0.02)
        sequence = analog_sequence(atoms=2)
        for _ in range(JOBS):
            services.submit_job(user=session.user, session_id=session.pk, payload={"sequence": sequence}, shots=100)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and Job.objects.filter(status__in=["pending", "running"]).exists():
            time.sleep(0.5)
    finally:
        cluster.terminate()  # a tick loop may be mid-way through its minute: do not wait for it
        try:
            cluster.wait(timeout=10)
        except subprocess.TimeoutExpired:
            cluster.kill()
            cluster.wait()
    runs = list(DriverRun.objects.filter(started_at__isnull=False).order_by("started_at"))
    gaps = [(b.started_at - a.finished_at).total_seconds() for a, b in zip(runs, runs[1:], strict=False)]
    done = Job.objects.filter(status="completed").count()
    print(f"latency: {done}/{JOBS} jobs completed on one emulator device, qcluster with default settings")
    print(
        f"  freed device → next run started: p50 {percentile(gaps, 50) * 1000:6.0f} ms  "
        f"p95 {percentile(gaps, 95) * 1000:6.0f} ms  (target p95 <= 1000 ms, {len(gaps)} gaps)"
    )
    if broker:
        print(
            f"  baseline, broker enqueue → trivial task done: p50 {percentile(broker, 50) * 1000:6.0f} ms  "
            f"p95 {percentile(broker, 95) * 1000:6.0f} ms"
        )
        print(f"  ratio p95 gap / p95 broker latency: {percentile(gaps, 95) / max(percentile(broker, 95), 1e-6):.2f}")
    reset_rows()
    return 0


if __name__ == "__main__":
    sys.exit(main())
