"""The shared sub-minute loop: one per site (lease), every registered pass at its own period."""

from datetime import timedelta

import pytest

from apps.core import ticker
from apps.core.models import Lease
from apps.core.tasks import acquire_lease, run_ticker

pytestmark = pytest.mark.django_db


def test_only_one_loop_runs_across_clusters_until_its_lease_expires():
    assert acquire_lease("loop", "cluster-a", timedelta(seconds=30))
    assert not acquire_lease("loop", "cluster-b", timedelta(seconds=30))
    assert acquire_lease("loop", "cluster-a", timedelta(seconds=30))  # renewal
    Lease.objects.filter(name="loop").update(expires_at="2000-01-01T00:00:00Z")
    assert acquire_lease("loop", "cluster-b", timedelta(seconds=30))  # cluster-a died: taken over


def test_ticker_returns_at_once_when_another_cluster_holds_the_loop():
    assert acquire_lease("loop", "elsewhere", timedelta(seconds=30))
    assert run_ticker("loop", lambda: pytest.fail("ran"), interval=0, duration=0.05) == 0


def test_ticker_runs_steps_and_releases_its_lease():
    steps = []
    assert run_ticker("loop", lambda: steps.append(1), interval=0, duration=0.02) == len(steps) > 0
    assert not Lease.objects.exists()


def test_a_failing_step_does_not_end_the_loop():
    calls = []

    def step():
        calls.append(1)
        raise RuntimeError("boom")

    assert run_ticker("loop", step, interval=0, duration=0.02) == len(calls) > 1


def test_tick_runs_each_pass_at_its_own_period(monkeypatch):
    monkeypatch.setattr(ticker, "_REGISTRY", {})
    fast, slow = [], []
    ticker.register("fast", lambda: fast.append(1), every=lambda: 0)
    ticker.register("slow", lambda: slow.append(1), every=lambda: 3600)
    outcome = ticker.tick(duration=0.02)
    assert len(slow) == 1 and len(fast) > 1 and "slow: 1" in outcome


def test_tick_schedule_replaces_the_per_app_loops(db):
    from django_q.models import Schedule

    names = set(Schedule.objects.values_list("name", flat=True))
    assert "gridgate.tick" in names
    assert not names & {"gridgate.scheduling_tick", "gridgate.cases.ticker"}


def test_loop_holding_the_lease_runs_one_step_even_with_no_time_left(db):
    """Issue 16, item 10: the step count does not depend on how long the lease took to get."""
    steps = []
    assert run_ticker("loop", lambda: steps.append(1), interval=5, duration=0) == 1 == len(steps)


def test_each_host_runs_its_own_passes_while_another_host_holds_the_shared_loop(monkeypatch, settings):
    """Issue 17: work only one host can do (its local processes, its heartbeat) runs in every
    host's own loop, under a lease per host, whoever holds the shared loop."""
    monkeypatch.setattr(ticker, "_REGISTRY", {})
    shared, per_host = [], []
    ticker.register("shared", lambda: shared.append(1), every=lambda: 3600)
    ticker.register("mine", lambda: per_host.append(settings.GRIDGATE_WORKER_HOST), every=lambda: 3600, per_host=True)
    assert acquire_lease(ticker.TICK_LEASE, "host-c:1", timedelta(seconds=30))  # the shared loop is elsewhere
    for host in ("host-a", "host-b"):
        settings.GRIDGATE_WORKER_HOST = host
        assert ticker.tick(duration=0) == ticker.TAKEN
        assert ticker.host_tick(duration=0) == "mine: 1"
    assert per_host == ["host-a", "host-b"] and shared == []
    assert acquire_lease("gridgate.tick@host-a", "other-worker-on-a", timedelta(seconds=30))
    settings.GRIDGATE_WORKER_HOST = "host-a"
    assert ticker.host_tick(duration=0) == ticker.TAKEN  # a second worker on host-a waits its turn
