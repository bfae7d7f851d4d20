"""R-SESS-3: absolute and idle lifetimes, with time travel (time-machine), and the sweep."""

from datetime import timedelta

import pytest
import time_machine
from django.core.management import call_command
from django.db.models import Q
from django.utils import timezone

from apps.resources.models import PoolUsage, ResourceClass, ResourcePool
from apps.scheduling.models import Device
from apps.scheduling.services import submit_job
from apps.sessions import hooks, services
from apps.sessions.models import Session

pytestmark = pytest.mark.django_db


@pytest.fixture
def pool(db):
    pool = ResourcePool.objects.create(
        name="qpu", kind="local", public=True, slots_total=2, idle_timeout=600, max_lifetime=3600
    )
    ResourceClass.objects.create(pool=pool, name="access", cpu=1, memory=1, default=True)
    return pool


@pytest.fixture
def busy(db):
    """Sessions whose external id starts with "busy" count as having pending/running work,
    standing in for the scheduling app's condition (a pure Q, as compiled queries require)."""

    def condition():
        return Q(external_id__startswith="busy")

    hooks.register_busy_condition(condition)
    yield
    hooks.unregister_busy_condition(condition)


def admit(pool, user, **kwargs):
    return services.admit(user=user, resource_class=pool.classes.get(), **kwargs).session


def submit(session):
    """Activity: a job submitted into the session (R-SESS-3), which renews its idle deadline."""
    Device.objects.get_or_create(pool_id=session.pool_id, name="fake", defaults={"driver": "fake"})
    submit_job(user=session.user, session_id=session.pk, payload={}, shots=1)


def test_idle_session_without_jobs_is_revoked_after_idle_timeout(pool, owner):
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        session = admit(pool, owner)
    with time_machine.travel(start + timedelta(seconds=599), tick=False):
        assert services.expire_due_sessions() == {"max_lifetime": 0, "idle_timeout": 0}
    with time_machine.travel(start + timedelta(seconds=601), tick=False):
        assert services.expire_due_sessions()["idle_timeout"] == 1
    session.refresh_from_db()
    assert (session.status, session.revocation_reason) == ("revoked", "idle_timeout")


def test_idle_session_with_unfinished_work_is_not_idle_expired(pool, owner, busy):
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        session = admit(pool, owner, external_id="busy-1")
    with time_machine.travel(start + timedelta(seconds=900), tick=False):
        services.expire_due_sessions()
    session.refresh_from_db()
    assert session.status == "active"


def test_absolute_expiry_applies_even_with_unfinished_work(pool, owner, busy):
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        session = admit(pool, owner, external_id="busy-2")
        for minutes in range(5, 60, 5):  # activity keeps renewing the idle deadline ...
            with time_machine.travel(start + timedelta(minutes=minutes), tick=False):
                submit(session)
    with time_machine.travel(start + timedelta(seconds=3601), tick=False):
        services.expire_due_sessions()
    session.refresh_from_db()
    assert (session.status, session.revocation_reason) == ("revoked", "max_lifetime")


def test_a_session_ended_for_its_lifetime_ended_at_its_deadline_however_late_the_sweep(pool, owner):
    """Accounting counts a session's slot-hours to ``revoked_at``: the sweep that found it ten
    minutes past its lifetime stamped its own time, ten minutes of slots never held. An idle
    expiry keeps the sweep's time (work may have kept the session past its idle deadline)."""
    from apps.accounting.selectors import usage

    start = timezone.now().replace(microsecond=0)
    with time_machine.travel(start, tick=False):
        session = admit(pool, owner)
    with time_machine.travel(start + timedelta(seconds=3600 + 600), tick=False):
        services.expire_due_sessions()
    session.refresh_from_db()
    assert (session.revocation_reason, session.revoked_at) == ("max_lifetime", session.expires_at)
    assert session.revoked_at == start + timedelta(seconds=3600)
    (row,) = usage(start - timedelta(hours=1), start + timedelta(hours=3))
    assert row["session_slot_hours"] == pytest.approx(1.0), row


def test_activity_renews_the_idle_deadline(pool, owner, settings):
    settings.GRIDGATE_TASKS_EAGER = False  # the job stays pending: the session is busy, not renewed
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        session = admit(pool, owner)
    with time_machine.travel(start + timedelta(seconds=500), tick=False):
        submit(session)
    with time_machine.travel(start + timedelta(seconds=700), tick=False):
        services.expire_due_sessions()
    session.refresh_from_db()
    assert session.status == "active"


def test_expired_sessions_never_block_admission(pool, owner):
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        old = admit(pool, owner, slots=2)
    with time_machine.travel(start + timedelta(seconds=3601), tick=False):
        new = admit(pool, owner, slots=2)  # would not fit if the expired session still counted
    old.refresh_from_db()
    assert old.revocation_reason == "max_lifetime" and new.is_active


def test_idle_sessions_never_block_admission_but_busy_ones_do(pool, owner, busy):
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        idle = admit(pool, owner)
        working = admit(pool, owner, external_id="busy-3")
    with time_machine.travel(start + timedelta(seconds=601), tick=False):
        new = admit(pool, owner)  # fits only once the idle one is revoked
        with pytest.raises(services.CapacityExceeded):
            admit(pool, owner)  # the busy one is past its idle deadline too, but keeps its slot
    idle.refresh_from_db()
    working.refresh_from_db()
    assert idle.revocation_reason == "idle_timeout" and working.is_active and new.is_active


def test_a_due_session_of_the_same_scheduler_job_is_never_handed_out_again(pool, owner):
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        old = admit(pool, owner, external_id="job-9")
    with time_machine.travel(start + timedelta(seconds=601), tick=False):  # idle past its deadline
        new = admit(pool, owner, external_id="job-9")
    old.refresh_from_db()
    assert old.revocation_reason == "idle_timeout" and new.pk != old.pk and new.is_active


def test_expire_sessions_command_reports_and_is_safe_to_rerun(pool, owner, capsys):
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        admit(pool, owner)
    with time_machine.travel(start + timedelta(hours=2), tick=False):
        call_command("expire_sessions")
        call_command("expire_sessions")
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "expired 1 session(s) past max_lifetime, 0 idle session(s)",
        "expired 0 session(s) past max_lifetime, 0 idle session(s)",
    ]


def test_revocation_is_announced_for_job_cancellation(pool, owner):
    received = []

    def receiver(sender, session_ids, reason, **kwargs):
        received.append((list(session_ids), reason))

    hooks.sessions_revoked.connect(receiver)
    try:
        session = admit(pool, owner)
        services.revoke(session_ids=[session.pk])
        services.revoke(session_ids=[session.pk])  # second revoke changes nothing and announces nothing
    finally:
        hooks.sessions_revoked.disconnect(receiver)
    assert received == [([session.pk], "manual")]


def test_expiry_schedule_is_installed(db):
    from django_q.models import Schedule

    schedule = Schedule.objects.get(name="gridgate.expire_sessions")
    assert schedule.func == "apps.sessions.tasks.expire_sessions" and schedule.minutes == 1


def test_session_table_is_untouched_by_expiry_of_other_pools(pool, owner):
    other = ResourcePool.objects.create(name="other", kind="local", public=True, max_lifetime=60)
    ResourceClass.objects.create(pool=other, name="c", cpu=1, memory=1, default=True)
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        s_other = admit(other, owner)
    with time_machine.travel(start + timedelta(seconds=120), tick=False):
        services.expire_due_sessions(pool_id=pool.pk)
    assert Session.objects.get(pk=s_other.pk).status == "active"


def test_r_sess_7_a_session_past_its_lifetime_reads_as_ended_before_any_sweep(pool, owner, api):
    """No sweep has run: the API reads the session as ended the moment it is due, and its slots
    are free for the next admission."""
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        session = admit(pool, owner, slots=2)
    with time_machine.travel(start + timedelta(seconds=3601), tick=False):
        read = api(owner).get(f"/api/v1/sessions/{session.pk}/").json()
        assert (read["status"], read["revocation_reason"]) == ("revoked", "max_lifetime")
        assert PoolUsage.objects.get(pool=pool).slots_used == 0


def test_r_sess_7_an_idle_session_reads_as_ended_unless_work_keeps_it(pool, owner, busy, client):
    """Idle past its deadline: the list and the session's page read it as ended (R-SESS-3's rule:
    one with unfinished work is kept, as the sweep would keep it)."""
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        idle, working = admit(pool, owner), admit(pool, owner, external_id="busy-1")
    client.force_login(owner)
    with time_machine.travel(start + timedelta(seconds=601), tick=False):
        assert client.get(f"/sessions/{idle.pk}/").status_code == 200
        idle.refresh_from_db()
        assert (idle.status, idle.revocation_reason) == ("revoked", "idle_timeout")
        listed = client.get("/api/v1/sessions/").json()["results"]
    assert {item["id"]: item["status"] for item in listed} == {str(idle.pk): "revoked", str(working.pk): "active"}
