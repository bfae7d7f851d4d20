"""``apps.core.leases``: claims with skip-locked, renewal as a compare-and-set on the owner, and
the one heart-beat thread every worker pass, the ticker and the worker host use. The rows are
``core.Lease`` rows leased through their ``owner`` and ``expires_at`` columns (the passes' own
``lease_owner``/``lease_until`` are proven through the passes, in tests/cases and
tests/scheduling). Waits are bounded polls, never timing assertions."""

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from apps.core import leases
from apps.core.models import Lease

COLUMNS = {"owner_field": "owner", "until_field": "expires_at"}
LEASE = timedelta(seconds=30)


def wait_until(predicate, seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def rows(count: int, *, expired: bool = True) -> list[str]:
    """``count`` rows no live lease holds (an owner whose lease expired), or held by "x" for a while."""
    until = timezone.now() + (-timedelta(seconds=1) if expired else LEASE)
    names = [f"row-{i:03}" for i in range(count)]
    Lease.objects.bulk_create([Lease(name=name, owner="x", expires_at=until) for name in names])
    return names


def claim(owner: str, *, now=None, batch: int = 100) -> list[str]:
    return leases.claim(
        Lease.objects.order_by("name"), owner=owner, now=now or timezone.now(), lease=LEASE, batch=batch, **COLUMNS
    )


def owners() -> dict[str, str]:
    return dict(Lease.objects.values_list("name", "owner"))


# -- claim and renew ------------------------------------------------------------------------------
@pytest.mark.django_db
def test_a_claim_takes_only_rows_no_live_lease_holds_up_to_its_batch_in_order():
    free = rows(3)
    Lease.objects.create(name="row-live", owner="x", expires_at=timezone.now() + LEASE)
    now = timezone.now()
    assert claim("a", now=now, batch=2) == free[:2]
    assert claim("b", now=now) == free[2:]  # the live lease and a's fresh ones are left alone
    assert owners() == {free[0]: "a", free[1]: "a", free[2]: "b", "row-live": "x"}
    assert set(Lease.objects.filter(owner__in=["a", "b"]).values_list("expires_at", flat=True)) == {now + LEASE}


@pytest.mark.django_db
def test_a_second_owner_can_neither_renew_nor_steal_a_live_lease():
    (name,) = rows(1)
    assert claim("a") == [name]
    before = Lease.objects.get(name=name).expires_at
    assert leases.renew(Lease.objects.all(), owner="b", until=before + LEASE, **COLUMNS) == 0
    assert claim("b") == []
    assert Lease.objects.get(name=name).owner == "a" and Lease.objects.get(name=name).expires_at == before
    assert leases.renew(Lease.objects.all(), owner="a", until=before + LEASE, **COLUMNS) == 1  # its holder may


@pytest.mark.django_db
def test_an_expired_lease_is_claimed_by_another_owner_and_its_old_holder_can_no_longer_renew_it():
    (name,) = rows(1)
    now = timezone.now()
    assert claim("a", now=now) == [name]
    later = now + LEASE + timedelta(seconds=1)  # a died (or stalled) past its lease
    assert claim("b", now=later) == [name]
    assert leases.renew(Lease.objects.all(), owner="a", until=later + LEASE, **COLUMNS) == 0  # a woke up: lost
    assert owners() == {name: "b"}


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_claims_never_share_a_row():
    names = rows(60)
    start = threading.Barrier(12)

    def worker(i):
        try:
            start.wait(timeout=30)
            return claim(f"worker-{i}", batch=4)
        finally:
            connection.close()  # each thread has its own connection

    with ThreadPoolExecutor(max_workers=12) as pool:
        results = dict(enumerate(pool.map(worker, range(12))))
    claimed = [name for got in results.values() for name in got]
    assert len(results) == 12 and len(claimed) == len(set(claimed)) == 48  # each took a batch, none twice
    held = owners()
    assert all(held[name] == f"worker-{i}" for i, got in results.items() for name in got)
    assert sorted(set(names) - set(claimed)) == sorted(name for name, owner in held.items() if owner == "x")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_claim_skips_the_rows_another_claim_is_taking_instead_of_waiting_for_them():
    rows(4)
    a_claimed, a_holds, release = [], threading.Event(), threading.Event()

    def worker_a():
        try:
            with transaction.atomic():  # A's claim stays uncommitted, its rows locked, until released
                a_claimed.extend(claim("a", batch=2))
                a_holds.set()
                release.wait(timeout=60)
        finally:
            connection.close()

    a = threading.Thread(target=worker_a)
    a.start()
    try:
        assert a_holds.wait(timeout=30)
        b_claimed = claim("b")  # in this thread, while A holds its rows: must not block
    finally:
        release.set()
        a.join(timeout=60)
    assert len(a_claimed) == 2 and len(b_claimed) == 2 and set(a_claimed).isdisjoint(b_claimed)


# -- the heart-beat ---------------------------------------------------------------------------------
@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_heartbeat_renews_the_claim_while_the_body_runs_and_stops_with_it():
    (name,) = rows(1)
    short = timedelta(seconds=0.4)  # renewed every 0.1 s
    assert leases.claim(Lease.objects.all(), owner="a", now=timezone.now(), lease=short, batch=1, **COLUMNS) == [name]
    first = Lease.objects.get(name=name).expires_at
    with leases.kept(Lease.objects.filter(name=name), owner="a", lease=lambda: short, name="test-beat", **COLUMNS):
        # The body outlasts the lease it claimed with: the heart-beat keeps it.
        assert wait_until(lambda: Lease.objects.get(name=name).expires_at > first + short)
        assert claim("b", now=first + timedelta(seconds=0.1)) == []
        assert any(thread.name == "test-beat" for thread in threading.enumerate())
    assert not any(thread.name == "test-beat" for thread in threading.enumerate())  # stopped and joined


@pytest.mark.django_db
def test_a_heartbeat_beats_only_while_its_body_runs():
    beats = []
    with leases.Heartbeat(lambda: beats.append(1), every=0.01, name="counting") as heartbeat:
        assert wait_until(lambda: len(beats) >= 3)
    after = len(beats)
    assert not heartbeat.beating and len(beats) == after  # joined: no beat can follow


@pytest.mark.django_db
def test_a_failed_renewal_is_reported_and_the_heartbeat_goes_on(caplog):
    calls = []

    def beat():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the database is away")

    caplog.set_level(logging.WARNING, logger="apps.core.leases")
    with leases.Heartbeat(beat, every=0.01, name="flaky", what="renewing the claims of a"):
        assert wait_until(lambda: len(calls) >= 2)  # the next beat came all the same
    (record,) = [r for r in caplog.records if r.name == "apps.core.leases"]
    assert record.getMessage() == "renewing the claims of a failed"
    assert str(record.exc_info[1]) == "the database is away"


@pytest.mark.django_db
def test_a_heartbeat_whose_lease_is_lost_ends_by_itself_and_one_answering_false_goes_on():
    answers = []

    def not_holding():  # the ticker's keep(): False while another cluster holds the loop
        answers.append(False)
        return False

    with leases.Heartbeat(not_holding, every=0.01, name="waiting"):
        assert wait_until(lambda: len(answers) >= 3)
    calls = []

    def lost():
        calls.append(1)
        raise leases.Lost("taken over")

    heartbeat = leases.Heartbeat(lost, every=0.01, name="lost").start()
    try:
        assert wait_until(lambda: not heartbeat.beating) and calls == [1]
    finally:
        heartbeat.stop()


@pytest.mark.django_db
def test_a_heartbeat_beats_at_once_when_asked_and_ends_with_the_callers_stop_signal():
    stop, beats = threading.Event(), []
    heartbeat = leases.Heartbeat(lambda: beats.append(1), every=3600, name="keeper", immediately=True, stop=stop)
    with heartbeat:
        assert wait_until(lambda: beats == [1])  # the first beat does not wait the hour
        stop.set()  # the caller stops (SIGTERM) while its body is still finishing
        assert wait_until(lambda: not heartbeat.beating)


# -- named leases -----------------------------------------------------------------------------------
@pytest.mark.django_db
def test_a_named_lease_is_released_only_by_its_holder():
    assert leases.acquire_lease("loop", "a", LEASE)
    leases.release_lease("loop", "b")
    assert not leases.acquire_lease("loop", "b", LEASE)
    leases.release_lease("loop", "a")
    assert leases.acquire_lease("loop", "b", LEASE)  # handed over at once, no expiry to wait out
