"""/metrics scrape benchmark: the scrape must not slow down with history.

A site with 4 pools, 8 devices, 40 active sessions, 400 pending and 8 running jobs and 200
unfinished cases is scraped (median of 30 scrapes through the view, SQL statements counted);
then 100 000 finished jobs and 50 000 finished cases are added and it is scraped again. Prints
both times and their ratio (≈ 1 when the cost follows the current state only), the plans of the
jobs and cases queries, and, for comparison, the time of the alternative the latency histograms
did not take: counting histogram buckets over every retained job at scrape time.

Runs in its own database (``GRIDGATE_BENCH_DB``, default ``gridgate_bench``), emptied first.
"""

import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _setup import django_on_bench_database  # noqa: E402

TOKEN = "b" * 32
FINISHED_JOBS = int(os.environ.get("BENCH_METRICS_FINISHED_JOBS", "100000"))
FINISHED_CASES = int(os.environ.get("BENCH_METRICS_FINISHED_CASES", "50000"))


def populate_current_state():
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from apps.cases.models import Case, CaseStatus
    from apps.core.models import WorkerHeartbeat
    from apps.resources.models import ResourceClass, ResourcePool
    from apps.scheduling import latency
    from apps.scheduling.models import Device, Job, JobStatus, LatencyKind
    from apps.sessions.models import Session

    now = timezone.now()
    user = get_user_model().objects.create_user("bench-metrics")
    classes = []
    for p in range(4):
        pool = ResourcePool.objects.create(name=f"pool{p}", kind="local", public=True, slots_total=100)
        classes.append(ResourceClass.objects.create(pool=pool, name="c", cpu=1, memory=1, default=True))
        for d in range(2):
            Device.objects.create(pool=pool, name=f"d{d}", driver="fake", max_concurrent_jobs=2)
        for s in (0.2, 3, 40, 700):
            latency.observe(pool.pk, LatencyKind.QUEUE_WAIT, s)
            latency.observe(pool.pk, LatencyKind.DISPATCH, s / 100)
    sessions = Session.objects.bulk_create(
        Session(
            user=user,
            resource_class=rc,
            pool_id=rc.pool_id,
            slots=1,
            expires_at=now + timedelta(days=1),
            idle_expires_at=now + timedelta(days=1),
        )
        for rc in classes
        for _ in range(10)
    )
    Job.objects.bulk_create(
        Job(session=s, pool_id=s.pool_id, user=user, payload={}, shots=1, created_at=now, status=JobStatus.PENDING)
        for s in sessions
        for _ in range(10)
    )
    for device in Device.objects.all():
        session = next(s for s in sessions if s.pool_id == device.pool_id)
        Job.objects.create(
            session=session, pool_id=device.pool_id, user=user, payload={}, shots=1, created_at=now,
            status=JobStatus.RUNNING, device=device, remote_id=f"r{device.pk}",
        )  # fmt: skip
    Case.objects.bulk_create(
        Case(owner=user, resource_class=rc, name="c", command="x", status=status)
        for rc in classes
        for status in [CaseStatus.PREPARED, CaseStatus.PENDING, CaseStatus.RUNNING] * 17
    )
    for h in range(3):
        WorkerHeartbeat.objects.create(name=f"host{h}", seen_at=now)
    return user, sessions, classes


def add_history(user, sessions, classes):
    from django.utils import timezone

    from apps.cases.models import Case, CaseStatus
    from apps.scheduling.models import Job, JobStatus

    now = timezone.now()
    batch = []
    for i in range(FINISHED_JOBS):
        s = sessions[i % len(sessions)]
        created = now - timedelta(seconds=i)
        batch.append(
            Job(
                session=s, pool_id=s.pool_id, user=user, payload={}, shots=1, created_at=created,
                scheduled_at=created + timedelta(seconds=i % 97), finished_at=created + timedelta(seconds=100),
                status=JobStatus.COMPLETED if i % 10 else JobStatus.FAILED,
            )
        )  # fmt: skip
        if len(batch) == 5000:
            Job.objects.bulk_create(batch)
            batch = []
    Job.objects.bulk_create(batch)
    cases = (
        Case(owner=user, resource_class=classes[i % len(classes)], name="c", command="x", status=CaseStatus.FAILED)
        for i in range(FINISHED_CASES)
    )
    Case.objects.bulk_create(cases, batch_size=5000)


def scrape_times(client, n=30):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    times = []
    for _ in range(n):
        started = time.perf_counter()
        response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
        times.append(time.perf_counter() - started)
        assert response.status_code == 200
    with CaptureQueriesContext(connection) as ctx:
        client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    return statistics.median(times), len(ctx.captured_queries)


def explain(sql_queryset) -> str:
    return "\n    ".join(sql_queryset.explain().splitlines())


def main() -> int:
    if django_on_bench_database() is None:
        print("skipped: needs PostgreSQL (DATABASE_URL)")
        return 0
    from django.conf import settings
    from django.db import connection
    from django.db.models import Count, DurationField, ExpressionWrapper, F, Q
    from django.test import Client

    from apps.cases.models import Case
    from apps.scheduling.models import UNFINISHED, Job

    settings.GRIDGATE_METRICS_TOKEN = TOKEN
    settings.ALLOWED_HOSTS = ["testserver"]
    from django.apps import apps as django_apps

    emptied = [
        m._meta.db_table
        for m in django_apps.get_models(include_auto_created=True)
        if m._meta.app_label in {"cases", "scheduling", "sessions", "resources", "core", "qrmi"}
    ]
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {', '.join(emptied)} CASCADE")
        cursor.execute("DELETE FROM auth_user WHERE username = 'bench-metrics'")
    user, sessions, classes = populate_current_state()
    client = Client()
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    base, base_queries = scrape_times(client)
    add_history(user, sessions, classes)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    big, big_queries = scrape_times(client)
    print(f"scrape, current state only:        {base * 1000:7.1f} ms  ({base_queries} queries)")
    print(
        f"scrape, + {FINISHED_JOBS} finished jobs, {FINISHED_CASES} finished cases: {big * 1000:7.1f} ms "
        f"({big_queries} queries)  ratio {big / base:.2f}"
    )
    jobs = Job.objects.filter(status__in=sorted(UNFINISHED)).order_by().values("pool_id", "device_id", "status")
    print("  jobs plan:\n    " + explain(jobs.annotate(n=Count("pk"))))
    cases = Case.objects.filter(status__in=["prepared", "pending", "running"]).order_by().values("status")
    print("  cases plan:\n    " + explain(cases.annotate(n=Count("pk"))))
    # The alternative not taken: histogram buckets counted over every retained job per scrape.
    wait = ExpressionWrapper(F("scheduled_at") - F("created_at"), output_field=DurationField())
    buckets = {
        f"le{i}": Count("pk", filter=Q(wait__lte=timedelta(seconds=le)))
        for i, le in enumerate((0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400, 86400))
    }
    counted = Job.objects.filter(scheduled_at__isnull=False).annotate(wait=wait).order_by().values("pool_id")
    times = []
    for _ in range(10):
        started = time.perf_counter()
        list(counted.annotate(**buckets))
        times.append(time.perf_counter() - started)
    alternative = statistics.median(times)
    print(
        f"for comparison, histogram counted over all retained jobs: {alternative * 1000:7.1f} ms per scrape "
        f"({alternative / base:.1f}x the whole scrape above), growing with history"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
