"""Fairness of the real dispatcher (SPEC §9), in simulation on the database.

weighted_fair: three continuously backlogged sessions of weights 1, 2, 5, plus sessions arriving
at random moments with bursts of jobs. Reports the largest |S_i/w_i - S_j/w_j| over every prefix
of the dispatch sequence against the bound 1/w_i + 1/w_j, the Jain index of S_i/w_i, and each
newcomer's turns in its first round against its share + 1.
usage_fair: the same sessions, all of one user (so this checks usage_fair's second level: SFQ
across a user's sessions), with heavy-tailed (Pareto) job durations measured in device time;
S_i is device time served, the bound is (longest job)/w_i + (longest job)/w_j.
usage_fair, two levels (R-SCHED-6): users first (decayed device time per unit of share weight,
half-life 1 h), then each user's sessions (SFQ). A moved clock (bench/_usage_sim.py): users ada,
bob (weight 1), cyd (weight 2), each with sessions of 1 and 2 slots, submitting bursts at
Poisson moments in on/off periods (backlogged most, not all, of the time), and two newcomers
(dee, eve) joining mid-run; log-normal jobs (mean 60 s, sigma 0.6), 24 h of device time, the
clock jumping from event to event (idle when nothing is pending). Checks, L = the longest job:
- level 2: for each user's pair of sessions, over every interval where both are backlogged
  (a job waiting or running), X = S_i/w_i - S_j/w_j counted from the interval's start (S: device
  time dispatched to the session, w: slots); the largest |X(t2) - X(t1)| over any sub-interval
  (max X - min X) against SFQ's bound L/w_i + L/w_j. The comparison starts afresh with each
  interval: the bound says nothing about the service of a session that had nothing to run.
- level 1, Jain index: every 10 simulated minutes (at the next dispatch, the device idle and
  nothing in flight), over the users backlogged throughout the last 10 minutes (at least two),
  of (decayed usage + catch-up) / weight read from FairShare (``shares.decayed``): the quantity
  usage_fair orders by and promises to equalize among users with work. ``catch_up`` is what
  raised a user who became backlogged below the level's virtual time to it (R-SCHED-2 at level 1:
  no burst for a newcomer, nor payback for a user back from idle), which is why only users
  backlogged for a whole window are counted: by then they have competed. Its 1-hour memory spans
  about 90 jobs, so one job's granularity moves it little, where the device time of a 10-minute
  window (2 or 3 jobs a user) would measure the job sizes rather than the scheduler. Mean >= 0.99
  is the target; the minimum is printed with the spread of the values at that reading in units of
  L (a user just charged a long job is up to L/w above the others). For information, without a
  target: the same index of decayed usage alone (a user back from idle used less, and rightly is
  not paid back), and of the device time actually served in the last hour to the users
  backlogged all that hour (their usage before the hour rightly counts).
- level 1, first round: whenever a user becomes backlogged while others are (a newcomer, or a
  user back from idle), its device time in the next k = ceil(sum of the backlogged users' weights /
  its weight) dispatches against its share of the device time of those k dispatches (weight / the
  backlogged weights) + L. Turns are printed too, but in usage_fair shorter jobs rightly earn more
  turns, so the bound is in device time.
drained arrivals: A runs 8·w_A jobs and drains; B arrives into the empty queue with 8·w_B jobs; A
queues 8·w_A more. B's turns in the next 8·(w_A + w_B) against its share + 1. QRMI pattern: four
sessions that each submit one job, wait for it, submit the next (their queue is empty while their
job runs) share a four-job device; a backlogged session arrives. Its turns in its first round
against share + 1, and the Jain index of S_i/w_i over the dispatches after it arrived.

The runs measure order, not speed: this connection commits without waiting for the WAL flush
(``_usage_sim.fast_commits``). ``--two-level``: that section only.
"""

import math
import random
import sys
from dataclasses import dataclass
from itertools import combinations

sys.path.insert(0, __file__.rsplit("/bench/", 1)[0])
from bench._setup import django_on_bench_database, reset_rows  # noqa: E402

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

    reset_rows()
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
    from apps.scheduling.models import Device

    reset_rows()
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


TWO_LEVEL_HOURS = 24.0  # of device time served
CHECKPOINT = 600.0  # simulated seconds between two readings of the shares
HALF_LIFE = 3600  # the pool's usage_half_life


@dataclass
class Pair:
    """Two sessions of one user, and their lag while both are backlogged (SFQ's interval)."""

    a: object
    b: object
    active: bool = False
    x: float = 0.0  # S_a/w_a - S_b/w_b since the interval began
    high: float = 0.0
    low: float = 0.0
    worst: float = 0.0  # the largest high - low of any interval: |ΔX| over any sub-interval
    intervals: int = 0


@dataclass
class Round:
    """A user's first round after it became backlogged while others were."""

    user: str
    newcomer: bool
    at: float
    k: int  # dispatches in the round
    share: float  # its weight / the backlogged users' weights
    left: int = 0
    mine: float = 0.0  # its device time in the round
    total: float = 0.0  # the device time of the round
    turns: int = 0


def two_level():
    """usage_fair's two levels on a moved clock (bench/_usage_sim.py): see the module docstring."""
    import time_machine

    from apps.scheduling import shares
    from apps.scheduling.models import FairShare
    from bench._usage_sim import START, Simulation, UserSpec, jain, lognormal

    rng = random.Random(SEED)
    day = TWO_LEVEL_HOURS * 3600
    users = [
        UserSpec("ada", 1, (1, 2), load=0.16),
        UserSpec("bob", 1, (1, 2), load=0.16),
        UserSpec("cyd", 2, (1, 2), load=0.32),
        UserSpec("dee", 1, (1, 2), joins_at=rng.uniform(0.25, 0.4) * day, load=0.12),  # newcomers
        UserSpec("eve", 1, (1,), joins_at=rng.uniform(0.6, 0.75) * day, load=0.16),
    ]
    sim = Simulation("usage_fair", users, SEED, lambda rng: (1, lognormal(rng, 60.0)))
    pairs: list[Pair] = []
    rounds: list[Round] = []
    since: dict = {}  # user -> when it last became backlogged (absent: not backlogged now)
    seen: set = set()
    joins = {u.name: u.joins_at for u in users}
    backlogged_for = dict.fromkeys((u.name for u in users), 0.0)
    served_log = []  # (ended at, user, device seconds)
    readings = []  # (Jain of U/w, spread of U/w, users)
    hourly = []  # Jain of the device time served in the last hour
    usage_only = []  # Jain of the decayed usage / weight, without the catch-up
    next_mark = [CHECKPOINT]

    def refresh():
        for pair in pairs:
            both = pair.a.backlogged and pair.b.backlogged
            if both and not pair.active:
                pair.active, pair.x, pair.high, pair.low = True, 0.0, 0.0, 0.0
                pair.intervals += 1
            pair.active = both
        backlogged = set(sim.backlogged_users())
        for name in set(since) - backlogged:
            backlogged_for[name] += sim.clock - since.pop(name)
        for name in sorted(backlogged - set(since)):
            since[name] = sim.clock
            if len(backlogged) > 1:
                weights = sum(sim.weight[u] for u in backlogged)
                k = math.ceil(weights / sim.weight[name] - 1e-9)
                newcomer = name not in seen and joins[name] > 0
                rounds.append(Round(name, newcomer, sim.clock, k, sim.weight[name] / weights, left=k))
            seen.add(name)

    def dispatched(state, job, seconds):
        for pair in pairs:
            if pair.active and state in (pair.a, pair.b):
                pair.x += seconds / state.slots * (1 if state is pair.a else -1)
                pair.high, pair.low = max(pair.high, pair.x), min(pair.low, pair.x)
                pair.worst = max(pair.worst, pair.high - pair.low)
        for entry in rounds:
            if entry.left > 0:
                entry.left -= 1
                entry.total += seconds
                if state.user == entry.user:
                    entry.mine += seconds
                    entry.turns += 1

    def finished(state, job, seconds):
        served_log.append((sim.clock, state.user, seconds))
        refresh()

    def checkpoint():
        # Called with the device idle (a job just ended and was charged): nothing in flight.
        if sim.clock < next_mark[0]:
            return
        while next_mark[0] <= sim.clock:
            next_mark[0] += CHECKPOINT
        steady = sorted(u for u, t in since.items() if t <= sim.clock - CHECKPOINT)
        if len(steady) < 2:
            return
        now = START.timestamp() + sim.clock
        rows = {s.user.username: s for s in FairShare.objects.filter(pool=sim.pool).select_related("user")}
        found = [rows[f"bench-{u}"] for u in steady]
        keyed = [shares.decayed(r.usage + r.catch_up, r.usage_at, now, HALF_LIFE) / r.weight for r in found]
        used = [shares.decayed(r.usage, r.usage_at, now, HALF_LIFE) / r.weight for r in found]
        readings.append((jain(keyed), max(keyed) - min(keyed), steady))
        usage_only.append(jain(used))
        hour = [u for u in steady if since[u] <= sim.clock - 3600]
        if len(hour) > 1:
            got = dict.fromkeys(hour, 0.0)
            for ended, user, seconds in reversed(served_log):
                if ended <= sim.clock - 3600:
                    break
                if user in got:
                    got[user] += seconds
            hourly.append(jain(got[u] / sim.weight[u] for u in hour))

    sim.hooks.update(
        submitted=lambda arrival, jobs: refresh(), dispatched=dispatched, finished=finished, before_dispatch=checkpoint
    )
    with time_machine.travel(START, tick=False) as traveller:
        sim.build(traveller, horizon=3 * day)
        pairs += [Pair(a, b) for states in sim.user_sessions.values() for a, b in combinations(states, 2)]
        sim.run(traveller, device_seconds=day)
    for name in list(since):
        backlogged_for[name] += sim.clock - since.pop(name)
    big = sim.longest
    print(
        f"  usage_fair, two levels: users (weights {', '.join(f'{u.name} {u.weight:g}' for u in users)}), "
        "then each user's sessions (slots 1 and 2)"
    )
    print(
        f"    {sim.dispatches} dispatches, {sim.device_seconds / 3600:.1f} h of device time over "
        f"{sim.clock / 3600:.1f} h, log-normal jobs (mean 60 s, sigma 0.6), longest L = {big:.0f} s; "
        "newcomers dee at "
        f"{users[3].joins_at / 3600:.1f} h, eve at {users[4].joins_at / 3600:.1f} h"
    )
    print(
        "    backlogged: "
        + ", ".join(f"{u.name} {backlogged_for[u.name] / (sim.clock - u.joins_at):.0%}" for u in users)
        + " of the time since they joined"
    )
    ok = True
    print("    level 2, max |S_i/w_i - S_j/w_j| over any interval where both sessions are backlogged:")
    for pair in pairs:
        bound = big / pair.a.slots + big / pair.b.slots
        ok &= pair.worst <= bound + 1e-9
        print(
            f"      {pair.a.user} w={pair.a.slots} vs w={pair.b.slots}: {pair.worst:6.1f} s "
            f"(bound L/{pair.a.slots} + L/{pair.b.slots} = {bound:.1f} s), {pair.intervals} intervals"
        )
    values = [r[0] for r in readings]
    mean = sum(values) / len(values)
    worst = min(readings)
    ok &= mean >= 0.99
    print(
        f"    level 1, Jain of (decayed usage + catch-up) / weight of the users backlogged for the last "
        f"{CHECKPOINT / 60:.0f} min, every {CHECKPOINT / 60:.0f} min ({len(values)} readings): mean {mean:.4f} "
        f"(target >= 0.99), min {worst[0]:.4f} (spread {worst[1]:.0f} s = {worst[1] / big:.2f} L, "
        f"{len(worst[2])} users)"
    )
    print(
        "      no target (a user back from idle rightly used less, and is not paid back): "
        f"the same of decayed usage / weight alone: mean {sum(usage_only) / len(usage_only):.4f}, "
        f"min {min(usage_only):.4f}; device time served in the last hour to the users backlogged all "
        f"that hour ({len(hourly)} readings): mean {sum(hourly) / len(hourly):.4f}, min {min(hourly):.4f}"
    )
    done = [r for r in rounds if r.left == 0]
    excess = max(done, key=lambda r: r.mine - r.share * r.total)
    ok &= all(r.mine <= r.share * r.total + big + 1e-9 for r in done)
    print(
        f"    level 1, first round of a user that becomes backlogged while others are ({len(done)} times): "
        "its device time in the next k = ceil(sum of backlogged weights / its weight) dispatches"
    )
    print(
        f"      worst excess over its share of the round: {excess.mine - excess.share * excess.total:.0f} s "
        f"({excess.user} at {excess.at / 3600:.1f} h: {excess.mine:.0f} s of {excess.total:.0f} s, share "
        f"{excess.share * excess.total:.0f} s) (bound L = {big:.0f} s); turns up to {max(r.turns for r in done)} "
        f"(shorter jobs, more turns)"
    )
    for entry in (r for r in done if r.newcomer):
        print(
            f"      newcomer {entry.user} at {entry.at / 3600:.1f} h: {entry.mine:.0f} s of {entry.total:.0f} s "
            f"in its first {entry.k} dispatches (share {entry.share * entry.total:.0f} s + L = "
            f"{entry.share * entry.total + big:.0f} s), {entry.turns} turns "
            f"(share + 1 = {entry.k * entry.share + 1:.0f})"
        )
    print(f"    verdict: {'within bounds' if ok else 'OUT OF BOUNDS'}")


def main() -> int:
    if django_on_bench_database() is None:
        print("fairness: skipped (needs PostgreSQL)")
        return 0
    from bench._usage_sim import fast_commits

    fast_commits()
    print("fairness: the real dispatcher (dispatch_once) on one single-job device")
    if "--two-level" in sys.argv:
        two_level()
        return 0
    for strategy in ("weighted_fair", "usage_fair"):
        simulate(strategy)
    two_level()
    drained_arrivals()
    qrmi_pattern()
    fresh_pool("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
