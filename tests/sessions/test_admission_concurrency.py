"""R-SESS-1/2 under real concurrency: PostgreSQL, one connection per thread."""

import random
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection
from django.db.models import Sum

from apps.resources.models import PoolUsage, ResourceClass, ResourcePool
from apps.sessions import services
from apps.sessions.models import Session
from tests.concurrency import meet

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def qpu(db):
    pool = ResourcePool.objects.create(name="qpu", kind="local", slots_total=10)
    ResourceClass.objects.create(pool=pool, name="access", cpu=1, memory=1, default=True)
    return pool


def test_concurrent_admission_never_oversubscribes_and_admits_what_fits(qpu, owner):
    klass = qpu.classes.get()
    rng = random.Random(7)
    requests = [rng.randint(1, 4) for _ in range(64)]
    barrier = threading.Barrier(32)

    def attempt(slots):
        meet(barrier)  # release the threads together to maximise contention
        try:
            services.admit(user=owner, resource_class=klass, slots=slots)
            return ("admitted", slots, None)
        except services.CapacityExceeded as exc:
            return ("full", slots, exc.extra["slots_available"])
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=32) as executor:
        outcomes = list(executor.map(attempt, requests))

    used = Session.objects.active().filter(pool=qpu).aggregate(n=Sum("slots"))["n"]
    admitted = sum(slots for kind, slots, _ in outcomes if kind == "admitted")
    assert used == admitted <= qpu.slots_total
    # Every refusal saw, at its turn, fewer slots than it asked for: nothing that fitted was lost.
    assert all(available < slots for kind, slots, available in outcomes if kind == "full")
    # And the pool ends full up to the smallest refused request.
    smallest_refused = min((slots for kind, slots, _ in outcomes if kind == "full"), default=None)
    if smallest_refused is not None:
        assert qpu.slots_total - used < smallest_refused


def test_concurrent_identical_requests_yield_exactly_one_session(qpu, owner):
    klass = qpu.classes.get()

    def attempt(_):
        try:
            return str(services.admit(user=owner, resource_class=klass, slots=2, external_id="1234").session.id)
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=32) as executor:
        ids = set(executor.map(attempt, range(48)))

    assert len(ids) == 1
    assert Session.objects.filter(external_id="1234").count() == 1
    with pytest.raises(services.SessionConflict):
        services.admit(user=owner, resource_class=klass, slots=3, external_id="1234")


def test_r_sess_2_concurrent_same_external_id_on_two_pools_yields_one_session_on_each(qpu, owner):
    """R-SESS-2 is per pool: one batch job may hold a session on each of several pools (Slurm's
    --qpu=fresnel,emu), and concurrent identical requests still make one per pool."""
    other = ResourcePool.objects.create(name="qpu2", kind="local", slots_total=10)
    other_class = ResourceClass.objects.create(pool=other, name="access", cpu=1, memory=1, default=True)
    klass = qpu.classes.get()

    def attempt(i):
        target = klass if i % 2 else other_class
        try:
            return ("ok", str(services.admit(user=owner, resource_class=target, slots=1, external_id="77").session.id))
        except services.SessionConflict:
            return ("conflict", None)
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=16) as executor:
        outcomes = list(executor.map(attempt, range(32)))

    active = Session.objects.active().filter(external_id="77")
    assert sorted(active.values_list("pool__name", flat=True)) == ["qpu", "qpu2"]
    assert {sid for kind, sid in outcomes if kind == "ok"} == {str(session.pk) for session in active}
    assert all(kind == "ok" for kind, _ in outcomes)


def test_release_waits_for_a_briefly_locked_session_instead_of_skipping_it(qpu, owner):
    """R-SESS-4: a release racing a job submission (which locks the session row) still releases."""
    from django.db import transaction

    session = services.admit(user=owner, resource_class=qpu.classes.get(), slots=3).session
    locked, done = threading.Event(), threading.Event()

    def hold_lock():
        try:
            with transaction.atomic():
                Session.objects.select_for_update().get(pk=session.pk)
                locked.set()
                done.wait(timeout=0.5)  # holds the row while the release arrives
        finally:
            connection.close()

    holder = threading.Thread(target=hold_lock)
    holder.start()
    locked.wait(timeout=10)
    try:
        assert services.release(user=session.user, session_id=session.pk).ended is True
    finally:
        done.set()
        holder.join()
        connection.close()
    assert Session.objects.get(pk=session.pk).status == "revoked"


def test_concurrent_admissions_and_releases_keep_the_pools_usage_equal_to_its_sessions(owner):
    """R-SESS-1 with the usage counters: admissions and releases racing on one quota pool never
    pass its limits, and the counters end equal to what the active sessions hold."""
    from decimal import Decimal

    from apps.sessions import statements

    pool = ResourcePool.objects.create(
        name="quota", kind="local", slots_total=12, quota_cpu=Decimal("6"), quota_memory=100, quota_gpu=4
    )
    small = ResourceClass.objects.create(pool=pool, name="small", cpu=Decimal("0.5"), memory=1, default=True)
    large = ResourceClass.objects.create(pool=pool, name="large", cpu=Decimal("1.5"), memory=2, gpu=1)
    rng = random.Random(11)
    plans = [[(rng.choice([small, large]), rng.randint(1, 3), rng.random() < 0.6) for _ in range(8)] for _ in range(32)]
    barrier = threading.Barrier(32)
    done = threading.Event()
    seen = []

    def client(plan):
        meet(barrier)
        try:
            for klass, slots, release in plan:
                try:
                    session = services.admit(user=owner, resource_class=klass, slots=slots).session
                except services.CapacityExceeded:
                    continue
                if release:
                    services.release(user=owner, session_id=session.pk)
        finally:
            connection.close()

    def watch():
        try:
            while not done.is_set():
                held = PoolUsage.objects.values_list("slots_used", "cpu_used", "memory_used", "gpu_used").get(pool=pool)
                seen.append(held)
        finally:
            connection.close()

    watcher = threading.Thread(target=watch)
    watcher.start()
    with ThreadPoolExecutor(max_workers=32) as executor:
        list(executor.map(client, plans))
    done.set()
    watcher.join()

    assert seen and all(s <= 12 and c <= 6 and m <= 100 and g <= 4 for s, c, m, g in seen)
    assert statements.drifted_pools() == []
    usage = PoolUsage.objects.get(pool=pool)
    active = Session.objects.active().filter(pool=pool)
    assert usage.slots_used == (active.aggregate(n=Sum("slots"))["n"] or 0)
    assert usage.cpu_used == (active.aggregate(n=Sum("cpu"))["n"] or 0)
