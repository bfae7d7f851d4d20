"""Admission's and revocation's hand-written statements (apps/sessions/statements.py), tested
directly and through the service: the class lookup with its access check, the insert-if-it-fits
and the pool's usage counters it keeps, the refusal's reasons, the revocation that gives back
what the sessions held, and the recount that repairs a drift. SQLite and PostgreSQL alike."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from apps.resources.models import PoolUsage, ResourceClass, ResourcePool
from apps.sessions import services, statements
from apps.sessions.hooks import sessions_revoked
from apps.sessions.models import Session, SessionStatus

pytestmark = pytest.mark.django_db


def usage(pool) -> tuple:
    row = PoolUsage.objects.get(pool=pool)
    return row.slots_used, row.cpu_used, row.memory_used, row.gpu_used


@pytest.fixture
def quota_pool():
    pool = ResourcePool.objects.create(
        name="quota", public=True, quota_cpu=Decimal("10"), quota_memory=100, quota_gpu=10, slots_total=10
    )
    ResourceClass.objects.create(pool=pool, name="q", cpu=Decimal("1.5"), memory=2, gpu=1, default=True)
    return pool


def test_usable_class_by_id_admits_on_a_granted_pool_and_refuses_one_the_user_may_not_use(private_pool, member, owner):
    klass = private_pool.classes.get()
    admission = services.admit(user=member, resource_class=services.UsableClass(pk=klass.pk))
    assert admission.created and admission.session.resource_class_id == klass.pk
    with pytest.raises(services.NoSuchClass):  # owner is in no group of the private pool
        services.admit(user=owner, resource_class=services.UsableClass(pk=klass.pk))
    with pytest.raises(services.NoSuchClass):
        services.admit(user=member, resource_class=services.UsableClass(pk=klass.pk + 1000))


def test_usable_class_by_pool_name_is_that_pools_default_class(local_pool, owner):
    ResourceClass.objects.create(pool=local_pool, name="big", cpu=8, memory=16)
    session = services.admit(user=owner, resource_class=services.UsableClass(pool_name="local")).session
    assert session.resource_class.name == "small" and session.pool_id == local_pool.pk
    with pytest.raises(services.NoSuchClass):
        services.admit(user=owner, resource_class=services.UsableClass(pool_name="nowhere"))


def test_staff_may_admit_on_any_pool_through_a_usable_class(private_pool, staff):
    klass = private_pool.classes.get()
    assert services.admit(user=staff, resource_class=services.UsableClass(pk=klass.pk)).created


def test_admitted_session_is_stored_as_save_would_store_it_with_its_class_and_pool(owner):
    """The instances built from the lookup's row are the stored ones (JSON decoded, decimals and
    datetimes converted), and the hand-written INSERT stores every column as save() would."""
    pool = ResourcePool.objects.create(
        name="slurm", kind="slurm", public=True, idle_timeout=120, remote={"partition": "debug"}
    )
    klass = ResourceClass.objects.create(
        pool=pool, name="half", cpu=Decimal("0.5"), memory=3, default=True, remote={"partition": "short"}
    )
    session = services.admit(user=owner, resource_class=services.UsableClass(pk=klass.pk)).session
    assert session.pool.remote == {"partition": "debug"} and session.resource_class.remote == {"partition": "short"}
    assert session.resource_class.cpu == Decimal("0.5") and isinstance(session.resource_class.cpu, Decimal)
    assert session.pool.created_at == pool.created_at
    assert (session.idle_expires_at - session.created_at).total_seconds() == 120
    assert session.launch_spec == services.launch_spec(klass)
    assert (session.cpu, session.memory, session.gpu) == (Decimal("0.5"), 3, 0)
    stored = Session.objects.get(pk=session.pk)
    for field in Session._meta.concrete_fields:
        assert getattr(stored, field.attname) == getattr(session, field.attname), field.name


def test_same_scheduler_job_returns_its_session_and_a_different_one_is_refused(local_pool, owner):
    """R-SESS-2."""
    first = services.admit(user=owner, resource_class=services.UsableClass(pool_name="local"), external_id="77")
    again = services.admit(user=owner, resource_class=services.UsableClass(pool_name="local"), external_id="77")
    assert first.created and not again.created and again.session.pk == first.session.pk
    with pytest.raises(services.SessionConflict):
        services.admit(user=owner, resource_class=services.UsableClass(pool_name="local"), slots=2, external_id="77")
    assert usage(local_pool)[0] == 1  # the repeat counted nothing


def test_the_pool_counts_what_its_active_sessions_hold_and_gets_it_back_when_they_end(quota_pool, owner):
    klass = quota_pool.classes.get()
    services.admit(user=owner, resource_class=klass, slots=2)
    services.admit(user=owner, resource_class=klass, slots=3)
    ended = services.admit(user=owner, resource_class=klass, slots=4).session
    assert usage(quota_pool) == (9, Decimal("4.5"), 6, 3)
    services.release(user=owner, session_id=ended.pk)
    assert usage(quota_pool) == (5, Decimal("3.0"), 4, 2)
    assert statements.drifted_pools() == []


def test_a_session_gives_back_what_it_was_admitted_with_whatever_its_class_became(quota_pool, owner):
    klass = quota_pool.classes.get()
    session = services.admit(user=owner, resource_class=klass).session
    ResourceClass.objects.filter(pk=klass.pk).update(cpu=Decimal("4"), memory=7)
    services.release(user=owner, session_id=session.pk)
    assert usage(quota_pool) == (0, Decimal("0"), 0, 0)


def test_a_request_that_does_not_fit_is_refused_and_stores_nothing(owner):
    pool = ResourcePool.objects.create(name="small", public=True, slots_total=3)
    klass = ResourceClass.objects.create(pool=pool, name="q", cpu=1, memory=1, default=True)
    services.admit(user=owner, resource_class=klass, slots=2)
    with pytest.raises(services.CapacityExceeded, match="1 of 3 slots available; 2 requested") as refused:
        services.admit(user=owner, resource_class=klass, slots=2)
    assert refused.value.extra == {"slots_available": 1}
    assert Session.objects.filter(pool=pool).count() == 1 and usage(pool)[0] == 2
    assert services.admit(user=owner, resource_class=klass, slots=1).created


@pytest.mark.parametrize(
    ("slots", "cpu", "memory", "gpu", "full"),
    [
        (1, "1", 1, 0, None),  # exactly at every limit
        (2, "1", 1, 0, "slots"),
        (1, "1.001", 1, 0, "cpu"),
        (1, "1", 2, 0, "memory"),
        (1, "1", 1, 1, "gpu"),
    ],
)
def test_the_capacity_rule_at_each_limit_and_the_refusal_names_what_is_full(owner, slots, cpu, memory, gpu, full):
    """R-SESS-1 at each boundary, written once in the statements: what admission admits is what
    the refusal's reasons say fits."""
    pool = ResourcePool.objects.create(
        name="edge", public=True, slots_total=3, quota_cpu=Decimal("3"), quota_memory=3, quota_gpu=1
    )
    held = ResourceClass.objects.create(pool=pool, name="held", cpu=Decimal("2"), memory=2, gpu=1, default=True)
    asked = ResourceClass.objects.create(pool=pool, name="asked", cpu=Decimal(cpu), memory=memory, gpu=gpu)
    services.admit(user=owner, resource_class=held, slots=2)
    if full is None:
        assert services.admit(user=owner, resource_class=asked, slots=slots).created
        return
    with pytest.raises(services.CapacityExceeded) as refused:
        services.admit(user=owner, resource_class=asked, slots=slots)
    if full == "slots":
        assert refused.value.extra == {"slots_available": 1}
    else:
        assert [reason.split()[0] for reason in refused.value.extra["quota_exceeded"]] == [full]
        assert refused.value.extra["slots_available"] == 1


def test_a_quota_that_fits_exactly_admits_whatever_the_backend_adds_decimals_as(owner):
    """SQLite adds the decimal column as a float (0.1 + 0.2 = 0.30000000000000004): the counter is
    kept at the column's precision, so a request that fits exactly is admitted."""
    pool = ResourcePool.objects.create(
        name="tenths", public=True, quota_cpu=Decimal("0.6"), quota_memory=10, quota_gpu=0
    )
    classes = [
        ResourceClass.objects.create(pool=pool, name=f"c{n}", cpu=Decimal(f"0.{n}"), memory=1, default=n == 1)
        for n in (1, 2, 3)
    ]
    for klass in classes:
        services.admit(user=owner, resource_class=klass)
    assert usage(pool)[1] == Decimal("0.6")


def test_a_class_id_beyond_any_row_is_no_such_class_not_an_error(local_pool, owner, api):
    with pytest.raises(services.NoSuchClass):
        services.admit(user=owner, resource_class=services.UsableClass(pk=2**63))
    response = api(owner).post("/api/v1/sessions/", {"resource_class": 10**30}, format="json")
    assert response.status_code == 400 and "resource_class" in response.json()


def test_a_session_due_for_expiry_makes_room_and_the_new_one_is_stored_once(owner, member):
    """R-SESS-3 on the refusal path: the due session is expired, and the new one admitted with
    the capacity it gave back."""
    pool = ResourcePool.objects.create(name="small", public=True, slots_total=3)
    klass = ResourceClass.objects.create(pool=pool, name="q", cpu=1, memory=1, default=True)
    due = services.admit(user=member, resource_class=klass, slots=2).session
    Session.objects.filter(pk=due.pk).update(idle_expires_at=timezone.now() - timedelta(seconds=1))
    session = services.admit(user=owner, resource_class=klass, slots=2).session
    due.refresh_from_db()
    assert due.status == SessionStatus.REVOKED
    assert list(Session.objects.filter(pool=pool, status=SessionStatus.ACTIVE)) == [session]
    assert usage(pool)[0] == 2


def test_release_by_its_owner_ends_the_session_once_and_someone_elses_is_forbidden(local_pool, owner, member):
    """R-SESS-4."""
    mine = services.admit(user=owner, resource_class=local_pool.classes.get()).session
    theirs = services.admit(user=member, resource_class=local_pool.classes.get()).session
    with pytest.raises(services.Forbidden):
        services.release(user=owner, session_id=theirs.pk)
    with pytest.raises(services.NotFound):
        services.release(user=owner, session_id="not-a-uuid")
    assert services.release(user=owner, session_id=str(mine.pk))
    assert not services.release(user=owner, session_id=mine.pk)  # already ended: idempotent, no second win
    mine.refresh_from_db()
    theirs.refresh_from_db()
    assert mine.status == SessionStatus.REVOKED and mine.revocation_reason == "released" and mine.revoked_at
    assert theirs.status == SessionStatus.ACTIVE and theirs.revoked_at is None
    assert usage(local_pool)[0] == 1


def test_ending_sessions_announces_them_once_for_job_cancellation(local_pool, owner):
    heard = []

    def receiver(sender, session_ids, reason, **kwargs):
        heard.append((list(session_ids), reason))

    sessions_revoked.connect(receiver)
    try:
        session = services.admit(user=owner, resource_class=local_pool.classes.get()).session
        services.release(user=owner, session_id=session.pk)
        services.release(user=owner, session_id=session.pk)  # already ended: nothing announced twice
        assert services.revoke(session_ids=[session.pk]) == 0
    finally:
        sessions_revoked.disconnect(receiver)
    assert heard == [([session.pk], "released")]


def test_one_revocation_ends_sessions_of_several_pools_and_gives_each_pool_its_share(quota_pool, local_pool, owner):
    sessions = [
        services.admit(user=owner, resource_class=quota_pool.classes.get(), slots=2).session,
        services.admit(user=owner, resource_class=quota_pool.classes.get(), slots=1).session,
        services.admit(user=owner, resource_class=local_pool.classes.get(), slots=4).session,
    ]
    ended = statements.end_sessions([s.pk for s in sessions], "manual", timezone.now())
    assert sorted(e.session.pk for e in ended) == sorted(s.pk for s in sessions)
    assert all(e.session.status == SessionStatus.REVOKED and e.session.revocation_reason == "manual" for e in ended)
    assert usage(quota_pool) == (0, Decimal("0"), 0, 0) and usage(local_pool)[0] == 0
    assert statements.end_sessions([s.pk for s in sessions], "manual", timezone.now()) == []


def test_the_recount_repairs_counters_that_drifted_and_counts_the_repair(quota_pool, owner, caplog):
    klass = quota_pool.classes.get()
    services.admit(user=owner, resource_class=klass, slots=2)
    PoolUsage.objects.filter(pool=quota_pool).update(slots_used=7, gpu_used=0)  # behind admission's back
    assert statements.drifted_pools() == [quota_pool.pk]
    assert services.recount_usage() == ["quota"]
    assert usage(quota_pool) == (2, Decimal("1.5"), 2, 1)
    assert PoolUsage.objects.get(pool=quota_pool).repairs == 1
    assert "usage counters" in caplog.text
    assert services.recount_usage() == []  # nothing left to repair


def test_saving_an_edited_pool_never_writes_back_the_counters_it_read(local_pool, owner):
    stale = ResourcePool.objects.get(pk=local_pool.pk)
    services.admit(user=owner, resource_class=local_pool.classes.get(), slots=3)
    stale.accessibility_message = "maintenance on Friday"
    stale.save()
    assert usage(local_pool)[0] == 3
