"""Fairness of the real dispatcher (SPEC §9), in simulation on the database.

weighted_fair: three continuously backlogged sessions of weights 1, 2, 5, plus sessions arriving
at random moments with bursts of jobs. Reports the largest |S_i/w_i - S_j/w_j| over every prefix
of the dispatch sequence against the bound 1/w_i + 1/w_j, the Jain index of S_i/w_i, and each
newcomer's turns in its first round against its share + 1.
usage_fair: the same sessions with heavy-tailed (Pareto) job durations measured in device time;
S_i is device time served, the bound is (longest job)/w_i + (longest job)/w_j.
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
    from apps.scheduling import services
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
                services.submit_job(session=session, payload={}, shots=1)
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
        job = services.dispatch_once(pool.pk)
        services.submit_claimed(job)
        runtime = min(rng.paretovariate(1.5), 50.0) if strategy == "usage_fair" else 1.0
        longest = max(longest, runtime)
        job.refresh_from_db()
        services._finish(job, DriverState("completed", runtime_seconds=runtime), expect_remote_id=job.remote_id)
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


def main() -> int:
    if django_on_bench_database() is None:
        print("fairness: skipped (needs PostgreSQL)")
        return 0
    print("fairness: the real dispatcher (dispatch_once) on one single-job device")
    for strategy in ("weighted_fair", "usage_fair"):
        simulate(strategy)
    return 0


if __name__ == "__main__":
    sys.exit(main())
