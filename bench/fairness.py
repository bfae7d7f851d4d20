"""Fairness of the real dispatcher (SPEC §9), in simulation on the database.

weighted_fair: three continuously backlogged sessions of weights 1, 2, 5, plus sessions arriving
at random moments with bursts of jobs. Reports the largest |S_i/w_i - S_j/w_j| over every prefix
of the dispatch sequence against the bound 1/w_i + 1/w_j, the Jain index of S_i/w_i, and each
newcomer's turns in its first round against its share + 1.
usage_fair: the same sessions with heavy-tailed (Pareto) job durations measured in device time;
S_i is device time served, the bound is (longest job)/w_i + (longest job)/w_j.
drained arrivals: A runs 8·w_A jobs and drains; B arrives into the empty queue with 8·w_B jobs; A
queues 8·w_A more. B's turns in the next 8·(w_A + w_B) against its share + 1. QRMI pattern: four
sessions that each submit one job, wait for it, submit the next (their queue is empty while their
job runs) share a four-job device; a backlogged session arrives. Its turns in its first round
against share + 1, and the Jain index of S_i/w_i over the dispatches after it arrived.
"""

import random
import sys
from itertools import combinations

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])
from bench._setup import django_on_bench_database  # noqa: E402

WEIGHTS = (1, 2, 5)
DISPATCHES = 600
SEED = 11


def jain(values):
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values)) if any(values) else 1.0


def simulate(strategy):
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from apps.resources.models import ResourceClass, ResourcePool
    from apps.scheduling import passes, services
    from apps.scheduling.drivers import DriverState
    from apps.scheduling.models import Device, Job
    from apps.sessions import services as session_services
    from apps.sessions.models import Session

    Job.objects.all().delete()
    Session.objects.all().delete()
    ResourcePool.objects.filter(name__startswith="bench-").delete()
    rng = random.Random(SEED)
    user, _ = get_user_model().objects.get_or_create(username="bench")
    pool = ResourcePool.objects.create(name=f"bench-{strategy}", kind="local", strategy=strategy)
    klass = ResourceClass.objects.create(pool=pool, name="c", cpu=1, memory=1, default=True)
    Device.objects.create(pool=pool, name="d", driver="fake", max_concurrent_jobs=1)

    def open_session(weight, jobs, tag, bulk=False):
        session = session_services.admit(user=user, resource_class=klass, slots=weight, external_id=tag).session
        if bulk:  # backlogged from the start: no catch-up involved, so insert them directly
            now = timezone.now()
            Job.objects.bulk_create(
                Job(session=session, pool=pool, user=user, payload={}, shots=1, created_at=now) for _ in range(jobs)
            )
        else:  # through the service: catch-up (R-SCHED-2) applies to the first job
            for _ in range(jobs):
                services.submit_job(user=session.user, session_id=session.pk, payload={}, shots=1)
        return session

    steady = [open_session(w, DISPATCHES, f"steady-{w}", bulk=True) for w in WEIGHTS]
    weight_of = {s.pk: s.slots for s in steady}
    served = {s.pk: 0.0 for s in steady}
    worst = dict.fromkeys(combinations([s.pk for s in steady], 2), 0.0)
    longest = 0.0
    arrivals = sorted(rng.sample(range(100, DISPATCHES - 100), 3))
    newcomers = []  # (session, weight, turns in first round, round length)
    for step in range(DISPATCHES):
        if arrivals and step == arrivals[0]:
            arrivals.pop(0)
            weight = rng.choice(WEIGHTS)
            session = open_session(weight, 40, f"new-{step}")
            total_weight = sum(WEIGHTS) + weight + sum(w for _, w, *_ in newcomers)
            # Its first round: sum-of-weights dispatches, in which its share is `weight` turns.
            newcomers.append([session.pk, weight, 0, total_weight])
        job = passes.dispatch_once(pool.pk)
        passes.submit_claimed(job)
        runtime = min(rng.paretovariate(1.5), 50.0) if strategy == "usage_fair" else 1.0
        longest = max(longest, runtime)
        job.refresh_from_db()
        passes._finish(job, DriverState("completed", runtime_seconds=runtime), expect_remote_id=job.remote_id)
        if job.session_id in served:
            served[job.session_id] += runtime if strategy == "usage_fair" else 1
            for a, b in worst:
                worst[(a, b)] = max(worst[(a, b)], abs(served[a] / weight_of[a] - served[b] / weight_of[b]))
        for entry in newcomers:
            if entry[3] > 0:  # still in its first round: count its turns
                entry[2] += job.session_id == entry[0]
                entry[3] -= 1
                if entry[3] == 0:
                    entry[3] = -1
    unit = longest if strategy == "usage_fair" else 1.0
    print(f"  {strategy}: {DISPATCHES} dispatches, steady weights {WEIGHTS}, {len(newcomers)} random arrivals")
    ok = True
    for (a, b), gap in worst.items():
        bound = unit / weight_of[a] + unit / weight_of[b]
        ok &= gap <= bound + 1e-9
        print(f"    max prefix |S/w| gap w={weight_of[a]} vs w={weight_of[b]}: {gap:7.3f}  (bound {bound:.3f})")
    index = jain([served[s] / weight_of[s] for s in served])
    print(f"    Jain index of S_i/w_i: {index:.4f} (target >= 0.99)")
    for _, weight, turns, _ in newcomers:
        if strategy == "usage_fair":  # shares are device time, not turns: the gap bound covers it
            continue
        ok &= turns <= weight + 1
        print(f"    newcomer w={weight}: {turns} turns in its first round (share + 1 = {weight + 1})")
    print(f"    verdict: {'within bounds' if ok and index >= 0.99 else 'OUT OF BOUNDS'}")


def fresh_pool(name, capacity=1):
    from django.contrib.auth import get_user_model

    from apps.resources.models import ResourceClass, ResourcePool
    from apps.scheduling.models import Device, Job
    from apps.sessions.models import Session

    Job.objects.all().delete()
    Session.objects.all().delete()
    ResourcePool.objects.filter(name__startswith="bench-").delete()
    pool = ResourcePool.objects.create(name=f"bench-{name}", kind="local", strategy="weighted_fair")
    klass = ResourceClass.objects.create(pool=pool, name="c", cpu=1, memory=1, default=True)
    Device.objects.create(pool=pool, name="d", driver="fake", max_concurrent_jobs=capacity)
    user, _ = get_user_model().objects.get_or_create(username="bench")
    return pool, klass, user


def run_one(pool):
    """Dispatch one job, hand it to the device, complete it: the served session id."""
    from apps.scheduling import passes
    from apps.scheduling.drivers import DriverState

    job = passes.dispatch_once(pool.pk)
    passes.submit_claimed(job)
    job.refresh_from_db()
    passes._finish(job, DriverState("completed", runtime_seconds=1.0), expect_remote_id=job.remote_id)
    return job.session_id


def drained_arrivals():
    from apps.scheduling import services
    from apps.sessions import services as session_services

    print("  drained arrivals (weighted_fair): B arrives while nobody has work pending")
    ok = True
    for w_a, w_b in ((1, 1), (1, 2), (2, 1), (1, 5)):
        pool, klass, user = fresh_pool("drained")
        a = session_services.admit(user=user, resource_class=klass, slots=w_a, external_id="a").session

        def submit(session, n):
            for _ in range(n):
                services.submit_job(user=session.user, session_id=session.pk, payload={}, shots=1)

        submit(a, 8 * w_a)
        for _ in range(8 * w_a):
            run_one(pool)
        b = session_services.admit(user=user, resource_class=klass, slots=w_b, external_id="b").session
        submit(b, 8 * w_b)
        submit(a, 8 * w_a)
        window = w_a + w_b
        served = [run_one(pool) for _ in range(8 * window)]
        first_round = served[:window].count(b.pk)
        index = jain([served.count(a.pk) / w_a, served.count(b.pk) / w_b])
        ok &= first_round <= w_b + 1 and index >= 0.99
        print(
            f"    w_A={w_a} w_B={w_b}: B took {served.count(b.pk)} of the next {len(served)} turns "
            f"(share {8 * w_b}); first round {first_round} (share + 1 = {w_b + 1}); Jain {index:.4f}"
        )
    print(f"    verdict: {'within bounds' if ok else 'OUT OF BOUNDS'}")


def qrmi_pattern():
    from apps.scheduling import passes, services
    from apps.scheduling.drivers import DriverState
    from apps.scheduling.models import Job
    from apps.sessions import services as session_services

    capacity, clients, before, after = 4, 4, 120, 400
    pool, klass, user = fresh_pool("qrmi", capacity=capacity)
    qrmi = [
        session_services.admit(user=user, resource_class=klass, slots=1, external_id=f"q{i}").session
        for i in range(clients)
    ]
    for session in qrmi:
        services.submit_job(user=user, session_id=session.pk, payload={}, shots=1)
    running: list[Job] = []
    served: list = []

    def step():
        while len(running) < capacity:  # fill the device
            job = passes.dispatch_once(pool.pk)
            if job is None:
                break
            passes.submit_claimed(job)
            job.refresh_from_db()
            running.append(job)
            served.append(job.session_id)
        job = running.pop(0)  # the oldest run ends; a QRMI client submits its next job at once
        passes._finish(job, DriverState("completed", runtime_seconds=1.0), expect_remote_id=job.remote_id)
        if job.session_id in {s.pk for s in qrmi}:
            session = next(s for s in qrmi if s.pk == job.session_id)
            services.submit_job(user=user, session_id=session.pk, payload={}, shots=1)

    while len(served) < before:
        step()
    newcomer = session_services.admit(user=user, resource_class=klass, slots=1, external_id="new").session
    for _ in range(after):
        services.submit_job(user=user, session_id=newcomer.pk, payload={}, shots=1)
    mark = len(served)
    while len(served) < mark + after:
        step()
    window = served[mark : mark + after]
    ids = [s.pk for s in qrmi] + [newcomer.pk]
    first_round = served[mark : mark + len(ids)].count(newcomer.pk)
    index = jain([window.count(i) for i in ids])
    ok = first_round <= 2 and index >= 0.99
    print(
        f"  QRMI pattern (weighted_fair): {clients} one-job-at-a-time sessions on a {capacity}-job device, "
        f"then a backlogged newcomer"
    )
    print(
        f"    newcomer: {window.count(newcomer.pk)} of the next {after} dispatches (share {after // len(ids)}); "
        f"first round {first_round} (share + 1 = 2); Jain of S_i/w_i {index:.4f}"
    )
    print(f"    verdict: {'within bounds' if ok else 'OUT OF BOUNDS'}")


def main() -> int:
    if django_on_bench_database() is None:
        print("fairness: skipped (needs PostgreSQL)")
        return 0
    print("fairness: the real dispatcher (dispatch_once) on one single-job device")
    for strategy in ("weighted_fair", "usage_fair"):
        simulate(strategy)
    drained_arrivals()
    qrmi_pattern()
    fresh_pool("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
