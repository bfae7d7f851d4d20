"""Session admission's and release's hand-written statements (STYLE.md rule 4, issue 15), tested
directly: the class lookup that checks access and locks the pool, the usage sum, the model
instances they give back, and the compare-and-set that ends a session."""

from decimal import Decimal

import pytest

from apps.resources.models import ResourceClass, ResourcePool
from apps.sessions import services
from apps.sessions.models import Session, SessionStatus
from apps.sessions.selectors import Usage, active_usage

pytestmark = pytest.mark.django_db


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


def test_admitted_session_carries_the_class_and_pool_as_stored(owner):
    """The instances built from the locking statement's row are the stored ones: JSON decoded,
    decimals and datetimes converted (SQLite and PostgreSQL alike)."""
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
    stored = Session.objects.get(pk=session.pk)  # inserted without save(): stored as save() would
    for field in Session._meta.concrete_fields:
        assert getattr(stored, field.attname) == getattr(session, field.attname), field.name


def test_same_scheduler_job_returns_its_session_and_a_different_one_is_refused(local_pool, owner):
    first = services.admit(user=owner, resource_class=services.UsableClass(pool_name="local"), external_id="77")
    again = services.admit(user=owner, resource_class=services.UsableClass(pool_name="local"), external_id="77")
    assert first.created and not again.created and again.session.pk == first.session.pk
    with pytest.raises(services.SessionConflict):
        services.admit(user=owner, resource_class=services.UsableClass(pool_name="local"), slots=2, external_id="77")


def test_active_usage_sums_slots_and_class_resources_of_active_sessions_only(owner):
    pool = ResourcePool.objects.create(
        name="quota", public=True, quota_cpu=Decimal("10"), quota_memory=100, quota_gpu=10, slots_total=10
    )
    klass = ResourceClass.objects.create(pool=pool, name="q", cpu=Decimal("1.5"), memory=2, gpu=1, default=True)
    other = ResourcePool.objects.create(name="empty", public=True)
    services.admit(user=owner, resource_class=klass, slots=2)
    services.admit(user=owner, resource_class=klass, slots=3)
    services.release(services.admit(user=owner, resource_class=klass, slots=4).session)
    usage = active_usage([pool.pk, other.pk])
    assert usage[other.pk] == Usage()
    assert usage[pool.pk] == Usage(slots=5, cpu=Decimal("3.0"), memory=4, gpu=2)
    assert isinstance(usage[pool.pk].cpu, Decimal)
    assert Session.objects.filter(status=SessionStatus.ACTIVE).count() == 2


def test_insert_goes_through_save_when_the_model_has_save_receivers(local_pool, owner):
    """rows.insert() skips the ORM's statement building, never a receiver of save signals."""
    from django.db.models import signals

    seen = []

    def receiver(sender, instance, created, **kwargs):
        seen.append((instance.pk, created))

    signals.post_save.connect(receiver, sender=Session)
    try:
        session = services.admit(user=owner, resource_class=local_pool.classes.get()).session
    finally:
        signals.post_save.disconnect(receiver, sender=Session)
    assert seen == [(session.pk, True)]
    assert Session.objects.get(pk=session.pk).launch_spec == session.launch_spec


def test_release_own_ends_only_the_callers_active_session_once(local_pool, owner, member):
    mine = services.admit(user=owner, resource_class=local_pool.classes.get()).session
    theirs = services.admit(user=member, resource_class=local_pool.classes.get()).session
    assert not services.release_own(owner, theirs.pk)  # someone else's: untouched
    assert not services.release_own(owner, "not-a-uuid")
    assert services.release_own(owner, str(mine.pk))
    assert not services.release_own(owner, mine.pk)  # already ended: idempotent, no second win
    mine.refresh_from_db()
    theirs.refresh_from_db()
    assert mine.status == SessionStatus.REVOKED and mine.revocation_reason == "released" and mine.revoked_at
    assert theirs.status == SessionStatus.ACTIVE and theirs.revoked_at is None


def test_ending_a_session_announces_it_for_job_cancellation(local_pool, owner):
    from apps.sessions.hooks import sessions_revoked

    heard = []

    def receiver(sender, session_ids, reason, **kwargs):
        heard.append((list(session_ids), reason))

    sessions_revoked.connect(receiver)
    try:
        session = services.admit(user=owner, resource_class=local_pool.classes.get()).session
        services.release_own(owner, session.pk)
        services.release(session)  # already ended: nothing announced twice
    finally:
        sessions_revoked.disconnect(receiver)
    assert heard == [([session.pk], "released")]


def test_a_quota_that_fits_exactly_admits_whatever_the_backend_sums_decimals_as(owner):
    """SQLite sums the decimal cpu column as a float (0.1 + 0.2 = 0.30000000000000004): the usage
    comes back at the column's precision, so a request that fits exactly is admitted."""
    pool = ResourcePool.objects.create(
        name="tenths", public=True, quota_cpu=Decimal("0.6"), quota_memory=10, quota_gpu=0
    )
    classes = [
        ResourceClass.objects.create(pool=pool, name=f"c{n}", cpu=Decimal(f"0.{n}"), memory=1, default=n == 1)
        for n in (1, 2, 3)
    ]
    for klass in classes:
        services.admit(user=owner, resource_class=klass)
    assert active_usage([pool.pk])[pool.pk].cpu == Decimal("0.6")


def test_a_class_id_beyond_any_row_is_no_such_class_not_an_error(local_pool, owner, api):
    with pytest.raises(services.NoSuchClass):
        services.admit(user=owner, resource_class=services.UsableClass(pk=2**63))
    response = api(owner).post("/api/v1/sessions/", {"resource_class": 10**30}, format="json")
    assert response.status_code == 400 and "resource_class" in response.json()


def test_active_usage_stores_the_inserting_session_and_sums_only_the_others(owner):
    """Admission's insert rides in the usage statement (PostgreSQL) or follows it: either way the
    new session is stored and the sum is what the others hold."""
    from django.utils import timezone

    pool = ResourcePool.objects.create(name="quota", public=True, slots_total=10)
    klass = ResourceClass.objects.create(pool=pool, name="q", cpu=Decimal("1.5"), memory=2, gpu=1, default=True)
    services.admit(user=owner, resource_class=klass, slots=2)
    now = timezone.now()
    new = Session(
        user=owner, resource_class=klass, pool=pool, slots=3, created_at=now, last_activity_at=now,
        expires_at=now, idle_expires_at=now, launch_spec={},
    )  # fmt: skip
    usage = active_usage([pool.pk], inserting=new)
    assert usage[pool.pk] == Usage(slots=2, cpu=Decimal("1.5"), memory=2, gpu=1)
    assert not new._state.adding and Session.objects.get(pk=new.pk).slots == 3
    assert active_usage([pool.pk])[pool.pk].slots == 5


def test_a_refused_admission_leaves_no_session_behind(owner):
    """The new session is stored before its capacity check: a refusal rolls it back."""
    pool = ResourcePool.objects.create(name="small", public=True, slots_total=3)
    klass = ResourceClass.objects.create(pool=pool, name="q", cpu=1, memory=1, default=True)
    services.admit(user=owner, resource_class=klass, slots=2)
    with pytest.raises(services.CapacityExceeded, match="1 of 3 slots available; 2 requested"):
        services.admit(user=owner, resource_class=klass, slots=2)
    assert Session.objects.filter(pool=pool).count() == 1
    assert services.admit(user=owner, resource_class=klass, slots=1).created


def test_a_session_due_for_expiry_makes_room_and_the_new_one_is_stored_once(owner, member):
    """R-SESS-3 on the refusal path: the speculative insert is undone, the due session expired,
    and the new session stored again, once, with the freed capacity."""
    from datetime import timedelta

    from django.utils import timezone

    pool = ResourcePool.objects.create(name="small", public=True, slots_total=3)
    klass = ResourceClass.objects.create(pool=pool, name="q", cpu=1, memory=1, default=True)
    due = services.admit(user=member, resource_class=klass, slots=2).session
    Session.objects.filter(pk=due.pk).update(idle_expires_at=timezone.now() - timedelta(seconds=1))
    session = services.admit(user=owner, resource_class=klass, slots=2).session
    due.refresh_from_db()
    assert due.status == SessionStatus.REVOKED
    assert list(Session.objects.filter(pool=pool, status=SessionStatus.ACTIVE)) == [session]
    assert active_usage([pool.pk])[pool.pk].slots == 2
