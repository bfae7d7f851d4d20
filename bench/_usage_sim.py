"""A moved-clock simulation of one pool with a one-job device, on the real dispatcher.

Shared by ``fairness.py`` (the two-level ``usage_fair`` section) and ``eta.py``. Everything that
decides runs for real: ``services.submit_job`` at each submission, ``passes.dispatch_once`` and
``passes.submit_claimed`` (the ``fake`` driver), ``passes._finish`` with the job's device time at
its end (which charges the session and the share, R-SCHED-6, and feeds ``DeviceRuntime``,
R-JOB-5). Only the clock is simulated (``time_machine``, no ticking): it jumps to the next event,
a submission or the end of the running job, so a day of device time takes a few thousand
dispatches and no waiting.

Arrivals are drawn before the run, per session from its own seeded generator, so they and the
jobs' device times do not depend on the order the strategy serves them in: each session
alternates on and off periods (exponential lengths); while on, it submits bursts of jobs at
Poisson moments. A job's device time is drawn at its submission (log-normal).
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

START = datetime(2031, 3, 3, 8, 0, tzinfo=UTC)  # a fixed moment: runs are reproducible


def lognormal(rng: random.Random, mean: float, sigma: float = 0.6) -> float:
    """A log-normal draw with the given mean (not median): mu = ln(mean) - sigma²/2."""
    return rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)


@dataclass
class UserSpec:
    name: str
    weight: float
    slots: tuple  # one session per entry, with that many slots
    joins_at: float = 0.0  # seconds after the start
    load: float = 0.2  # mean offered load of each session while on (device seconds per second)
    initial_jobs: int = 0  # submitted by each of its sessions as it joins (a warm-up)


@dataclass
class Arrival:
    at: float
    session: int  # index into Simulation.sessions
    jobs: list  # (shots, device seconds)


@dataclass
class SessionState:
    index: int
    user: str
    slots: int
    pk: object = None
    pending: int = 0
    running: bool = False

    @property
    def backlogged(self) -> bool:
        """SFQ's sense: a job waiting or in service."""
        return self.pending > 0 or self.running


@dataclass
class Simulation:
    """The pool, its users and sessions, the arrivals, and the bookkeeping of who is backlogged.

    ``hooks`` receive ``(sim, ...)``: ``submitted(arrival, jobs)``, ``dispatched(state, job,
    seconds)``, ``finished(state, job, seconds)``, ``before_dispatch()`` (the device is idle and
    nothing is in flight: the moment to read the shares).
    """

    strategy: str
    users: list
    seed: int
    draw_job: object  # (rng) -> (shots, device seconds)
    mean_burst: float = 3.0
    mean_on: float = 2 * 3600.0
    mean_off: float = 1800.0
    sessions: list = field(default_factory=list)
    clock: float = 0.0  # seconds since START
    device_seconds: float = 0.0  # served so far
    dispatches: int = 0
    longest: float = 0.0
    runtime_of: dict = field(default_factory=dict)  # job id -> device seconds
    session_of: dict = field(default_factory=dict)  # job id -> SessionState
    shots_of: dict = field(default_factory=dict)  # job id -> shots
    on_periods: dict = field(default_factory=dict)  # session index -> [(from, to)] while it may submit
    hooks: dict = field(default_factory=dict)

    def build(self, traveller, horizon: float, max_jobs: int | None = None) -> None:
        """The pool, device, users (with their share weights), sessions and arrivals up to
        ``horizon``, or up to the arrival that brings the jobs submitted to ``max_jobs``."""
        from django.contrib.auth import get_user_model

        from apps.resources.models import ResourceClass, ResourcePool
        from apps.scheduling.models import Device, FairShare
        from apps.sessions import services as session_services
        from bench._setup import reset_rows

        reset_rows()
        self.pool = ResourcePool.objects.create(
            name=f"bench-sim-{self.strategy}",
            kind="local",
            strategy=self.strategy,
            usage_half_life=3600,
            idle_timeout=30 * 86400,  # a session off for hours is still the same session
            max_lifetime=30 * 86400,
        )
        self.klass = ResourceClass.objects.create(pool=self.pool, name="c", cpu=1, memory=1, default=True)
        self.device = Device.objects.create(pool=self.pool, name="d", driver="fake", max_concurrent_jobs=1)
        self.user_obj = {}
        self.weight = {}
        self.user_sessions: dict[str, list[SessionState]] = {}
        arrivals = []
        for spec in self.users:
            user, _ = get_user_model().objects.get_or_create(username=f"bench-{spec.name}")
            self.user_obj[spec.name] = user
            self.weight[spec.name] = spec.weight
            FairShare.objects.create(pool=self.pool, user=user, weight=spec.weight)
            self.user_sessions[spec.name] = []
            for slots in spec.slots:
                state = SessionState(len(self.sessions), spec.name, slots)
                # One millisecond apart: sessions tie-break on their age, then on their random id.
                traveller.shift(timedelta(milliseconds=1))
                state.pk = session_services.admit(
                    user=user, resource_class=self.klass, slots=slots, external_id=f"{spec.name}-{state.index}"
                ).session.pk
                self.sessions.append(state)
                self.user_sessions[spec.name].append(state)
                rng = random.Random(f"{self.seed}-{spec.name}-{state.index}")
                arrivals += self._arrivals(rng, state.index, spec, horizon)
        arrivals.sort(key=lambda a: (a.at, a.session))
        if max_jobs is not None:
            kept, total = [], 0
            for arrival in arrivals:
                if total >= max_jobs:
                    break
                kept.append(arrival)
                total += len(arrival.jobs)
            arrivals = kept
        self.queue = [(a.at, i, a) for i, a in enumerate(arrivals)]
        heapq.heapify(self.queue)
        self.by_pk = {s.pk: s for s in self.sessions}

    def _arrivals(self, rng, index, spec, horizon):
        """On/off periods from ``spec.joins_at`` (starting on, with a burst at once for a late
        joiner: it arrives with work); while on, bursts at Poisson moments."""
        out = []
        if spec.initial_jobs:
            out.append(Arrival(spec.joins_at, index, [self.draw_job(rng) for _ in range(spec.initial_jobs)]))
        if spec.load <= 0:
            return out
        mean_job = sum(self.draw_job(random.Random(k))[1] for k in range(400)) / 400
        rate = spec.load / (self.mean_burst * mean_job)  # bursts per second while on
        t = spec.joins_at
        first = spec.joins_at > 0
        while t < horizon:
            end = min(t + rng.expovariate(1 / self.mean_on), horizon)
            self.on_periods.setdefault(index, []).append((t, end))
            s = t
            while True:
                if first:
                    first = False
                else:
                    s += rng.expovariate(rate)
                if s >= end:
                    break
                size = 1
                while rng.random() < 1 - 1 / self.mean_burst:  # geometric, mean ``mean_burst``
                    size += 1
                out.append(Arrival(s, index, [self.draw_job(rng) for _ in range(size)]))
            t = end + rng.expovariate(1 / self.mean_off)
        return out

    # -- the run ---------------------------------------------------------------------------------
    def run(self, traveller, *, device_seconds: float | None = None, until_drained: bool = False) -> None:
        """Play the events until ``device_seconds`` of device time were served, or every arrival
        was submitted and run (``until_drained``)."""
        running = None  # (state, job, seconds, ends at)
        while True:
            if device_seconds is not None and self.device_seconds >= device_seconds and running is None:
                return
            next_arrival = self.queue[0][0] if self.queue else math.inf
            if running is not None and running[3] <= next_arrival:
                state, job, seconds, ends = running
                self._move(traveller, ends)
                self._finish(state, job, seconds)
                running = None
            elif self.queue:
                _, _, arrival = heapq.heappop(self.queue)
                self._move(traveller, arrival.at)
                self._submit(arrival)
                if running is not None:
                    continue
            else:
                return  # nothing more arrives and nothing runs: drained
            if device_seconds is not None and self.device_seconds >= device_seconds:
                continue
            running = self._dispatch()

    def _move(self, traveller, at: float) -> None:
        self.clock = at
        traveller.move_to(START + timedelta(seconds=at))

    def _submit(self, arrival: Arrival) -> None:
        from apps.scheduling import services

        state = self.sessions[arrival.session]
        user = self.user_obj[state.user]
        jobs = []
        for shots, seconds in arrival.jobs:
            job = services.submit_job(user=user, session_id=state.pk, payload={}, shots=shots)
            job.pool = self.pool  # queue_info reads it: no query
            self.runtime_of[job.pk] = seconds
            self.session_of[job.pk] = state
            self.shots_of[job.pk] = shots
            jobs.append(job)
        state.pending += len(jobs)
        self._hook("submitted", arrival, jobs)

    def _dispatch(self):
        from apps.scheduling import passes

        self._hook("before_dispatch")
        job = passes.dispatch_once(self.pool.pk)
        if job is None:
            return None
        passes.submit_claimed(job)
        state = self.by_pk[job.session_id]
        state.pending -= 1
        state.running = True
        seconds = self.runtime_of[job.pk]
        self.dispatches += 1
        self.device_seconds += seconds
        self.longest = max(self.longest, seconds)
        self._hook("dispatched", state, job, seconds)
        return (state, job, seconds, self.clock + seconds)

    def _finish(self, state, job, seconds) -> None:
        from apps.scheduling import passes
        from apps.scheduling.drivers import DriverState

        passes._finish(job, DriverState("completed", runtime_seconds=seconds), expect_remote_id=job.remote_id)
        state.running = False
        self._hook("finished", state, job, seconds)

    def _hook(self, name, *args) -> None:
        hook = self.hooks.get(name)
        if hook is not None:
            hook(*args)

    # -- who is backlogged -----------------------------------------------------------------------
    def user_backlogged(self, name: str) -> bool:
        return any(s.backlogged for s in self.user_sessions[name])

    def backlogged_users(self) -> list[str]:
        return [name for name in self.user_sessions if self.user_backlogged(name)]


def fast_commits() -> None:
    """The simulation measures order, not speed: commits need not wait for the WAL flush (this
    connection only; a crash would lose the bench's own rows, which every run recreates)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit = off")


def jain(values) -> float:
    values = list(values)
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values)) if any(values) else 1.0
