"""List endpoints at 100 vs 10 000 rows (SPEC §9): constant query count, page time ≤ 1.5×.

Each list is read as a staff user, first page of 50, median of 15 requests, through the full
DRF stack (authentication, filtering, pagination, serialization) with Django's test client.
"""

import statistics
import sys
import time

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])
from bench._setup import django_on_bench_database, reset_rows  # noqa: E402

REQUESTS = 15


def populate(rows: int):
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from apps.resources.models import ResourceClass, ResourcePool
    from apps.scheduling.models import Job, JobStatus, PoolQueue
    from apps.sessions.models import Session

    reset_rows()
    user, _ = get_user_model().objects.get_or_create(username="bench")
    pool = ResourcePool.objects.create(name="bench-lists", kind="local", public=True, strategy="weighted_fair")
    klass = ResourceClass.objects.create(pool=pool, name="c", cpu=1, memory=1, default=True)
    PoolQueue.objects.create(pool=pool)  # as the first submission through the service creates it
    now = timezone.now()
    later = now + timezone.timedelta(days=30)
    sessions = Session.objects.bulk_create(
        Session(
            user=user,
            resource_class=klass,
            pool=pool,
            created_at=now,
            last_activity_at=now,
            expires_at=later,
            idle_expires_at=later,
        )
        for _ in range(rows)  # as many sessions as jobs: every list has full pages at both sizes
    )
    # Half pending (queue positions are computed for them), half finished.
    Job.objects.bulk_create(
        Job(
            session=sessions[i % len(sessions)],
            pool=pool,
            user=user,
            payload={"i": i},
            shots=1,
            created_at=now,
            status=JobStatus.PENDING if i % 2 else JobStatus.COMPLETED,
        )
        for i in range(rows)
    )
    return user


def measure(client, path):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    times, queries = [], set()
    for _ in range(REQUESTS):
        connection.queries_log.clear()
        with CaptureQueriesContext(connection) as ctx:
            start = time.perf_counter()
            response = client.get(path)
            times.append(time.perf_counter() - start)
        assert response.status_code == 200, response.content[:300]
        queries.add(len(ctx))
    return statistics.median(times), sorted(queries), times[0]


def main() -> int:
    if django_on_bench_database() is None:
        print("api_lists: skipped (needs PostgreSQL)")
        return 0
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import connection
    from rest_framework.test import APIClient

    staff, _ = get_user_model().objects.get_or_create(username="bench-staff", defaults={"is_staff": True})
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    client = APIClient()
    client.force_authenticate(staff)
    paths = ["/api/v1/jobs/?page_size=50", "/api/v1/sessions/?page_size=50", "/api/v1/resource-pools/"]
    results = {}
    for rows in (100, 10_000):
        populate(rows)
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE scheduling_job; ANALYZE compute_sessions_session")
        for path in paths:
            results[(path, rows)] = measure(client, path)
    print(f"api_lists: first page of 50, median of {REQUESTS} requests, staff user")
    for path in paths:
        (small_t, small_q, small_cold), (big_t, big_q, big_cold) = results[(path, 100)], results[(path, 10_000)]
        print(
            f"  {path:36s} 100 rows {small_t * 1000:7.1f} ms  10,000 rows {big_t * 1000:7.1f} ms  "
            f"ratio {big_t / small_t:5.2f} (target <= 1.5)  queries {small_q} vs {big_q}"
        )
        # The job list's queue positions come from a per-pool snapshot (rebuilt when the queue
        # changes): the first request after a change pays for reading the whole queue.
        print(f"  {'':36s} first (cold) request: {small_cold * 1000:7.1f} ms vs {big_cold * 1000:7.1f} ms")
    populate(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
