"""Admission throughput under 32 concurrent clients (SPEC §9, R-SESS-1).

Service: ``apps.sessions.services.admit`` (the class lookup with the access check, then the
conditional UPDATE of the pool's usage counters inserting the session with its launch spec).
Baseline: raw psycopg doing only a lock of the pool row, the sum of its active sessions' slots
and the insert, in one transaction. Both run here, now, on the same database; the figure that
matters is the ratio.
"""

import multiprocessing
import os
import random
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])
from bench._setup import django_on_bench_database, percentile, reset_rows  # noqa: E402

CLIENTS = int(os.environ.get("BENCH_CLIENTS", "32"))
REQUESTS_PER_CLIENT = 40
ROUNDS = 3
SLOTS_TOTAL = 2000  # ~2 slots per request × 1280 requests: the pool fills before the end


_WORKER = None


def _call_worker(plan):
    return _WORKER(plan)


def run(label, worker):
    """Run ``worker(plan)`` in CLIENTS forked processes (each its own connection), like web workers.

    Processes, not threads: with threads the lock holder competes for the GIL with 31 others and
    the figure measures the interpreter rather than the database critical section.
    """
    global _WORKER
    from django.db import connections

    rng = random.Random(label)
    plans = [[rng.randint(1, 3) for _ in range(REQUESTS_PER_CLIENT)] for _ in range(CLIENTS)]
    _WORKER = worker
    connections.close_all()  # children must not share the parent's socket
    context = multiprocessing.get_context("fork")
    start = time.perf_counter()
    with context.Pool(CLIENTS) as processes:
        results = processes.map(_call_worker, plans, chunksize=1)
    elapsed = time.perf_counter() - start
    latencies = [value for chunk in results for value in chunk]
    return len(latencies) / elapsed, latencies


def main() -> int:
    conninfo = django_on_bench_database()
    if conninfo is None:
        print("admission: skipped (needs PostgreSQL: set DATABASE_URL or start it on 127.0.0.1:5432)")
        return 0
    import psycopg
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.db.models import Sum

    from apps.resources.models import ResourceClass, ResourcePool
    from apps.sessions import services
    from apps.sessions.models import Session

    user, _ = get_user_model().objects.get_or_create(username="bench")
    reset_rows()
    pools = {}
    for name in ("bench-service", "bench-baseline"):
        pool = ResourcePool.objects.create(name=name, kind="local", slots_total=SLOTS_TOTAL)
        ResourceClass.objects.create(pool=pool, name="c", cpu=1, memory=1, default=True)
        pools[name] = pool

    service_class = pools["bench-service"].classes.get()

    def service_worker(plan):
        out = []
        try:
            for slots in plan:
                t0 = time.perf_counter()
                try:
                    services.admit(user=user, resource_class=service_class, slots=slots)
                except services.CapacityExceeded:
                    pass
                out.append(time.perf_counter() - t0)
        finally:
            connection.close()
        return out

    baseline_pool = pools["bench-baseline"]
    baseline_class = baseline_pool.classes.get()

    def baseline_worker(plan):
        out = []
        with psycopg.connect(conninfo) as conn:
            for slots in plan:
                t0 = time.perf_counter()
                with conn.transaction():
                    conn.execute("SELECT id FROM resources_resourcepool WHERE id = %s FOR UPDATE", (baseline_pool.pk,))
                    used = conn.execute(
                        "SELECT COALESCE(SUM(slots), 0) FROM compute_sessions_session "
                        "WHERE pool_id = %s AND status = 'active'",
                        (baseline_pool.pk,),
                    ).fetchone()[0]
                    if used + slots <= SLOTS_TOTAL:
                        now = datetime.now(UTC)
                        conn.execute(
                            "INSERT INTO compute_sessions_session (id, user_id, resource_class_id, pool_id, slots, "
                            "external_id, status, created_at, last_activity_at, expires_at, idle_expires_at, "
                            "revocation_reason, vruntime, launch_spec, cpu, memory, gpu, reserved_slots) VALUES "
                            "(%s, %s, %s, %s, %s, '', 'active', %s, %s, %s, %s, '', 0, '{}', 1, 1, 0, 0)",
                            (
                                uuid.uuid4(),
                                user.pk,
                                baseline_class.pk,
                                baseline_pool.pk,
                                slots,
                                now,
                                now,
                                now + timedelta(days=30),
                                now + timedelta(hours=1),
                            ),
                        )
                out.append(time.perf_counter() - t0)
        return out

    def used(pool):
        return Session.objects.active().filter(pool=pool).aggregate(n=Sum("slots"))["n"] or 0

    over_service = over_baseline = 0
    # Alternate rounds so that machine noise hits both alike; report the median round of each.
    rounds = {"baseline": [], "service": []}
    for i in range(ROUNDS):
        for label, worker, pool in (
            ("baseline", baseline_worker, baseline_pool),
            ("service", service_worker, pools["bench-service"]),
        ):
            if i:  # every round starts from an empty pool (the recount zeroes its usage counters)
                Session.objects.filter(pool=pool).delete()
                services.recount_usage()
            rounds[label].append(run(f"{label}{i}", worker))
            if label == "baseline":
                over_baseline = max(over_baseline, max(0, used(pool) - SLOTS_TOTAL))
            else:
                over_service = max(over_service, max(0, used(pool) - SLOTS_TOTAL))
    (baseline_rate, baseline_lat), (service_rate, service_lat) = (
        sorted(rounds[label], key=lambda r: r[0])[ROUNDS // 2] for label in ("baseline", "service")
    )
    ms = 1000
    print(
        f"admission: {CLIENTS} concurrent client processes x {REQUESTS_PER_CLIENT} requests, "
        f"slots_total={SLOTS_TOTAL}, median of {ROUNDS} alternating rounds"
    )
    print(
        f"  baseline (raw SQL lock+sum+insert): {baseline_rate:8.1f} admissions/s  "
        f"p50 {percentile(baseline_lat, 50) * ms:6.1f} ms  p99 {percentile(baseline_lat, 99) * ms:6.1f} ms"
    )
    print(
        f"  service  (services.admit)         : {service_rate:8.1f} admissions/s  "
        f"p50 {percentile(service_lat, 50) * ms:6.1f} ms  p99 {percentile(service_lat, 99) * ms:6.1f} ms"
    )
    print(f"  ratio service/baseline: {service_rate / baseline_rate:.2f} (target >= 0.50)")
    print(f"  oversubscriptions: service {over_service}, baseline {over_baseline} (target 0)")
    reset_rows()
    return 0


if __name__ == "__main__":
    sys.exit(main())
