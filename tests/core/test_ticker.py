"""The tick loop: one ticker process per cluster, one holder per site through a short lease renewed
every second, taken over within seconds of the holder's death, no gap each minute."""

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from apps.core import ticker
from apps.core.leases import acquire_lease
from apps.core.models import Lease, WorkerHeartbeat

pytestmark = pytest.mark.django_db


def wait_until(predicate, seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


@pytest.fixture
def passes(monkeypatch):
    """A registry of test passes only (the apps' real passes are tested where they live)."""
    monkeypatch.setattr(ticker, "_REGISTRY", {})
    return ticker


def test_only_one_loop_runs_across_clusters_until_its_lease_expires():
    assert acquire_lease("loop", "cluster-a", timedelta(seconds=30))
    assert not acquire_lease("loop", "cluster-b", timedelta(seconds=30))
    assert acquire_lease("loop", "cluster-a", timedelta(seconds=30))  # renewal
    Lease.objects.filter(name="loop").update(expires_at="2000-01-01T00:00:00Z")
    assert acquire_lease("loop", "cluster-b", timedelta(seconds=30))  # cluster-a died: taken over


def test_run_due_runs_each_pass_at_its_own_period(passes):
    fast, slow = [], []
    passes.register("fast", lambda: fast.append(1), every=lambda: 0)
    passes.register("slow", lambda: slow.append(1), every=lambda: 3600)
    t = ticker.Ticker("me")
    assert t.run_due() == ["fast", "slow"]
    assert t.run_due() == ["fast"]
    assert (len(fast), len(slow)) == (2, 1)


def test_a_failing_pass_does_not_stop_the_others(passes):
    ran = []

    def boom():
        raise RuntimeError("boom")

    passes.register("boom", boom, every=lambda: 0)
    passes.register("after", lambda: ran.append(1), every=lambda: 0)
    assert ticker.Ticker("me").run_due() == ["boom", "after"] and ran == [1]


def test_keep_takes_the_lease_only_when_free_and_beats_the_heartbeat(settings):
    settings.GRIDGATE_WORKER_HOST = "host-a"
    a, b = ticker.Ticker("a"), ticker.Ticker("b")
    assert a.keep() and not b.keep()
    assert WorkerHeartbeat.objects.filter(name="host-a").exists()  # both beat, holder or not
    assert a.keep() and not b.keep()
    Lease.objects.filter(name=ticker.TICK_LEASE).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert b.keep() and not a.keep()  # a stopped renewing (dead): b took over


def test_a_stuck_step_gives_the_loop_up(monkeypatch):
    a, b = ticker.Ticker("a"), ticker.Ticker("b")
    assert a.keep()
    a.step_started = time.monotonic() - ticker.STALL_SECONDS - 1  # a pass hung past the limit
    assert not a.keep() and b.keep()


def test_the_lease_counts_as_held_only_within_its_length_since_the_last_renewal(settings, monkeypatch):
    """A keeper hung in a database call (no error, no renewal) must not leave ``holding`` true: the
    lease expires in the database and another cluster may take it."""
    settings.GRIDGATE_TICK_LEASE_SECONDS = 5
    now = [100.0]
    monkeypatch.setattr(ticker, "clock", lambda: now[0])
    t = ticker.Ticker("a")
    assert t.keep() and t.holding
    now[0] += 4.9  # the keeper is stuck: nothing renews
    assert t.holding
    now[0] += 0.1
    assert not t.holding
    assert t.keep() and t.holding  # renewed again


def test_a_renewal_that_hung_then_succeeded_restarts_the_database_contact_clock(monkeypatch):
    """Dropped packets make the renewal hang without an error, then succeed; that outage must count
    like one that raised, or recovery would judge every live emulation (whose heartbeats could not
    be written meanwhile) dead at once."""
    now = [1000.0]
    monkeypatch.setattr(ticker, "clock", lambda: now[0])
    t = ticker.Ticker("a")
    monkeypatch.setattr(ticker, "_running", t)
    assert t.keep()
    for _ in range(40):  # the keeper's cadence: a renewal every second
        now[0] += 1
        assert t.keep()
    assert ticker.database_contact_seconds() == 40
    real = acquire_lease

    def hangs(*args, **kwargs):
        now[0] += 120  # two minutes without an answer, then it goes through
        return real(*args, **kwargs)

    monkeypatch.setattr(ticker, "acquire_lease", hangs)
    t.keep()  # succeeded, but two minutes late (and so not counted as holding the lease either)
    assert ticker.database_contact_seconds() == 0


def test_a_lease_expiring_in_the_middle_of_a_step_stops_its_remaining_shared_passes(passes, settings, monkeypatch):
    settings.GRIDGATE_TICK_LEASE_SECONDS = 5
    now = [100.0]
    monkeypatch.setattr(ticker, "clock", lambda: now[0])
    t = ticker.Ticker("a")
    assert t.keep()

    def slow():
        now[0] += 6  # outlasts the lease while the keeper is hung

    passes.register("slow", slow, every=lambda: 0)
    passes.register("shared", lambda: None, every=lambda: 0)
    passes.register("mine", lambda: None, every=lambda: 0, per_host=True)
    assert t.run_due(shared=lambda: t.holding) == ["slow", "mine"]


def run_in_thread(t: ticker.Ticker):
    stop = threading.Event()

    def target():
        try:
            t.run(stop)
        finally:
            connection.close()

    thread = threading.Thread(target=target, name=t.owner, daemon=True)
    thread.start()
    return stop, thread


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_second_ticker_takes_the_loop_over_within_the_lease_after_the_holder_dies(passes, settings, monkeypatch):
    """Two tickers (two clusters): one runs the passes; the other takes over once the holder
    stops renewing (killed: no release), bounded by polling, not timed."""
    settings.GRIDGATE_TICK_LEASE_SECONDS = 2
    monkeypatch.setattr(ticker, "KEEPER_SECONDS", 0.2)
    runs: list[str] = []
    passes.register("pass", lambda: runs.append(threading.current_thread().name), every=lambda: 0.05)
    a, b = ticker.Ticker("a"), ticker.Ticker("b")
    stop_a, thread_a = run_in_thread(a)
    assert wait_until(lambda: "a" in runs)
    stop_b, thread_b = run_in_thread(b)
    try:
        assert wait_until(lambda: runs.count("a") > 20)
        assert "b" not in runs  # one loop at a time
        # Kill a: its threads stop without releasing the lease (as SIGKILL would).
        monkeypatch.setattr(ticker, "release_lease", lambda *args: None)
        stop_a.set()
        thread_a.join(timeout=30)
        assert wait_until(lambda: "b" in runs), "nobody took the loop over"
        lease = Lease.objects.get(name=ticker.TICK_LEASE)
        assert lease.owner == "b"
    finally:
        stop_a.set()
        stop_b.set()
        thread_a.join(timeout=30)
        thread_b.join(timeout=30)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_stopped_ticker_releases_the_loop_at_once(passes):
    passes.register("pass", lambda: None, every=lambda: 1)
    t = ticker.Ticker("a")
    stop, thread = run_in_thread(t)
    assert wait_until(lambda: Lease.objects.filter(name=ticker.TICK_LEASE, owner="a").exists())
    stop.set()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert not Lease.objects.filter(name=ticker.TICK_LEASE).exists()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_lease_stays_held_while_one_step_runs_longer_than_the_lease(passes, settings, monkeypatch):
    """The keeper thread renews the lease whatever the passes do: a step blocked past
    GRIDGATE_TICK_LEASE_SECONDS (a slow provider call) keeps the loop, and another cluster's
    ticker cannot take it meanwhile (renewing between steps, in the main loop, would fail this)."""
    settings.GRIDGATE_TICK_LEASE_SECONDS = 2
    monkeypatch.setattr(ticker, "KEEPER_SECONDS", 0.2)
    seen = {}
    a = ticker.Ticker("a")

    def long_pass():
        if "other" in seen:
            return
        first_expiry = Lease.objects.get(name=ticker.TICK_LEASE).expires_at
        deadline = timezone.now() + timedelta(seconds=30)
        while timezone.now() <= first_expiry + timedelta(seconds=1) and timezone.now() < deadline:
            threading.Event().wait(0.1)
        seen["other"] = ticker.Ticker("b").keep()  # another cluster, past the first lease's expiry
        seen["holding"] = a.holding

    passes.register("long", long_pass, every=lambda: 0.05)
    stop, thread = run_in_thread(a)
    try:
        assert wait_until(lambda: "other" in seen)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert seen == {"other": False, "holding": True}


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_ticker_whose_keeper_hangs_stops_its_shared_passes_when_the_lease_expires(passes, settings, monkeypatch):
    """The keeper hangs in a database call (no error): the main thread goes on stepping, but runs
    the shared passes only within the lease since the last renewal; the per-host ones go on."""
    settings.GRIDGATE_TICK_LEASE_SECONDS = 2
    monkeypatch.setattr(ticker, "KEEPER_SECONDS", 0.2)
    unhang = threading.Event()
    real_acquire = ticker.acquire_lease
    renewals = []

    def hanging_acquire(*args):
        renewals.append(1)
        if len(renewals) > 1:
            unhang.wait(60)  # the keeper's second renewal never returns (until the test ends)
        return real_acquire(*args)

    monkeypatch.setattr(ticker, "acquire_lease", hanging_acquire)
    shared, mine = [], []
    passes.register("shared", lambda: shared.append(1), every=lambda: 0.05)
    passes.register("mine", lambda: mine.append(1), every=lambda: 0.05, per_host=True)
    t = ticker.Ticker("a")
    stop, thread = run_in_thread(t)
    try:
        assert wait_until(lambda: shared and not t.holding)
        # A step that found the lease held just before it expired may still run one shared pass.
        after_expiry = len(shared) + 1
        steps = len(mine)
        assert wait_until(lambda: len(mine) >= steps + 5)  # the loop goes on stepping
        assert len(shared) <= after_expiry
    finally:
        unhang.set()
        stop.set()
        thread.join(timeout=30)


def test_no_minutely_tick_schedule_beside_the_ticker_processes(db):
    """No double loops: the minutely gridgate.tick schedule is gone (core migration 0008)."""
    from django_q.models import Schedule

    names = set(Schedule.objects.values_list("name", flat=True))
    assert not names & {"gridgate.tick", "gridgate.heartbeat", "gridgate.scheduling_tick", "gridgate.cases.ticker"}


@pytest.mark.django_db(transaction=True)
def test_reversing_the_ticker_migration_recreates_no_schedule_for_the_removed_tick_task():
    """Core migration 0008's reverse must not schedule ``apps.core.tasks.tick``: that task is
    gone, and the schedule would fail every minute."""
    from django.db.migrations.executor import MigrationExecutor
    from django_q.models import Schedule

    executor = MigrationExecutor(connection)
    executor.migrate([("core", "0007_idempotencykey_locked_until")])
    try:
        assert not Schedule.objects.filter(func__startswith="apps.core.tasks.tick").exists()
        assert not Schedule.objects.filter(name="gridgate.tick").exists()
    finally:
        executor.loader.build_graph()
        executor.migrate([("core", "0008_ticker_process")])


def test_each_host_runs_its_own_passes_while_another_host_holds_the_shared_loop(passes, settings):
    """Work only one host can do (its local processes) runs in every host's ticker, whoever holds
    the shared loop; the shared passes only in the holder's."""
    shared, per_host = [], []
    passes.register("shared", lambda: shared.append(1), every=lambda: 0)
    passes.register("mine", lambda: per_host.append(settings.GRIDGATE_WORKER_HOST), every=lambda: 0, per_host=True)
    assert acquire_lease(ticker.TICK_LEASE, "host-c:1", timedelta(seconds=30))  # the shared loop is elsewhere
    for host in ("host-a", "host-b"):
        settings.GRIDGATE_WORKER_HOST = host
        t = ticker.Ticker(f"{host}:1")
        assert not t.keep()  # not the holder
        assert t.run_due(shared=t.holding) == ["mine"]
    assert per_host == ["host-a", "host-b"] and shared == []
    holder = ticker.Ticker("host-c:1")
    assert holder.keep()
    assert holder.run_due(shared=holder.holding) == ["shared", "mine"]


def test_worker_runs_the_cluster_and_the_ticker_side_by_side(monkeypatch):
    from django.core.management import call_command

    from apps.core.management.commands import worker

    started = []
    monkeypatch.setattr(worker, "supervise", lambda *commands, grace, **kept: started.append((commands, kept)) or 0)
    with pytest.raises(SystemExit):
        call_command("worker", grace=3)
    ((commands, kept),) = started
    assert [c[-1] for c in commands] == ["qcluster", "ticker"]
    assert len(kept["keep_fds"]) == 1 and kept["stop_when"]() == ""  # the host's lock and lease (test_worker_host.py)


def test_recovery_and_sweep_are_registered_with_the_tick_loop(db):
    from apps.scheduling.drivers import emulator

    registered = ticker.registered()
    assert registered["scheduling.emulator_recovery"].func is emulator.recover_runs
    assert "scheduling.sweep" in registered
