"""Lock order pool queue → session → job (PATTERNS §2): revocation racing dispatch, on
PostgreSQL with real threads; an aborted transaction (deadlock, serialization) is retried or
answers 503 JSON, never a 500."""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import OperationalError, connection

from apps.core.exceptions import Unavailable
from apps.core.retry import retry_aborted
from apps.resources.models import ResourceClass, ResourcePool
from apps.scheduling import passes, services, statements
from apps.scheduling.models import Device, Job, JobStatus
from apps.sessions import services as session_services
from apps.sessions import statements as session_statements
from apps.sessions.models import Session, SessionStatus


class _Aborted(Exception):
    def __init__(self, sqlstate):
        super().__init__(sqlstate)
        self.sqlstate = sqlstate


def aborted(sqlstate="40P01"):
    """An OperationalError as Django raises it for a deadlock victim (the driver's error chained)."""
    try:
        raise OperationalError("deadlock detected") from _Aborted(sqlstate)
    except OperationalError as exc:
        return exc


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_revocations_racing_dispatch_neither_deadlock_nor_leave_work_behind(owner, member):
    pool = ResourcePool.objects.create(name="qpu", kind="local", public=True, strategy="weighted_fair")
    klass = ResourceClass.objects.create(pool=pool, name="c", cpu=1, memory=1, default=True)
    for i in range(3):
        Device.objects.create(pool=pool, name=f"d{i}", driver="fake", max_concurrent_jobs=4)
    sessions = [
        session_services.admit(user=owner if i % 2 else member, resource_class=klass, slots=1 + i % 3).session
        for i in range(24)
    ]
    for session in sessions:
        for _ in range(6):
            services.submit_job(user=session.user, session_id=session.pk, payload={}, shots=1)
    errors: list[BaseException] = []
    guard = threading.Lock()
    done = threading.Event()

    def dispatcher(_):
        try:
            while not done.is_set():
                job = passes.dispatch_once(pool.pk)
                if job is None:
                    Job.objects.filter(pool=pool, status=JobStatus.RUNNING).update(status=JobStatus.COMPLETED)
                    if not Job.objects.filter(pool=pool, status=JobStatus.PENDING).exists():
                        return
                    continue
                Job.objects.filter(pk=job.pk).update(status=JobStatus.COMPLETED)
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            with guard:
                errors.append(exc)
        finally:
            connection.close()

    def revoker(part):
        try:
            for session in sessions[part::2]:
                session_services.release(user=session.user, session_id=session.pk)
        except BaseException as exc:  # noqa: BLE001
            with guard:
                errors.append(exc)
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=4) as executor:
        futures = [executor.submit(dispatcher, i) for i in range(2)] + [executor.submit(revoker, p) for p in (0, 1)]
        for future in futures[2:]:
            future.result()
        done.set()
        for future in futures[:2]:
            future.result()

    assert errors == []
    assert not Session.objects.filter(status=SessionStatus.ACTIVE).exists()
    # Nothing of a revoked session waits: its pending jobs were cancelled, none dispatched after.
    assert not Job.objects.filter(status=JobStatus.PENDING).exists()
    assert not Job.objects.filter(status=JobStatus.CANCELLED).exclude(scheduled_at=None).exists()


def test_an_aborted_transaction_is_run_again():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise aborted("40P01")
        return "done"

    assert retry_aborted(flaky) == "done"
    assert len(calls) == 3


def test_a_transaction_aborted_every_time_is_a_503():
    def always():
        raise aborted("40001")

    with pytest.raises(Unavailable):
        retry_aborted(always)


def test_other_database_errors_are_not_retried():
    calls = []

    def broken():
        calls.append(1)
        raise OperationalError("connection refused")

    with pytest.raises(OperationalError):
        retry_aborted(broken)
    assert len(calls) == 1


@pytest.mark.django_db
@pytest.mark.parametrize("releaser", ["owner", "service_principal"])
def test_release_losing_to_a_deadlock_answers_503_json(
    api, owner, service_principal, releaser, qpu_pool, open_session, monkeypatch
):
    """The owner's release and the principal's (a lookup first) alike."""
    session = open_session(qpu_pool, owner)

    def deadlocked(*args, **kwargs):
        raise aborted("40P01")

    monkeypatch.setattr(session_statements, "end_sessions", deadlocked)
    response = api(owner if releaser == "owner" else service_principal).delete(f"/api/v1/sessions/{session.pk}/")
    assert response.status_code == 503
    assert response["Content-Type"].startswith("application/json") and "try again" in response.json()["detail"]


@pytest.mark.django_db
def test_job_submission_losing_to_a_deadlock_answers_503_json(
    api, owner, qpu_pool, fake_device, open_session, monkeypatch
):
    session = open_session(qpu_pool, owner)

    def deadlocked(*args, **kwargs):
        raise aborted("40P01")

    monkeypatch.setattr(statements, "renew_and_insert", deadlocked)
    response = api(owner).post(f"/api/v1/sessions/{session.pk}/jobs/", {"payload": {}, "shots": 1}, format="json")
    assert response.status_code == 503 and "try again" in response.json()["detail"]
