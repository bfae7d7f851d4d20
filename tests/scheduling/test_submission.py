"""R-JOB-1 submission: the owner and status checks live in ``submit_job``; no pool-wide lock;
a constant, small number of SQL statements; a coalesced dispatcher wake-up (R-SCHED-5)."""

import pytest
from django.db import connection

from apps.core.exceptions import Forbidden
from apps.scheduling import services
from apps.scheduling.models import Job, PoolQueue
from apps.sessions.models import Session
from apps.sessions.services import release


def test_submit_job_refuses_a_session_of_another_user(qpu_pool, fake_device, open_session, owner, member):
    session = open_session(qpu_pool, owner)
    with pytest.raises(Forbidden):
        services.submit_job(user=member, session=session, payload={}, shots=1)
    assert not Job.objects.exists()


def test_submit_job_refuses_an_ended_session(qpu_pool, fake_device, open_session, owner):
    session = open_session(qpu_pool, owner)
    release(session)
    session.refresh_from_db()
    with pytest.raises(Forbidden, match="revoked"):
        services.submit_job(user=owner, session=session, payload={}, shots=1)
    assert not Job.objects.exists()


def test_submit_job_refuses_a_session_that_ended_after_the_caller_read_it(qpu_pool, fake_device, open_session, owner):
    """The caller's copy says active; the database says revoked: the UPDATE's own check wins."""
    session = open_session(qpu_pool, owner)
    stale = services.session_for_submission(session.pk)
    release(session)
    with pytest.raises(Forbidden, match="revoked"):
        services.submit_job(user=owner, session=stale, payload={}, shots=1)
    assert not Job.objects.exists()


def test_submitted_job_is_stored_as_save_would_store_it(qpu_pool, fake_device, open_session, owner):
    """The hand-written renew-and-insert statement (issue 15) stores every column of the job as
    ``save()`` would: read back, nothing differs from the instance it returned."""
    session = open_session(qpu_pool, owner)
    payload = {"sequence": {"nested": [1, 2.5, None, "é"]}, "flag": True}
    job = services.submit_job(user=owner, session=services.session_for_submission(session.pk), payload=payload, shots=7)
    stored = Job.objects.get(pk=job.pk)
    for field in Job._meta.concrete_fields:
        assert getattr(stored, field.attname) == getattr(job, field.attname), field.name
    assert stored.payload == payload and stored.shots == 7 and stored.status == "pending"
    assert stored.session_id == session.pk and stored.user_id == owner.pk and stored.pool_id == qpu_pool.pk


def test_session_for_submission_brings_the_pool_and_its_queue_flag_in_one_statement(
    qpu_pool, fake_device, open_session, owner, django_assert_num_queries
):
    session = open_session(qpu_pool, owner)
    assert services.session_for_submission(session.pk).pool.name == "qpu"  # no queue row yet: None cached
    PoolQueue.objects.update_or_create(pool=qpu_pool, defaults={"awaiting_work": False, "vtime": 3.5})
    with django_assert_num_queries(1):
        found = services.session_for_submission(session.pk, pool_name="qpu")
        assert found.pk == session.pk and found.pool.queue.vtime == 3.5 and not found.pool.queue.awaiting_work
    assert services.session_for_submission(session.pk, pool_name="other") is None
    assert services.session_for_submission("not-a-uuid") is None


def test_session_for_submission_brings_the_pools_devices_in_the_models_order(
    qpu_pool, fake_device, open_session, owner, django_assert_num_queries
):
    """The devices every submission checks its payload against come with the session (a row
    per device), as the ORM reads them: in the model's order, every column converted."""
    from apps.scheduling.models import Device

    Device.objects.create(pool=qpu_pool, name="b-emu", driver="emulator", config={"pulser_device": "AnalogDevice"})
    Device.objects.create(pool=qpu_pool, name="a-emu", driver="emulator", config={"max_atoms": 4}, online=False)
    session = open_session(qpu_pool, owner)
    with django_assert_num_queries(1):
        found = services.session_for_submission(session.pk)
    expected = list(Device.objects.filter(pool=qpu_pool))
    assert [d.name for d in found.pool_devices] == ["a-emu", "b-emu", "fake1"] == [d.name for d in expected]
    for got, want in zip(found.pool_devices, expected, strict=True):
        for field in Device._meta.concrete_fields:
            assert getattr(got, field.attname) == getattr(want, field.attname), field.name
    assert found.pk == session.pk and found.pool.pk == qpu_pool.pk


def test_a_pool_without_devices_refuses_the_job_from_the_joined_lookup(qpu_pool, open_session, owner):
    session = open_session(qpu_pool, owner)
    found = services.session_for_submission(session.pk)
    assert found.pool_devices == [] and found.pk == session.pk
    with pytest.raises(services.InvalidPayload, match="no device"):
        services.submit_job(user=owner, session=found, payload={}, shots=1)
    assert not Job.objects.exists()


def test_a_submission_checks_the_devices_that_came_with_its_session(
    qpu_pool, fake_device, open_session, owner, monkeypatch
):
    """The payload check uses the devices read with the session (any database), and reads them
    itself only for a session that did not come from session_for_submission."""
    session = open_session(qpu_pool, owner)
    found = services.session_for_submission(session.pk)
    monkeypatch.setattr(services, "_pool_devices", lambda pool_id: pytest.fail("devices read again"))
    services.submit_job(user=owner, session=found, payload={}, shots=1)
    monkeypatch.undo()
    checked = []
    monkeypatch.setattr(services, "_pool_devices", lambda pool_id: checked.append(pool_id) or [fake_device])
    services.submit_job(user=owner, session=session, payload={}, shots=1)
    assert checked == [qpu_pool.pk] and Job.objects.count() == 2


def test_submission_renews_the_idle_deadline(qpu_pool, fake_device, open_session, owner):
    session = open_session(qpu_pool, owner)
    before = session.idle_expires_at
    services.submit_job(user=owner, session=session, payload={}, shots=1)
    session.refresh_from_db()
    assert session.idle_expires_at > before


@pytest.mark.postgres
def test_renewing_a_session_with_work_pending_updates_its_row_in_place(qpu_pool, fake_device, open_session, owner):
    """Issue 15: no index holds a column every submission writes (the idle deadline, the last
    activity), so PostgreSQL renews the session without writing into its indexes (a HOT update,
    counted by the transaction's statistics) instead of writing an entry into each of the
    table's indexes (eleven then) for every job."""
    session = open_session(qpu_pool, owner)
    services.submit_job(user=owner, session=services.session_for_submission(session.pk), payload={}, shots=1)

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
    services.submit_job(user=owner, session=services.session_for_submission(session.pk), payload={}, shots=1)
    after = updates()
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_submit_job_costs_at_most_two_statements_with_the_lookup(
    qpu_pool, fake_device, open_session, owner, django_assert_max_num_queries, settings
):
    """The common path: session lookup (pool, wake-up flag and the pool's devices for the
    payload check joined), and one statement that updates the session (checks, idle renewal,
    catch-up) and inserts the job (no BEGIN/COMMIT round trips). The dispatcher is already
    awake (a device is busy), so no wake-up is sent."""
    settings.GRIDGATE_TASKS_EAGER = False
    session = open_session(qpu_pool, owner)
    PoolQueue.objects.update_or_create(pool=qpu_pool, defaults={"awaiting_work": False})
    with django_assert_max_num_queries(2):
        fresh = services.session_for_submission(session.pk)
        services.submit_job(user=owner, session=fresh, payload={}, shots=1)
    with django_assert_max_num_queries(2):  # a second job (no catch-up) costs the same
        fresh = services.session_for_submission(session.pk)
        services.submit_job(user=owner, session=fresh, payload={}, shots=1)
    assert Job.objects.count() == 2


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_rest_submission_costs_at_most_three_statements(
    qpu_pool, fake_device, open_session, owner, django_assert_max_num_queries, settings
):
    """Issue 15 (at most 4), the whole REST stack with a real token: the token lookup, the
    session with the pool's devices (owner first: no permission lookup for one's own session),
    one insert."""
    from rest_framework.test import APIClient

    from apps.accounts.services import issue_token

    settings.GRIDGATE_TASKS_EAGER = False
    session = open_session(qpu_pool, owner)
    PoolQueue.objects.update_or_create(pool=qpu_pool, defaults={"awaiting_work": False})
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {issue_token(owner)[1]}")
    for _ in range(2):
        with django_assert_max_num_queries(3):
            response = client.post(f"/api/v1/sessions/{session.pk}/jobs/", {"payload": {}, "shots": 1}, format="json")
        assert response.status_code == 201, response.content


def test_submission_takes_no_lock_on_the_pool_queue(qpu_pool, fake_device, open_session, owner):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    session = open_session(qpu_pool, owner)
    with CaptureQueriesContext(connection) as ctx:
        services.submit_job(user=owner, session=session, payload={}, shots=1)
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
            fresh = services.session_for_submission(session.pk)
            services.submit_job(user=owner, session=fresh, payload={}, shots=1)
    assert sent == [("apps.scheduling.tasks.run_pool", (qpu_pool.pk,))]
    assert not PoolQueue.objects.get(pool=qpu_pool).awaiting_work


def test_no_wake_up_while_every_device_is_busy(
    qpu_pool, fake_device, open_session, owner, monkeypatch, django_capture_on_commit_callbacks
):
    session = open_session(qpu_pool, owner)
    services.submit_job(user=owner, session=session, payload={}, shots=1)
    services.run_pool(qpu_pool.pk)  # the device takes the job: it is busy now
    sent = []
    monkeypatch.setattr(services, "enqueue", lambda func, *args: sent.append((func, args)))
    with django_capture_on_commit_callbacks(execute=True):
        fresh = services.session_for_submission(session.pk)
        services.submit_job(user=owner, session=fresh, payload={}, shots=1)
    assert sent == []  # the job-finished event will dispatch it


def test_dispatcher_left_idle_is_woken_again_by_the_next_submission(
    qpu_pool, fake_device, open_session, owner, monkeypatch, django_capture_on_commit_callbacks
):
    session = open_session(qpu_pool, owner)
    PoolQueue.objects.create(pool=qpu_pool, awaiting_work=False)
    services.run_pool(qpu_pool.pk)  # nothing to run, the device is free: awaiting work
    assert PoolQueue.objects.get(pool=qpu_pool).awaiting_work
    sent = []
    monkeypatch.setattr(services, "enqueue", lambda func, *args: sent.append((func, args)))
    with django_capture_on_commit_callbacks(execute=True):
        fresh = services.session_for_submission(session.pk)
        services.submit_job(user=owner, session=fresh, payload={}, shots=1)
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
