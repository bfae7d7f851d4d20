"""A session its owner submitted into before is taken from the web process's memory
(``apps.scheduling.known``: no lookup statement), and nothing remembered is trusted: the submission's
statement inserts only while the session is still the caller's and active and the pool and its
devices are the rows the payload was checked against (R-DEV-1); anything else gives the answer
the path without memory gives. PostgreSQL only (the versions are its ``xmin``), in autocommit
as in production: a test transaction would make every row one transaction's."""

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone
from rest_framework.test import APIClient

from apps.resources.models import ResourcePool
from apps.scheduling import known, services
from apps.scheduling.models import Device, Job, PoolQueue
from apps.sessions.services import release
from tests.conftest import used_token_key
from tests.scheduling.pulser_sequences import analog_sequence

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def no_memory_from_other_tests(settings):
    settings.GRIDGATE_TASKS_EAGER = False
    known.clear()


@pytest.fixture
def emulator(qpu_pool):
    return Device.objects.create(pool=qpu_pool, name="emu", driver="emulator", config={"max_atoms": 4})


@pytest.fixture
def remembered(qpu_pool, emulator, open_session, owner):
    """(session, owner's client) after one submission: the web process now knows the session."""
    session = open_session(qpu_pool, owner)
    client = client_of(owner)
    assert submit(client, session).status_code == 201
    assert known.recall(session.pk, owner.pk, None) is not None
    return session, client


def client_of(user) -> APIClient:
    return APIClient(HTTP_AUTHORIZATION=f"Token {used_token_key(user)}")


def submit(client, session, sequence=None, shots=1):
    body = {"payload": {"sequence": sequence or analog_sequence(2)}, "shots": shots}
    return client.post(f"/api/v1/sessions/{session.pk}/jobs/", body, format="json")


def test_a_second_submission_into_a_session_costs_the_token_and_one_statement(
    qpu_pool, emulator, open_session, owner, statement_budget
):
    session = open_session(qpu_pool, owner)
    PoolQueue.objects.update_or_create(pool=qpu_pool, defaults={"awaiting_work": False})
    client = client_of(owner)
    with statement_budget(3):  # the token, the session with its pool and devices, the insert
        assert submit(client, session).status_code == 201
    with statement_budget(2) as context:  # the token and the insert: the session from memory
        response = submit(client, session)
    assert response.status_code == 201, response.content
    assert "INSERT" in context.captured_queries[-1]["sql"]
    job = Job.objects.get(pk=response.json()["id"])
    assert (job.session_id, job.user_id, job.pool_id, job.status) == (session.pk, owner.pk, qpu_pool.pk, "pending")
    assert Job.objects.count() == 2


def test_a_device_changed_since_the_session_was_remembered_checks_the_payload_as_it_is_now(
    qpu_pool, emulator, remembered
):
    """R-DEV-1: an administrator lowers the emulator's atoms (a bare UPDATE, no signal): the
    remembered device would accept the 2-atom sequence; the statement sees another version and
    the submission is checked against the device as it is."""
    session, client = remembered
    Device.objects.filter(pk=emulator.pk).update(config={"max_atoms": 1})
    response = submit(client, session)
    assert response.status_code == 400, response.content
    assert "at most 1" in response.json()["payload"][0]
    assert Job.objects.count() == 1


def test_a_device_added_since_the_session_was_remembered_checks_the_payload_too(qpu_pool, remembered):
    session, client = remembered
    Device.objects.create(pool=qpu_pool, name="small", driver="emulator", config={"max_atoms": 1})
    assert submit(client, session).status_code == 400
    assert Job.objects.count() == 1


def test_a_pool_changed_since_renews_the_session_with_its_idle_timeout_as_it_is_now(qpu_pool, remembered):
    session, client = remembered
    ResourcePool.objects.filter(pk=qpu_pool.pk).update(idle_timeout=60)
    before = timezone.now()
    assert submit(client, session).status_code == 201
    session.refresh_from_db()
    assert before + timedelta(seconds=59) < session.idle_expires_at < timezone.now() + timedelta(seconds=61)


def test_a_session_ended_since_it_was_remembered_is_refused_as_without_memory(remembered):
    """R-JOB-1: the same 403 either way, and a payload refused in an ended session is still a 403
    (the path without memory checks the session first)."""
    session, client = remembered
    release(user=session.user, session_id=session.pk)
    from_memory = submit(client, session)
    refused_payload = submit(client, session, analog_sequence(6))  # more atoms than the device's 4
    known.clear()
    fresh = submit(client, session)
    assert from_memory.status_code == refused_payload.status_code == fresh.status_code == 403
    assert from_memory.json() == refused_payload.json() == fresh.json()
    assert Job.objects.count() == 1


def test_a_payload_refused_in_a_remembered_session_gets_the_same_400(remembered):
    session, client = remembered
    from_memory = submit(client, session, analog_sequence(6))
    known.clear()
    fresh = submit(client, session, analog_sequence(6))
    assert from_memory.status_code == fresh.status_code == 400
    assert from_memory.json() == fresh.json()
    assert Job.objects.count() == 1


def test_what_one_user_submitted_into_is_not_known_for_another(remembered, member):
    session, _ = remembered
    assert submit(client_of(member), session).status_code == 404
    assert Job.objects.count() == 1


def test_a_session_read_inside_a_transaction_block_is_not_remembered(qpu_pool, emulator, open_session, owner):
    """Rows read inside a transaction may be that transaction's own, which it may change again
    under the same ``xmin``: only a lookup in autocommit (the rows committed) is remembered."""
    session = open_session(qpu_pool, owner)
    with transaction.atomic():
        services.submit_job(user=owner, session_id=session.pk, payload={"sequence": analog_sequence(2)}, shots=1)
    assert known.recall(session.pk, owner.pk, None) is None
    services.submit_job(user=owner, session_id=session.pk, payload={"sequence": analog_sequence(2)}, shots=1)
    assert known.recall(session.pk, owner.pk, None).devices[0].pk == emulator.pk
    assert known.recall(session.pk, owner.pk, "another pool") is None
