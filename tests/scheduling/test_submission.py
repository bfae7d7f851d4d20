"""R-JOB-1 submission: the owner and status checks live in ``submit_job``; no pool-wide lock;
a constant, small number of SQL statements (``apps.scheduling.statements``, tested here
directly); a coalesced dispatcher wake-up (R-SCHED-5)."""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from apps.core.exceptions import Forbidden, NotFound
from apps.resources.models import PoolUsage
from apps.scheduling import known, passes, services, statements
from apps.scheduling.models import Job, PoolQueue
from apps.sessions.models import Session
from apps.sessions.services import release


def test_submit_job_refuses_a_session_of_another_user(qpu_pool, fake_device, open_session, owner, member):
    session = open_session(qpu_pool, owner)
    with pytest.raises(Forbidden):
        services.submit_job(user=member, session_id=session.pk, payload={}, shots=1)
    assert not Job.objects.exists()


def test_submit_job_refuses_an_ended_session(qpu_pool, fake_device, open_session, owner):
    session = open_session(qpu_pool, owner)
    release(user=session.user, session_id=session.pk)
    session.refresh_from_db()
    with pytest.raises(Forbidden, match="revoked"):
        services.submit_job(user=owner, session_id=session.pk, payload={}, shots=1)
    assert not Job.objects.exists()


def test_submit_job_refuses_a_session_that_ended_after_it_was_read(
    qpu_pool, fake_device, open_session, owner, monkeypatch
):
    """The lookup said active; the session ended before the insert: the statement's own check
    wins, and the submission answers as for an ended session."""
    session = open_session(qpu_pool, owner)
    read = statements.target

    def read_then_release(session_id, pool_name):
        found = read(session_id, pool_name)
        if found.status == "active":
            release(user=session.user, session_id=session.pk)
        return found

    monkeypatch.setattr(statements, "target", read_then_release)
    with pytest.raises(Forbidden, match="revoked"):
        services.submit_job(user=owner, session_id=session.pk, payload={}, shots=1)
    assert not Job.objects.exists()


def test_an_unknown_or_malformed_session_is_not_found(qpu_pool, fake_device, open_session, owner):
    session = open_session(qpu_pool, owner)
    for session_id in ("not-a-uuid", "8a1b0e0c-0000-4000-8000-000000000000"):
        with pytest.raises(NotFound):
            services.submit_job(user=owner, session_id=session_id, payload={}, shots=1)
    with pytest.raises(NotFound, match="on pool 'other'"):
        services.submit_job(user=owner, session_id=session.pk, pool_name="other", payload={}, shots=1)


def test_submitted_job_is_stored_as_save_would_store_it(qpu_pool, fake_device, open_session, owner):
    """The hand-written renew-and-insert statement stores every column of the job as ``save()``
    would: read back, nothing differs from the instance it returned."""
    session = open_session(qpu_pool, owner)
    payload = {"sequence": {"nested": [1, 2.5, None, "é"]}, "flag": True}
    job = services.submit_job(user=owner, session_id=session.pk, payload=payload, shots=7)
    stored = Job.objects.get(pk=job.pk)
    for field in Job._meta.concrete_fields:
        assert getattr(stored, field.attname) == getattr(job, field.attname), field.name
    assert stored.payload == payload and stored.shots == 7 and stored.status == "pending"
    assert stored.session_id == session.pk and stored.user_id == owner.pk and stored.pool_id == qpu_pool.pk


def test_the_lookup_brings_the_session_its_pool_and_the_pools_devices_in_one_statement(
    qpu_pool, fake_device, open_session, owner, django_assert_num_queries
):
    """The devices every submission checks its payload against come with the session (a row per
    device), as the ORM reads them: in the model's order, every column converted."""
    from apps.scheduling.models import Device

    Device.objects.create(pool=qpu_pool, name="b-emu", driver="emulator", config={"pulser_device": "AnalogDevice"})
    Device.objects.create(pool=qpu_pool, name="a-emu", driver="emulator", config={"max_atoms": 4}, online=False)
    session = open_session(qpu_pool, owner)
    with django_assert_num_queries(1):
        found = statements.target(session.pk, "qpu")
    expected = list(Device.objects.filter(pool=qpu_pool))
    assert [d.name for d in found.devices] == ["a-emu", "b-emu", "fake1"] == [d.name for d in expected]
    for got, want in zip(found.devices, expected, strict=True):
        for field in Device._meta.concrete_fields:
            assert getattr(got, field.attname) == getattr(want, field.attname), field.name
    assert (found.session_id, found.user_id, found.status) == (session.pk, owner.pk, "active")
    assert found.pool.pk == qpu_pool.pk and found.pool.name == "qpu"
    assert statements.target(session.pk, "other") is None


def test_a_pool_without_devices_refuses_the_job(qpu_pool, open_session, owner):
    session = open_session(qpu_pool, owner)
    assert statements.target(session.pk, None).devices == []
    with pytest.raises(services.InvalidPayload, match="no device"):
        services.submit_job(user=owner, session_id=session.pk, payload={}, shots=1)
    assert not Job.objects.exists()


def test_a_job_naming_a_device_is_checked_by_that_device_of_the_sessions_pool_only(
    qpu_pool, fake_device, open_session, owner
):
    from django.core.exceptions import ValidationError

    session = open_session(qpu_pool, owner)
    job = services.submit_job(user=owner, session_id=session.pk, payload={}, shots=1, device_id=fake_device.pk)
    assert job.target_device_id == fake_device.pk
    with pytest.raises(ValidationError, match="Not a device of this session's pool"):
        services.submit_job(user=owner, session_id=session.pk, payload={}, shots=1, device_id=fake_device.pk + 100)


def test_submission_renews_the_idle_deadline(qpu_pool, fake_device, open_session, owner):
    session = open_session(qpu_pool, owner)
    before = session.idle_expires_at
    services.submit_job(user=owner, session_id=session.pk, payload={}, shots=1)
    session.refresh_from_db()
    assert session.idle_expires_at > before


def test_r_sess_7_a_session_past_its_lifetime_accepts_no_job_even_with_no_sweep(
    qpu_pool, fake_device, open_session, owner
):
    """No worker has run the expiry sweep: the submission finds the session due, ends it (its
    slots go back at once) and refuses the job as for any ended session."""
    session = open_session(qpu_pool, owner, slots=8)
    Session.objects.filter(pk=session.pk).update(expires_at=timezone.now() - timedelta(seconds=10))
    with pytest.raises(Forbidden, match="max_lifetime"):
        services.submit_job(user=owner, session_id=session.pk, payload={}, shots=1)
    session.refresh_from_db()
    assert (session.status, session.revocation_reason) == ("revoked", "max_lifetime")
    assert PoolUsage.objects.get(pool=qpu_pool).slots_used == 0
    assert not Job.objects.exists()


def test_r_sess_7_a_session_idle_past_its_deadline_accepts_no_job_unless_work_keeps_it_busy(
    qpu_pool, fake_device, open_session, owner
):
    """R-SESS-3's idle rule, at submission: idle past the deadline with nothing unfinished is due
    (refused); with a job still pending the session is busy, not idle, and takes the next one."""
    busy, idle = open_session(qpu_pool, owner), open_session(qpu_pool, owner)
    services.submit_job(user=owner, session_id=busy.pk, payload={}, shots=1)
    past = timezone.now() - timedelta(seconds=10)
    Session.objects.filter(pk__in=[busy.pk, idle.pk]).update(idle_expires_at=past)
    assert services.submit_job(user=owner, session_id=busy.pk, payload={}, shots=1).pk
    with pytest.raises(Forbidden, match="idle_timeout"):
        services.submit_job(user=owner, session_id=idle.pk, payload={}, shots=1)
    assert Job.objects.filter(session=busy).count() == 2 and not Job.objects.filter(session=idle).exists()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_r_sess_7_a_remembered_session_past_its_lifetime_accepts_no_job(qpu_pool, fake_device, open_session, owner):
    """The process's memory of the session is no shortcut past its deadline: the statement
    compares it."""
    known.clear()
    session = open_session(qpu_pool, owner)
    services.submit_job(user=owner, session_id=session.pk, payload={}, shots=1)
    assert known.recall(session.pk, owner.pk, None) is not None
    Session.objects.filter(pk=session.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(Forbidden, match="max_lifetime"):
        services.submit_job(user=owner, session_id=session.pk, payload={}, shots=1)
    assert Job.objects.filter(session=session).count() == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_r_sess_7_a_remembered_session_idle_past_its_deadline_accepts_no_job(
    qpu_pool, fake_device, open_session, owner
):
    """Its one job was cancelled, then its idle deadline passed: nothing keeps it busy, and the
    process's memory of it is no shortcut past that deadline either."""
    known.clear()
    session = open_session(qpu_pool, owner)
    first = services.submit_job(user=owner, session_id=session.pk, payload={}, shots=1)
    assert known.recall(session.pk, owner.pk, None) is not None
    services.cancel_job(first)
    Session.objects.filter(pk=session.pk).update(idle_expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(Forbidden, match="idle_timeout"):
        services.submit_job(user=owner, session_id=session.pk, payload={}, shots=1)
    assert Job.objects.filter(session=session).count() == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_remembered_session_is_not_found_through_another_pools_route(qpu_pool, fake_device, open_session, owner):
    """QRMI names the pool in its route: a session of pool 'qpu' is no session of pool 'other',
    whether the process remembers it or reads it."""
    from tests import factories

    factories.device(factories.pool("other", slots_total=4), "fake2")
    known.clear()
    session = open_session(qpu_pool, owner)
    services.submit_job(user=owner, session_id=session.pk, pool_name="qpu", payload={}, shots=1)
    assert known.recall(session.pk, owner.pk, "qpu") is not None
    with pytest.raises(NotFound, match="on pool 'other'"):
        services.submit_job(user=owner, session_id=session.pk, pool_name="other", payload={}, shots=1)
    assert Job.objects.filter(session=session).count() == 1


@pytest.mark.postgres
def test_renewing_a_session_with_work_pending_updates_its_row_in_place(qpu_pool, fake_device, open_session, owner):
    """No index holds a column every submission writes (the idle deadline, the last activity), so
    PostgreSQL renews the session without writing into its indexes (a HOT update, counted by the
    transaction's statistics) instead of writing an entry into each of the table's indexes for
    every job. The table's fillfactor leaves the page room for it: with full pages (the default)
    a session inserted into one was renewed out of place, as this test once saw under CI."""
    session = open_session(qpu_pool, owner)
    services.submit_job(user=owner, session_id=session.pk, payload={}, shots=1)

    def updates():  # (rows updated, of them in place) in this transaction
        with connection.cursor() as cursor:
            table = Session._meta.db_table
            cursor.execute(
                "SELECT pg_stat_get_xact_tuples_updated(%s::regclass),"
                " pg_stat_get_xact_tuples_hot_updated(%s::regclass)",
                [table, table],
            )
            return cursor.fetchone()

    before = updates()
    services.submit_job(user=owner, session_id=session.pk, payload={}, shots=1)
    after = updates()
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_submit_job_costs_at_most_two_statements_with_the_lookup(
    qpu_pool, fake_device, open_session, owner, django_assert_max_num_queries, settings
):
    """The common path: the session lookup (with the pool and its devices for the payload
    check), and one statement that updates the session (checks, idle renewal, catch-up) and
    inserts the job (no BEGIN/COMMIT round trips). The dispatcher is already awake (a device is
    busy), so no wake-up is sent."""
    settings.GRIDGATE_TASKS_EAGER = False
    session = open_session(qpu_pool, owner)
    PoolQueue.objects.update_or_create(pool=qpu_pool, defaults={"awaiting_work": False})
    for _ in range(2):  # a second job (no catch-up) costs the same
        known.clear()
        with django_assert_max_num_queries(2):
            services.submit_job(user=owner, session_id=session.pk, payload={}, shots=1)
    assert Job.objects.count() == 2


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_rest_submission_costs_at_most_three_statements(
    qpu_pool, fake_device, open_session, owner, django_assert_max_num_queries, settings
):
    """SPEC §9 (at most 4), the whole REST stack with a real token: the token lookup, the session
    with the pool's devices (no permission lookup for one's own session), one insert."""
    from rest_framework.test import APIClient

    from tests.conftest import used_token_key

    settings.GRIDGATE_TASKS_EAGER = False
    session = open_session(qpu_pool, owner)
    PoolQueue.objects.update_or_create(pool=qpu_pool, defaults={"awaiting_work": False})
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {used_token_key(owner)}")
    for _ in range(2):
        known.clear()
        with django_assert_max_num_queries(3):
            response = client.post(f"/api/v1/sessions/{session.pk}/jobs/", {"payload": {}, "shots": 1}, format="json")
        assert response.status_code == 201, response.content


def test_submission_takes_no_lock_on_the_pool_queue(qpu_pool, fake_device, open_session, owner):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    session = open_session(qpu_pool, owner)
    with CaptureQueriesContext(connection) as ctx:
        services.submit_job(user=owner, session_id=session.pk, payload={}, shots=1)
    assert not [q["sql"] for q in ctx.captured_queries if "FOR UPDATE" in q["sql"]]


def test_submissions_wake_an_idle_dispatcher_once(
    qpu_pool, fake_device, open_session, owner, monkeypatch, django_capture_on_commit_callbacks
):
    """R-SCHED-5, coalesced: the first submission into a pool whose device waits for work
    enqueues one pass; the ones after it (the pass not run yet) enqueue nothing."""
    sent = []
    monkeypatch.setattr(services, "enqueue", lambda func, *args: sent.append((func, args)))
    session = open_session(qpu_pool, owner)
    for _ in range(5):
        with django_capture_on_commit_callbacks(execute=True):
            services.submit_job(user=owner, session_id=session.pk, payload={}, shots=1)
    assert sent == [("apps.scheduling.tasks.run_pool", (qpu_pool.pk,))]
    assert not PoolQueue.objects.get(pool=qpu_pool).awaiting_work


def test_no_wake_up_while_every_device_is_busy(
    qpu_pool, fake_device, open_session, owner, monkeypatch, django_capture_on_commit_callbacks
):
    session = open_session(qpu_pool, owner)
    services.submit_job(user=owner, session_id=session.pk, payload={}, shots=1)
    passes.run_pool(qpu_pool.pk)  # the device takes the job: it is busy now
    sent = []
    monkeypatch.setattr(services, "enqueue", lambda func, *args: sent.append((func, args)))
    with django_capture_on_commit_callbacks(execute=True):
        services.submit_job(user=owner, session_id=session.pk, payload={}, shots=1)
    assert sent == []  # the job-finished event will dispatch it


def test_dispatcher_left_idle_is_woken_again_by_the_next_submission(
    qpu_pool, fake_device, open_session, owner, monkeypatch, django_capture_on_commit_callbacks
):
    session = open_session(qpu_pool, owner)
    PoolQueue.objects.create(pool=qpu_pool, awaiting_work=False)
    passes.run_pool(qpu_pool.pk)  # nothing to run, the device is free: awaiting work
    assert PoolQueue.objects.get(pool=qpu_pool).awaiting_work
    sent = []
    monkeypatch.setattr(services, "enqueue", lambda func, *args: sent.append((func, args)))
    with django_capture_on_commit_callbacks(execute=True):
        services.submit_job(user=owner, session_id=session.pk, payload={}, shots=1)
    assert len(sent) == 1


def test_a_broker_failure_never_fails_a_committed_submission(
    api, qpu_pool, fake_device, open_session, owner, monkeypatch, django_capture_on_commit_callbacks
):
    def broken(*args, **kwargs):
        raise ConnectionError("broker down")

    monkeypatch.setattr(services, "enqueue", broken)
    session = open_session(qpu_pool, owner)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        response = api(owner).post(f"/api/v1/sessions/{session.pk}/jobs/", {"payload": {}, "shots": 1}, format="json")
    assert callbacks  # the wake-up ran, and failed
    assert response.status_code == 201
    assert Job.objects.filter(session=session).count() == 1
