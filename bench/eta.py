"""Calibration of the expected start shown for a pending job (R-JOB-5, issue 34), on the real
dispatcher with a moved clock (``bench/_usage_sim.py``).

One pool with a one-job device. A warm-up user submits 100 jobs at once, which run first, so that
``DeviceRuntime`` holds measured device times in every shots band; then three users with two
sessions each (slots 1 and 2) submit bursts of jobs at random moments (on and off periods,
Poisson bursts while on), about 2 000 jobs in all, of 10, 100 or 1 000 shots (40/40/20 %) whose
device time is log-normal (sigma 0.6 unless ``BENCH_ETA_SIGMA`` says) around 15, 45 and 150 s:
the device is busy most of the time and the queue comes and goes.

What is sampled: each job's ETA (``selectors.queue_info``, the snapshot cache cleared first) the
moment it is submitted, which is what its owner sees first; one call for the jobs of a burst.
Its actual wait: ``scheduled_at`` minus that moment. The error is |ETA - wait| / wait, over the
jobs that waited at least ``FLOOR`` seconds (below it the ratio divides by almost nothing; the
excluded jobs are counted, with their largest absolute error). Targets: median <= 15 %, p90 <= 40 %.
Also printed: the median of ETA / wait (below 1: the ETA is early), how often the wait fell in
ETA ± the error shown, the factor the ETA is off by (symmetric: early and late alike), and the
error by the job's position in the queue when sampled, beside the **floor**: the error of an
oracle told which jobs will go first (later arrivals and order as they happened) that still has
only the expected device times. No estimator that knows device times as distributions does better
than the floor; where the floor misses the target, so must the ETA.

Then where the error comes from (``why``: the running job's remaining time, the device times of
the jobs ranked ahead, the order, the later arrivals against what the ETA foresaw, and the median
shown instead of the mean) and, after the verdict, the same estimator when nothing arrives after
the sample (``no_arrivals``: every pending job's ETA read at the last submission of a run) although
users were submitting until then: the ETA foresees arrivals that do not come.

``usage_fair`` and ``fifo`` by default (``fifo``, where nothing submitted later goes first, is the
control: what the estimator does when the order is known); ``BENCH_ETA_STRATEGIES`` names others
(the same arrivals and device times in each: they are drawn per session, not in serving order).
``BENCH_ETA_SIGMA`` sets the log-normal spread of device times within a band (default 0.6),
``BENCH_ETA_SEED`` the seed (default 34). The simulation's
connection commits without waiting for the WAL flush (``_usage_sim.fast_commits``).
"""

import math
import os
import statistics
import sys

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])
from bench._setup import django_on_bench_database, percentile  # noqa: E402

SEED = int(os.environ.get("BENCH_ETA_SEED", "34"))
JOBS = 2000
WARM_UP = 100
POSITIONS = ((1, 5), (6, 20), (21, 60), (61, 10**9))
FLOOR = 30.0  # seconds of actual wait below which a job is left out of the relative error
BANDS = ((10, 15.0, 0.4), (100, 45.0, 0.4), (1000, 150.0, 0.2))  # shots, mean device seconds, probability
SIGMA = float(os.environ.get("BENCH_ETA_SIGMA", "0.6"))  # log-normal spread of a job's device time in its band


def draw_job(rng):
    from bench._usage_sim import lognormal

    pick = rng.random()
    for shots, mean, probability in BANDS:
        if pick < probability:
            return shots, lognormal(rng, mean, SIGMA)
        pick -= probability
    return BANDS[-1][0], lognormal(rng, BANDS[-1][1], SIGMA)


def calibrate(strategy: str) -> bool:
    import time_machine

    from apps.scheduling import eta as model
    from apps.scheduling import selectors
    from apps.scheduling.models import Job
    from bench._usage_sim import START, Simulation, UserSpec

    users = [UserSpec("warm", 1, (1,), load=0.0, initial_jobs=WARM_UP)] + [
        UserSpec(name, 1, (1, 2), joins_at=2 * 3600.0, load=0.2) for name in ("ada", "bob", "cyd")
    ]
    sim = Simulation(strategy, users, SEED, draw_job)
    means = record_means()
    sampled = {}  # job id -> (submitted at, eta, eta error, position, expected device time ahead)
    queued = {}  # job id -> (the pending jobs when it was sampled, those ranked before it)
    dispatched = []  # (at, job id, device seconds)
    warm_done = []

    def submitted(arrival, jobs):
        if sim.sessions[arrival.session].user == "warm":
            return
        model.clear_cache()  # the clock moved: the cache's 5 s are real seconds
        info = selectors.queue_info(jobs)
        snapshot = model.CACHE.snapshots[sim.pool.pk][2]  # the one queue_info just built
        pending = frozenset(snapshot.rank)
        for job in jobs:
            waiting = info[job.pk]
            ahead = float(snapshot.queue.before_mean[waiting.position - 1])
            sampled[job.pk] = (sim.clock, waiting.eta_seconds, waiting.eta_error_seconds, waiting.position, ahead)
            ranked = frozenset(j for j, r in snapshot.rank.items() if r < waiting.position)
            queued[job.pk] = (pending, ranked)

    def finished(state, job, seconds):
        if state.user == "warm" and not state.backlogged:
            warm_done.append(sim.clock)

    sim.hooks.update(
        submitted=submitted,
        dispatched=lambda state, job, seconds: dispatched.append((sim.clock, job.pk, seconds)),
        finished=finished,
    )
    with time_machine.travel(START, tick=False) as traveller:
        sim.build(traveller, horizon=10 * 86400, max_jobs=WARM_UP + JOBS)
        sim.run(traveller, until_drained=True)
    started = dict(Job.objects.filter(pk__in=sampled).values_list("pk", "scheduled_at"))
    rows = []
    for pk, (at, eta, error, position, _) in sampled.items():
        wait = (started[pk] - START).total_seconds() - at
        rows.append((at, wait, eta, error, position))
    kept = [r[1:] for r in rows if r[1] >= FLOOR and r[2] is not None]
    left_out = [r[1:] for r in rows if r[1] < FLOOR]
    relative = [abs(eta - wait) / wait for wait, eta, _, _ in kept]
    median, p90 = statistics.median(relative), percentile(relative, 90)
    ratio = statistics.median(eta / wait for wait, eta, _, _ in kept)
    covered = sum(abs(eta - wait) <= error for wait, eta, error, _ in kept) / len(kept)
    waits = [r[1] for r in rows]
    print(
        f"  {strategy}: {len(rows)} jobs sampled at submission after a {WARM_UP}-job warm-up "
        f"(done at {warm_done[0] / 3600:.1f} h), {sim.device_seconds / 3600:.1f} h of device time over "
        f"{sim.clock / 3600:.1f} h; waits median {statistics.median(waits):.0f} s, p90 {percentile(waits, 90):.0f} s"
    )
    print(
        f"    |ETA - wait| / wait over {len(kept)} jobs that waited >= {FLOOR:.0f} s ({len(left_out)} left out, "
        f"largest |ETA - wait| among them {max((abs(r[1] - r[0]) for r in left_out), default=0):.0f} s): "
        f"median {median:.0%} (target <= 15 %), p90 {p90:.0%} (target <= 40 %)"
    )
    print(
        f"    median ETA / wait {ratio:.2f} (1 = unbiased, below: early); wait within ETA ± its error "
        f"{covered:.0%} of the time (one sigma: about 68 %)"
    )
    factor = [abs(math.log(max(eta, 1.0) / wait)) for wait, eta, _, _ in kept]
    print(
        f"    the ETA is within a factor {math.exp(statistics.median(factor)):.2f} of the wait for half the jobs, "
        f"{math.exp(percentile(factor, 90)):.2f} for 90 %"
    )
    oracle = floor(sampled, dispatched, started, sim.shots_of)
    for low, high in POSITIONS:
        part = [abs(eta - wait) / wait for wait, eta, _, position in kept if low <= position <= high]
        bias = [eta / wait for wait, eta, _, position in kept if low <= position <= high]
        best = [error for position, error in oracle if low <= position <= high]
        if part:
            print(
                f"      position {low}-{high if high < 10**9 else '…'}: {len(part)} jobs, median error "
                f"{statistics.median(part):.0%}, p90 {percentile(part, 90):.0%}, median ETA / wait "
                f"{statistics.median(bias):.2f}; floor {statistics.median(best):.0%}, {percentile(best, 90):.0%}"
            )
    best = [error for _, error in oracle]
    print(
        f"    floor, over all: median {statistics.median(best):.0%}, p90 {percentile(best, 90):.0%} (what an oracle "
        f"knowing which jobs go first, but not their device times, would miss by)"
    )
    why(sampled, queued, dispatched, started, means)
    ok = median <= 0.15 and p90 <= 0.40
    print(f"    verdict: {'within targets' if ok else 'OUT OF TARGETS'}")
    return ok


def record_means() -> dict:
    """``{job id: (mean wait with nothing arriving, mean added by arrivals)}`` of each ETA computed
    from now on: what the ETA's median stands on, for ``why`` (the snapshot's ``arrivals`` is
    wrapped to note its arguments and answer)."""
    from apps.scheduling import eta as model

    means = {}
    original = model.Queue.arrivals

    def recording(snapshot, job_id, base, capacity):
        found = original(snapshot, job_id, base, capacity)
        means[job_id] = (base, found[0])
        return found

    model.Queue.arrivals = recording
    return means


def why(sampled, queued, dispatched, started, means) -> None:
    """Where the error comes from. With one device that never idles while a job waits, a job's
    wait is the running job's remaining time plus the device time of the jobs started before
    it; the mean the ETA stands on is the expected remaining time, the expected device time of
    the jobs ranked before it and the expected device time of the later arrivals that go first.
    So wait - mean splits exactly into: the running job's remaining time (actual - expected),
    the device times of the jobs ranked ahead (actual - expected), the order (the pending jobs
    that actually went first, minus those ranked ahead, in actual device time), and the later
    arrivals (actual - expected). The ETA shown is the median, not that mean: the last line.
    Each is printed over the wait (median of the signed value and of its magnitude) for the jobs
    that waited >= FLOOR."""
    import bisect

    from bench._usage_sim import START

    runtime = {pk: seconds for _, pk, seconds in dispatched}
    times = [at for at, _, _ in dispatched]
    parts = {
        "running job's remaining time": [],
        "device times ahead": [],
        "order": [],
        "later arrivals": [],
        "the median, not the mean": [],
    }
    for pk, (at, eta, _, _, ahead) in sampled.items():
        start = (started[pk] - START).total_seconds()
        wait = start - at
        if wait < FLOOR:
            continue
        pending, ranked = queued[pk]
        lo, hi = bisect.bisect_left(times, at), bisect.bisect_left(times, start)
        before = {pk_ for _, pk_, _ in dispatched[lo:hi] if pk_ != pk}
        running = [(t, s) for t, pk_, s in dispatched[max(lo - 1, 0) : lo] if t < at < t + s]
        remaining = running[0][0] + running[0][1] - at if running else 0.0
        actual_ahead = sum(runtime[j] for j in ranked)
        went = sum(runtime[j] for j in before & pending)
        base, arriving = means[pk]
        parts["running job's remaining time"].append((remaining - (base - ahead)) / wait)
        parts["device times ahead"].append((actual_ahead - ahead) / wait)
        parts["order"].append((went - actual_ahead) / wait)
        parts["later arrivals"].append((sum(runtime[j] for j in before - pending) - arriving) / wait)
        parts["the median, not the mean"].append((base + arriving - eta) / wait)
    print("    where wait - ETA comes from, over the wait (median signed, median |.|, p90 |.|):")
    for name, values in parts.items():
        magnitudes = [abs(v) for v in values]
        print(
            f"      {name:29s}: {statistics.median(values):+.0%}, {statistics.median(magnitudes):.0%}, "
            f"{percentile(magnitudes, 90):.0%}"
        )


def floor(sampled, dispatched, started, shots_of) -> list:
    """The error no estimator that knows device times only as distributions can avoid: an
    oracle told which jobs will start before each one (the later arrivals and the order as they
    happened) still adds up their expected device times, and the running job's expected rest.
    Returns (position, |oracle - wait| / wait) of the jobs that waited >= FLOOR."""
    import bisect

    from apps.scheduling.runtimes import Estimate
    from bench._usage_sim import START

    spread = math.sqrt(math.exp(SIGMA * SIGMA) - 1)  # a log-normal's std / mean
    expected = {shots: Estimate(mean, mean * spread) for shots, mean, _ in BANDS}
    times = [at for at, _, _ in dispatched]
    errors = []
    for pk, (at, _, _, position, _) in sampled.items():
        start = (started[pk] - START).total_seconds()
        wait = start - at
        if wait < FLOOR:
            continue
        lo, hi = bisect.bisect_left(times, at), bisect.bisect_left(times, start)
        eta = sum(expected[shots_of[j]].mean for _, j, _ in dispatched[lo:hi] if j != pk)
        if lo and dispatched[lo - 1][0] < at < dispatched[lo - 1][0] + dispatched[lo - 1][2]:
            t, j, _ = dispatched[lo - 1]
            eta += expected[shots_of[j]].remaining(at - t).mean
        errors.append((position, abs(eta - wait) / wait))
    return errors


def no_arrivals(strategy: str) -> None:
    """Arrivals that stop: three users (offered loads 0.5, 0.3, 0.2 while on) submit 400 jobs
    after the warm-up; at the last submission every pending job's ETA is read, and nothing arrives
    after it, while the ETA still expects each user's recent rate. Same error measure."""
    import time_machine

    from apps.scheduling import eta as model
    from apps.scheduling import selectors
    from apps.scheduling.models import Job, JobStatus
    from bench._usage_sim import START, Simulation, UserSpec

    users = [UserSpec("warm", 1, (1,), load=0.0, initial_jobs=WARM_UP)] + [
        UserSpec(name, 1, (1, 2), joins_at=2 * 3600.0, load=load)
        for name, load in (("ada", 0.5), ("bob", 0.3), ("cyd", 0.2))
    ]
    sim = Simulation(strategy, users, SEED + 1, draw_job)
    sampled = {}

    def submitted(arrival, jobs):
        if sim.queue:  # not the last submission yet
            return
        model.clear_cache()
        pending = list(Job.objects.filter(pool=sim.pool, status=JobStatus.PENDING).select_related("pool"))
        info = selectors.queue_info(pending)
        sampled.update({job.pk: (sim.clock, info[job.pk].eta_seconds) for job in pending})

    sim.hooks["submitted"] = submitted
    with time_machine.travel(START, tick=False) as traveller:
        sim.build(traveller, horizon=10 * 86400, max_jobs=WARM_UP + 400)
        sim.run(traveller, until_drained=True)
    started = dict(Job.objects.filter(pk__in=sampled).values_list("pk", "scheduled_at"))
    pairs = [((started[pk] - START).total_seconds() - at, eta) for pk, (at, eta) in sampled.items()]
    relative = [abs(eta - wait) / wait for wait, eta in pairs if wait >= FLOOR]
    print(
        f"    nothing arriving after the sample ({len(pairs)} jobs pending at the last of 400 submissions, "
        f"{len(relative)} waited >= {FLOOR:.0f} s): median {statistics.median(relative):.0%}, "
        f"p90 {percentile(relative, 90):.0%}, median ETA / wait "
        f"{statistics.median(eta / wait for wait, eta in pairs if wait >= FLOOR):.2f}"
    )


def main() -> int:
    if django_on_bench_database() is None:
        print("eta: skipped (needs PostgreSQL)")
        return 0
    from apps.resources.models import ResourcePool
    from apps.scheduling.models import Job
    from apps.sessions.models import Session
    from bench._usage_sim import fast_commits

    fast_commits()
    print(f"eta: expected start of a pending job against its actual wait, {JOBS} jobs on one single-job device")
    for strategy in os.environ.get("BENCH_ETA_STRATEGIES", "usage_fair,fifo").split(","):
        calibrate(strategy.strip())
        no_arrivals(strategy.strip())
    Job.objects.all().delete()
    Session.objects.all().delete()
    ResourcePool.objects.filter(name__startswith="bench-").delete()
    return 0


if __name__ == "__main__":
    sys.exit(main())
