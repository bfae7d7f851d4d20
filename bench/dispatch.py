"""Per-dispatch cost against queue depth and against history (SPEC §9).

1. 1 000 vs 100 000 pending jobs in 1 000 sessions, weighted_fair, fifo and usage_fair: the
   dispatch queries are index-backed, so the time per dispatch must not grow with the backlog.
   usage_fair's sessions belong to 50 users (its first level chooses among their shares), and
   each dispatched job ends through ``passes._finish`` (untimed) with a device time of 1-7 s, so
   that the shares' usage and the sessions' vruntimes move as in service.
   Beside each, what a pool's pass spends before it dispatches: recording the expected start of
   up to ``passes.RECORD_BATCH`` pending jobs not yet recorded (R-JOB-5; the ETA's snapshot
   rebuilt, as after a dispatch), and the same pass once every job is recorded.
2. The same 1 000 pending jobs with no finished job vs 200 000 finished jobs on the device:
   dispatch, ``GET /devices/`` and ``devices_with_load`` must cost the same
   (ratio ≤ 1.5), with a constant query count.
"""

import statistics
import sys
import time

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])
from bench._setup import django_on_bench_database, reset_rows  # noqa: E402

SESSIONS = 1000
DISPATCHES = 200
HISTORY = 200_000
REQUESTS = 15
SHARE_USERS = 50  # usage_fair: the users the sessions are spread over


def populate(pool, klass, user, per_session, users=None):
    """``per_session`` pending jobs in each of SESSIONS sessions, of ``user`` or spread over ``users``."""
    from django.utils import timezone

    from apps.scheduling.models import Job
    from apps.sessions.models import Session

    now = timezone.now()
    later = now + timezone.timedelta(days=30)
    users = users or [user]
    sessions = Session.objects.bulk_create(
        Session(
            user=users[i % len(users)],
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
            batch.append(Job(session=session, pool=pool, user_id=session.user_id, payload={}, shots=1, created_at=now))
            if len(batch) >= 20000:
                Job.objects.bulk_create(batch)
                batch = []
    Job.objects.bulk_create(batch)


def add_history(pool, klass, user, device, rows):
    """``rows`` finished jobs that ran on ``device``, in one ended session."""
    from django.utils import timezone

    from apps.scheduling.models import Job, JobStatus
    from apps.sessions.models import Session

    now = timezone.now()
    old = Session.objects.create(
        user=user,
        resource_class=klass,
        pool=pool,
        status="revoked",
        revoked_at=now,
        created_at=now,
        last_activity_at=now,
        expires_at=now,
        idle_expires_at=now,
    )
    for start in range(0, rows, 20000):
        Job.objects.bulk_create(
            Job(
                session=old,
                pool=pool,
                user=user,
                payload={},
                shots=1,
                created_at=now,
                finished_at=now,
                status=JobStatus.COMPLETED,
                device=device,
            )
            for _ in range(min(20000, rows - start))
        )


def measure_reads(client):
    """``GET /devices/`` through the full stack and ``devices_with_load`` alone."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from apps.scheduling import selectors

    api_times, load_times, queries = [], [], set()
    for _ in range(REQUESTS):
        connection.queries_log.clear()
        with CaptureQueriesContext(connection) as ctx:
            start = time.perf_counter()
            response = client.get("/api/v1/devices/")
            api_times.append(time.perf_counter() - start)
        assert response.status_code == 200, response.content[:300]
        queries.add(len(ctx))
        start = time.perf_counter()
        list(selectors.devices_with_load())
        load_times.append(time.perf_counter() - start)
    return statistics.median(api_times), statistics.median(load_times), sorted(queries)


def measure(pool_id, finish=False):
    """Median time of DISPATCHES dispatches, and their query counts. Each job is then marked
    completed (untimed), or with ``finish`` ended through ``passes._finish`` (usage_fair: its
    device time is charged to its session and share)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from apps.scheduling import passes
    from apps.scheduling.drivers import DriverState
    from apps.scheduling.models import Job, JobStatus

    times, queries = [], []
    for _ in range(DISPATCHES):
        connection.queries_log.clear()  # a full log (9 000 entries) would make the count wrong
        with CaptureQueriesContext(connection) as ctx:
            start = time.perf_counter()
            job = passes.dispatch_once(pool_id)
            times.append(time.perf_counter() - start)
        queries.append(len(ctx))
        assert job is not None
        if finish:
            runtime = 1.0 + len(times) % 7
            passes._finish(job, DriverState("completed", runtime_seconds=runtime), expect_remote_id="")
        else:
            Job.objects.filter(pk=job.pk).update(status=JobStatus.COMPLETED)  # frees the device, untimed
    return statistics.median(times), queries


def measure_recording(pool_id):
    """Median time of a pass's recording step with jobs to record (the ETA's cache cleared, as
    after a dispatch changed the queue), then of one with nothing left to record."""
    from django.db import connection
    from django.utils import timezone

    from apps.scheduling import eta, passes
    from apps.scheduling.models import Job

    busy = []
    for _ in range(3):  # each records up to RECORD_BATCH: the first of 800 pending leaves 300
        eta.clear_cache()
        start = time.perf_counter()
        if passes.record_predictions(pool_id):
            busy.append(time.perf_counter() - start)
    Job.objects.filter(pool_id=pool_id, eta_recorded_at__isnull=True).update(eta_recorded_at=timezone.now())
    with connection.cursor() as cursor:  # as autovacuum's analyze sees the jobs recorded, 500 a pass
        cursor.execute("VACUUM ANALYZE scheduling_job")
    idle = []
    for _ in range(REQUESTS):
        start = time.perf_counter()
        assert passes.record_predictions(pool_id) == 0
        idle.append(time.perf_counter() - start)
    return statistics.median(busy), statistics.median(idle)


def main() -> int:
    if django_on_bench_database() is None:
        print("dispatch: skipped (needs PostgreSQL)")
        return 0
    from django.contrib.auth import get_user_model
    from django.db import connection

    from apps.resources.models import ResourceClass, ResourcePool
    from apps.scheduling.models import Device

    user, _ = get_user_model().objects.get_or_create(username="bench")
    share_users = [
        get_user_model().objects.get_or_create(username=f"bench-share-{i:02d}")[0] for i in range(SHARE_USERS)
    ]
    print(f"dispatch: {SESSIONS} sessions, median of {DISPATCHES} dispatches (dispatch_once, no driver call)")
    # ``--history``: only part 2 (the backlog part populates 200 000 rows twice).
    strategies = ("weighted_fair", "fifo", "usage_fair")
    if "--strategy" in sys.argv:
        strategies = (sys.argv[sys.argv.index("--strategy") + 1],)
    for strategy in () if "--history" in sys.argv else strategies:
        usage = strategy == "usage_fair"
        results, recording = {}, {}
        for per_session in (1, 100):
            reset_rows()
            pool = ResourcePool.objects.create(name=f"bench-{strategy}", kind="local", strategy=strategy)
            klass = ResourceClass.objects.create(pool=pool, name="c", cpu=1, memory=1, default=True)
            Device.objects.create(pool=pool, name="d", driver="fake", max_concurrent_jobs=1)
            populate(pool, klass, user, per_session, users=share_users if usage else None)
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE scheduling_job; ANALYZE compute_sessions_session")
            results[per_session] = measure(pool.pk, finish=usage)
            recording[per_session] = measure_recording(pool.pk)
        (small_t, small_q), (big_t, big_q) = results[1], results[100]
        label = f"{strategy} ({SHARE_USERS} users)" if usage else strategy
        print(
            f"  {label:13s}: {SESSIONS * 1:>7,} pending {small_t * 1000:6.2f} ms/dispatch, "
            f"{SESSIONS * 100:>7,} pending {big_t * 1000:6.2f} ms/dispatch; ratio {big_t / small_t:.2f} "
            f"(target <= 1.5); queries/dispatch {sorted(set(small_q))} vs {sorted(set(big_q))}"
        )
        for per_session, (busy, idle) in recording.items():
            print(
                f"  {'':13s}  recording ({SESSIONS * per_session:>7,} pending): {busy * 1000:8.1f} ms a pass with "
                f"jobs to record ({busy / results[per_session][0]:.0f} x a dispatch), {idle * 1000:5.2f} ms with none"
            )
    if "--strategy" not in sys.argv:  # ``--strategy NAME``: that part-1 line only
        history(user)
    reset_rows()
    return 0


def history(user) -> None:
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import connection
    from rest_framework.test import APIClient

    from apps.resources.models import ResourceClass, ResourcePool
    from apps.scheduling.models import Device, Job
    from apps.sessions.models import Session

    staff, _ = get_user_model().objects.get_or_create(username="bench-staff", defaults={"is_staff": True})
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    client = APIClient()
    client.force_authenticate(staff)
    results = {}
    for rows in (0, HISTORY):
        reset_rows()
        pool = ResourcePool.objects.create(name="bench-history", kind="local", strategy="weighted_fair")
        klass = ResourceClass.objects.create(pool=pool, name="c", cpu=1, memory=1, default=True)
        device = Device.objects.create(pool=pool, name="d", driver="fake", max_concurrent_jobs=1)
        add_history(pool, klass, user, device, rows)
        populate(pool, klass, user, 1)
        targeted = Session.objects.filter(pool=pool, status="active").first()
        Job.objects.bulk_create(  # 50 pending jobs targeted at the device
            Job(
                session=targeted,
                pool=pool,
                user=user,
                payload={},
                shots=1,
                created_at=targeted.created_at,
                target_device=device,
            )
            for _ in range(50)
        )
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE scheduling_job; ANALYZE compute_sessions_session")
        reads = measure_reads(client)
        results[rows] = (measure(pool.pk), reads)
    ((none_t, none_q), (none_api, none_load, none_rq)), ((hist_t, hist_q), (hist_api, hist_load, hist_rq)) = (
        results[0],
        results[HISTORY],
    )
    print(
        f"history: {SESSIONS:,} pending jobs (50 naming the device), no finished job vs {HISTORY:,} "
        "finished jobs on the device"
    )
    print(
        f"  dispatch_once     : {none_t * 1000:7.2f} ms vs {hist_t * 1000:7.2f} ms; ratio {hist_t / none_t:.2f} "
        f"(target <= 1.5); queries {sorted(set(none_q))} vs {sorted(set(hist_q))}"
    )
    print(
        f"  GET /devices/     : {none_api * 1000:7.2f} ms vs {hist_api * 1000:7.2f} ms; "
        f"ratio {hist_api / none_api:.2f} (target <= 1.5); queries {none_rq} vs {hist_rq}"
    )
    print(
        f"  devices_with_load : {none_load * 1000:7.2f} ms vs {hist_load * 1000:7.2f} ms; "
        f"ratio {hist_load / none_load:.2f} (target <= 1.5)"
    )


if __name__ == "__main__":
    sys.exit(main())
