"""R-NOTE-1's producers: case finished/failed, session expiring soon, reservation starting, each
its own event, enqueued once however often its producer runs; the allocations' entry point."""

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.contrib.auth.models import Group
from django.core import mail

from apps.backends.fake import FakeBackend
from apps.cases import passes as case_passes
from apps.cases import services as cases
from apps.notifications import passes, services
from apps.notifications.models import Delivery, Event
from apps.reservations import passes as calendar
from apps.reservations.models import Reservation, WindowKind
from apps.reservations.services import save_reservation
from apps.resources.models import ResourceClass, ResourcePool
from apps.sessions import services as sessions

pytestmark = pytest.mark.django_db


@pytest.fixture
def with_email(owner, member):
    for user in (owner, member):
        user.email = f"{user.username}@example.org"
        user.save(update_fields=["email"])
    return owner


@pytest.fixture
def fake_cases(settings, tmp_path):
    settings.GRIDGATE_CASES_ROOT = tmp_path / "cases"
    settings.GRIDGATE_CASE_BACKENDS = {"local": "fake"}
    FakeBackend.reset()
    yield
    FakeBackend.reset()


def run_case(owner, pool, outcome="succeed"):
    case = cases.create_case(owner=owner, resource_class=pool.classes.get(), name="cavity", command="run-solver")
    options = {"outcome": "fail"} if outcome == "fail" else {}
    cases.launch_case(case, launch_options=options or None)
    case_passes.submit_pass(case_ids=[case.id])
    for _ in range(10):
        case_passes.poll_pass(case_ids=[case.id])
        case.refresh_from_db()
        if case.is_terminal:
            break
    return case


def subjects():
    return sorted(Delivery.objects.values_list("event", "subject", "user__username"))


def test_a_finished_case_and_a_failed_case_each_produce_their_event(with_email, local_pool, fake_cases, subscribe):
    subscribe(with_email, Event.CASE_FINISHED)
    subscribe(with_email, Event.CASE_FAILED)
    done = run_case(with_email, local_pool)
    failed = run_case(with_email, local_pool, outcome="fail")
    assert (done.status, failed.status) == ("done", "failed")
    assert subjects() == sorted(
        [("case.finished", f"case:{done.id}", "owner"), ("case.failed", f"case:{failed.id}", "owner")]
    )
    passes.deliver_due()
    assert sorted(m.subject for m in mail.outbox) == [
        "[Gridgate] Case cavity failed",
        "[Gridgate] Case cavity finished",
    ]


def test_a_case_whose_submission_fails_produces_case_failed(with_email, local_pool, fake_cases, subscribe):
    subscribe(with_email, Event.CASE_FAILED)
    FakeBackend.faults.fail_submit = 1
    case = run_case(with_email, local_pool)
    assert case.status == "failed"
    assert subjects() == [("case.failed", f"case:{case.id}", "owner")]


def test_a_session_expiring_soon_is_told_once_to_its_subscribed_owner(with_email, member, subscribe, settings):
    settings.GRIDGATE_NOTIFY_SESSION_EXPIRING_SECONDS = 900
    pool = ResourcePool.objects.create(name="qpu", kind="local", public=True, slots_total=4, max_lifetime=3600)
    klass = ResourceClass.objects.create(pool=pool, name="access", cpu=1, memory=1, default=True)
    subscribe(with_email, Event.SESSION_EXPIRING)
    mine = sessions.admit(user=with_email, resource_class=klass).session
    sessions.admit(user=member, resource_class=klass)  # not subscribed: never looked at
    assert passes.sessions_expiring() == 0  # an hour left: not yet
    soon = mine.expires_at - timedelta(minutes=10)
    assert passes.sessions_expiring(now=soon) == 1
    assert passes.sessions_expiring(now=soon + timedelta(minutes=1)) == 0  # once
    assert subjects() == [("session.expiring", f"session:{mine.pk}", "owner")]
    assert passes.sessions_expiring(now=mine.expires_at + timedelta(seconds=1)) == 0


def test_a_session_released_or_past_its_lifetime_is_never_told_it_is_expiring(with_email, subscribe, settings):
    settings.GRIDGATE_NOTIFY_SESSION_EXPIRING_SECONDS = 900
    pool = ResourcePool.objects.create(name="qpu", kind="local", public=True, slots_total=4, max_lifetime=3600)
    klass = ResourceClass.objects.create(pool=pool, name="access", cpu=1, memory=1, default=True)
    subscribe(with_email, Event.SESSION_EXPIRING)
    released = sessions.admit(user=with_email, resource_class=klass).session
    sessions.release(user=with_email, session_id=released.pk)
    assert passes.sessions_expiring(now=released.expires_at - timedelta(minutes=10)) == 0
    ended = sessions.admit(user=with_email, resource_class=klass).session  # no sweep runs: still active
    assert passes.sessions_expiring(now=ended.expires_at + timedelta(seconds=1)) == 0
    assert Delivery.objects.count() == 0


def test_a_reservation_starting_tells_its_holders_once(with_email, member, outsider, subscribe):
    outsider.email = "outsider@example.org"
    outsider.save(update_fields=["email"])
    ten = datetime(2030, 3, 4, 10, 0, tzinfo=UTC)
    pool = ResourcePool.objects.create(name="fresnel", kind="local", public=True, slots_total=2)
    ResourceClass.objects.create(pool=pool, name="access", cpu=1, memory=1, default=True)
    group = Group.objects.create(name="group-a")
    member.groups.add(group)
    for user in (with_email, member, outsider):
        subscribe(user, Event.RESERVATION_STARTING)
    window = save_reservation(
        Reservation(
            pool=pool, kind=WindowKind.RESERVATION, start=ten, end=ten + timedelta(hours=1), slots=1, title="Run"
        ),
        users=[with_email],
        groups=[group],
    )
    with time_machine.travel(ten - timedelta(minutes=5), tick=False):
        calendar.start_windows()
        assert not Delivery.objects.exists()  # not before its start
    with time_machine.travel(ten + timedelta(seconds=1), tick=False):
        assert pool.pk in calendar.start_windows()
        assert calendar.start_windows() == {}  # started: the tick passes it by
    key = f"reservation:{window.pk}:20300304T100000"
    assert subjects() == [("reservation.starting", key, "member"), ("reservation.starting", key, "owner")]


def test_the_allocations_entry_point_enqueues_once_per_subject(with_email, subscribe):
    """The allocation events are emitted by the allocations (R-ALLOC-1) through services.notify."""
    subscribe(with_email, Event.ALLOCATION_80)
    subject = "allocation:7:2030-03"
    payload = {"summary": "Your allocation on fresnel is at 80 %", "allocation": {"id": 7, "used": 0.8}}
    assert services.notify(user=with_email, event=Event.ALLOCATION_80, subject=subject, payload=payload) == 1
    assert services.notify(user=with_email, event=Event.ALLOCATION_80, subject=subject, payload=payload) == 0
    assert services.notify(user=with_email, event=Event.ALLOCATION_100, subject=subject, payload=payload) == 0
    passes.deliver_due()
    assert [m.subject for m in mail.outbox] == ["[Gridgate] Your allocation on fresnel is at 80 %"]
