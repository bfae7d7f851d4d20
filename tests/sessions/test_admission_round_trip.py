"""Admission's common path on PostgreSQL (issue 15): the pool lock and the insert-if-it-fits
sent at once (``in_one_round_trip``). It must decide exactly as the locked path's
``_check_capacity`` at every boundary, leave nothing behind on an error, and hand everything
else (the same scheduler job, a refusal, R-SESS-3's expiry) to the locked path."""

from decimal import Decimal

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from apps.core.rows import in_one_round_trip
from apps.resources.models import ResourceClass, ResourcePool
from apps.sessions import services
from apps.sessions.models import Session
from apps.sessions.selectors import active_usage

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

# (pool limits, class resources, slots held by others with that class, slots requested)
BOUNDARIES = [
    ({"slots_total": 4}, {"cpu": 1, "memory": 1}, 3, 1),  # fills the pool exactly
    ({"slots_total": 4}, {"cpu": 1, "memory": 1}, 3, 2),  # one slot too many
    ({"slots_total": 4}, {"cpu": 1, "memory": 1}, 4, 1),  # full
    ({"slots_total": None}, {"cpu": 1, "memory": 1}, 50, 1000),  # no slot capacity
    ({"quota_cpu": Decimal("0.6"), "quota_memory": 10, "quota_gpu": 0}, {"cpu": Decimal("0.2"), "memory": 1}, 2, 1),
    ({"quota_cpu": Decimal("0.6"), "quota_memory": 10, "quota_gpu": 0}, {"cpu": Decimal("0.2"), "memory": 1}, 3, 1),
    ({"quota_cpu": Decimal("0.5"), "quota_memory": 10, "quota_gpu": 0}, {"cpu": Decimal("0.2"), "memory": 1}, 2, 1),
    ({"quota_cpu": 8, "quota_memory": 4, "quota_gpu": 0}, {"cpu": 1, "memory": 2}, 1, 1),  # memory exactly
    ({"quota_cpu": 8, "quota_memory": 3, "quota_gpu": 0}, {"cpu": 1, "memory": 2}, 1, 1),  # memory over
    ({"quota_cpu": 8, "quota_memory": 8, "quota_gpu": 2}, {"cpu": 1, "memory": 1, "gpu": 1}, 1, 1),  # gpu exactly
    ({"quota_cpu": 8, "quota_memory": 8, "quota_gpu": None}, {"cpu": 1, "memory": 1, "gpu": 1}, 0, 1),  # no gpu quota
    ({"quota_cpu": 8, "quota_memory": 8, "slots_total": 2}, {"cpu": 1, "memory": 1}, 2, 1),  # quota fits, slots do not
]


@pytest.mark.parametrize(("limits", "resources", "held", "slots"), BOUNDARIES)
def test_the_one_round_trip_admits_exactly_what_check_capacity_admits(owner, member, limits, resources, held, slots):
    pool = ResourcePool.objects.create(name="edge", public=True, **limits)
    klass = ResourceClass.objects.create(pool=pool, name="c", default=True, **resources)
    for _ in range(held):  # by the locked path, one slot each
        with transaction.atomic():
            session = services._new_session(member, klass, 1, "", timezone.now())
            session.save(force_insert=True)
    klass.pool = pool
    try:
        services._check_capacity(pool, klass, slots, active_usage([pool.pk])[pool.pk])
        fits = True
    except services.CapacityExceeded:
        fits = False
    try:
        admitted = services._admit_in_one_round_trip(owner, klass, slots, "", timezone.now()) is not None
    except services.CapacityExceeded:
        admitted = False
    assert admitted == fits
    assert Session.objects.filter(user=owner).count() == int(fits)  # a refusal stores nothing


def test_a_refusal_answers_with_its_reasons_without_the_locked_path(owner, monkeypatch):
    pool = ResourcePool.objects.create(name="small", public=True, slots_total=3)
    klass = ResourceClass.objects.create(pool=pool, name="q", cpu=1, memory=1, default=True)
    services.admit(user=owner, resource_class=klass, slots=2)
    monkeypatch.setattr(services, "_lock_class", _no_lock(services._lock_class))
    with pytest.raises(services.CapacityExceeded, match="1 of 3 slots available; 2 requested") as refused:
        services.admit(user=owner, resource_class=klass, slots=2)
    assert refused.value.extra["slots_available"] == 1
    assert Session.objects.filter(pool=pool).count() == 1


def test_a_refusal_with_a_session_past_its_deadline_expires_it_on_the_locked_path(owner, member):
    from datetime import timedelta

    pool = ResourcePool.objects.create(name="small", public=True, slots_total=3)
    klass = ResourceClass.objects.create(pool=pool, name="q", cpu=1, memory=1, default=True)
    due = services.admit(user=member, resource_class=klass, slots=2).session
    Session.objects.filter(pk=due.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert services.admit(user=owner, resource_class=klass, slots=2).created
    due.refresh_from_db()
    assert due.status == "revoked"


def _no_lock(real):
    """``_lock_class`` that fails if asked for the lock (the locked path)."""

    def lock_class(*args, lock=True, **kwargs):
        assert not lock, "the locked path was taken"
        return real(*args, lock=lock, **kwargs)

    return lock_class


def test_the_same_scheduler_job_is_left_to_the_locked_path(local_pool, owner):
    klass = local_pool.classes.get()
    first = services.admit(user=owner, resource_class=klass, external_id="77")
    assert services._admit_in_one_round_trip(owner, klass, 1, "77", timezone.now()) is None
    again = services.admit(user=owner, resource_class=klass, external_id="77")
    assert (again.created, again.session.pk) == (False, first.session.pk)


@pytest.mark.django_db(transaction=True)
def test_a_failing_statement_rolls_the_whole_round_trip_back_and_raises_as_django_does(local_pool, owner):
    """Outside any transaction: BEGIN … COMMIT; the first statement's insert is undone."""
    klass = local_pool.classes.get()
    stored = services.admit(user=owner, resource_class=klass, external_id="1").session
    table = Session._meta.db_table
    copy = f"INSERT INTO {table} SELECT * FROM {table} WHERE id = %s"  # noqa: S608
    renamed = f"UPDATE {table} SET external_id = 'renamed' WHERE id = %s"  # noqa: S608
    with pytest.raises(IntegrityError):
        in_one_round_trip([(renamed, [stored.pk]), (copy, [stored.pk])])
    assert not connection.in_atomic_block
    stored.refresh_from_db()
    assert stored.external_id == "1"
    assert in_one_round_trip([(f"SELECT external_id FROM {table} WHERE id = %s", [stored.pk])]) == [[("1",)]]  # noqa: S608


def test_inside_a_transaction_a_failure_undoes_only_its_own_statements(local_pool, owner):
    klass = local_pool.classes.get()
    stored = services.admit(user=owner, resource_class=klass, external_id="1").session
    table = Session._meta.db_table
    with transaction.atomic():
        in_one_round_trip([(f"UPDATE {table} SET slots = 5 WHERE id = %s", [stored.pk])])  # noqa: S608
        with pytest.raises(IntegrityError):
            in_one_round_trip(
                [
                    (f"UPDATE {table} SET slots = 9 WHERE id = %s", [stored.pk]),  # noqa: S608
                    (f"INSERT INTO {table} SELECT * FROM {table} WHERE id = %s", [stored.pk]),  # noqa: S608
                ]
            )
        stored.refresh_from_db()  # the transaction is still usable, with the first round trip's work
        assert stored.slots == 5


@pytest.mark.django_db(transaction=True)
def test_an_interruption_between_statements_leaves_no_transaction_open(local_pool, owner, monkeypatch):
    """A worker timeout or any exception after BEGIN was queued: the pipeline still sends what
    was queued, so the transaction is rolled back rather than left open for the next request."""
    from psycopg.pq import TransactionStatus

    table = Session._meta.db_table
    stored = services.admit(user=owner, resource_class=local_pool.classes.get(), external_id="1").session
    calls = []
    real = type(connection.cursor()).execute

    def interrupted(self, sql, params=None):
        calls.append(sql)
        if len(calls) == 3:  # BEGIN, the UPDATE, then this
            raise RuntimeError("worker timeout")
        return real(self, sql, params)

    monkeypatch.setattr(type(connection.cursor()), "execute", interrupted)
    with pytest.raises(RuntimeError):
        in_one_round_trip(
            [
                (f"UPDATE {table} SET external_id = 'renamed' WHERE id = %s", [stored.pk]),  # noqa: S608
                (f"SELECT 1 FROM {table}", []),  # noqa: S608
            ]
        )
    monkeypatch.undo()
    assert connection.connection is None or connection.connection.info.transaction_status == TransactionStatus.IDLE
    stored.refresh_from_db()
    assert stored.external_id == "1"
