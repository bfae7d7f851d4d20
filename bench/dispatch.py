"""Per-dispatch cost against queue depth (SPEC §9): 1 000 vs 100 000 pending jobs in 1 000
sessions, weighted_fair and fifo. The dispatch queries are index-backed, so the time per
dispatch must not grow with the backlog (ratio ≤ 1.5) and the query count is constant."""

import statistics
import sys
import time

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])
from bench._setup import django_on_bench_database  # noqa: E402

SESSIONS = 1000
DISPATCHES = 200


def populate(pool, klass, user, per_session):
    from django.utils import timezone

    from apps.scheduling.models import Job
    from apps.sessions.models import Session

    now = timezone.now()
    later = now + timezone.timedelta(days=30)
    sessions = Session.objects.bulk_create(
        Session(
            user=user,
            resource_class=klass,
            pool=pool,
            slots=1 + i % 5,
            created_at=now,
            last_activity_at=now,
            expires_at=later,
            idle_expires_at=later,
        )
        for i in range(SESSIONS)
    )
    batch = []
    for _ in range(per_session):
        for session in sessions:
            batch.append(Job(session=session, pool=pool, user=user, payload={}, shots=1, created_at=now))
            if len(batch) >= 20000:
                Job.objects.bulk_create(batch)
                batch = []
    Job.objects.bulk_create(batch)


def measure(pool_id):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from apps.scheduling import services
    from apps.scheduling.models import Job, JobStatus

    times, queries = [], []
    for _ in range(DISPATCHES):
        connection.queries_log.clear()  # a full log (9 000 entries) would make the count wrong
        with CaptureQueriesContext(connection) as ctx:
            start = time.perf_counter()
            job = services.dispatch_once(pool_id)
            times.append(time.perf_counter() - start)
        queries.append(len(ctx))
        assert job is not None
        Job.objects.filter(pk=job.pk).update(status=JobStatus.COMPLETED)  # frees the device, untimed
    return statistics.median(times), queries


def main() -> int:
    if django_on_bench_database() is None:
        print("dispatch: skipped (needs PostgreSQL)")
        return 0
    from django.contrib.auth import get_user_model
    from django.db import connection

    from apps.resources.models import ResourceClass, ResourcePool
    from apps.scheduling.models import Device, Job
    from apps.sessions.models import Session

    user, _ = get_user_model().objects.get_or_create(username="bench")
    print(f"dispatch: {SESSIONS} sessions, median of {DISPATCHES} dispatches (dispatch_once, no driver call)")
    for strategy in ("weighted_fair", "fifo"):
        results = {}
        for per_session in (1, 100):
            Job.objects.all().delete()
            Session.objects.all().delete()
            ResourcePool.objects.filter(name__startswith="bench-").delete()
            pool = ResourcePool.objects.create(name=f"bench-{strategy}", kind="local", strategy=strategy)
            klass = ResourceClass.objects.create(pool=pool, name="c", cpu=1, memory=1, default=True)
            Device.objects.create(pool=pool, name="d", driver="fake", max_concurrent_jobs=1)
            populate(pool, klass, user, per_session)
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE scheduling_job; ANALYZE compute_sessions_session")
            results[per_session] = measure(pool.pk)
        (small_t, small_q), (big_t, big_q) = results[1], results[100]
        print(
            f"  {strategy:13s}: {SESSIONS * 1:>7,} pending {small_t * 1000:6.2f} ms/dispatch, "
            f"{SESSIONS * 100:>7,} pending {big_t * 1000:6.2f} ms/dispatch; ratio {big_t / small_t:.2f} "
            f"(target <= 1.5); queries/dispatch {sorted(set(small_q))} vs {sorted(set(big_q))}"
        )
    Job.objects.all().delete()
    Session.objects.all().delete()
    ResourcePool.objects.filter(name__startswith="bench-").delete()
    return 0


if __name__ == "__main__":
    sys.exit(main())
