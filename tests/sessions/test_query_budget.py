"""SPEC §9: the common acquire and release over REST cost at most 4 SQL statements, token
authentication included (transactional tests: no test savepoints inflate the count)."""

import pytest
from django.db import connection
from rest_framework.test import APIClient

from apps.sessions.models import Session, SessionStatus
from tests.conftest import used_token_key

pytestmark = pytest.mark.django_db(transaction=True)

BUDGET = 4


@pytest.fixture
def token_client(owner):
    return APIClient(HTTP_AUTHORIZATION=f"Token {used_token_key(owner)}")


def test_rest_acquire_runs_at_most_four_statements(token_client, private_pool, owner, statement_budget):
    """Token lookup, class + access with the same-job lookup (R-SESS-2), then on PostgreSQL the
    usage row's lock and the insert-if-it-fits in one statement (R-SESS-1; two on SQLite)."""
    private_pool.groups.first().user_set.add(owner)
    klass = private_pool.classes.get()
    with statement_budget(3 if connection.vendor == "postgresql" else BUDGET):
        response = token_client.post(
            "/api/v1/sessions/", {"resource_class": klass.pk, "slots": 2, "external_id": "4242"}, format="json"
        )
    assert response.status_code == 201, response.content
    assert Session.objects.get(pk=response.data["id"]).slots == 2


def test_rest_release_runs_at_most_four_statements(token_client, local_pool, owner, open_session, statement_budget):
    """Token lookup, the owner's compare-and-set UPDATE (R-SESS-4; with the usage row's on
    PostgreSQL), the jobs probe."""
    session = open_session(local_pool, owner)
    with statement_budget(3 if connection.vendor == "postgresql" else BUDGET):
        response = token_client.delete(f"/api/v1/sessions/{session.pk}/")
    assert response.status_code == 204
    session.refresh_from_db()
    assert session.status == SessionStatus.REVOKED


def test_rest_release_of_another_users_session_is_404(local_pool, member, open_session, api):
    session = open_session(local_pool, member)
    outsider = Session._meta.get_field("user").related_model.objects.create_user("nosy")
    assert api(outsider).delete(f"/api/v1/sessions/{session.pk}/").status_code == 404
    session.refresh_from_db()
    assert session.status == SessionStatus.ACTIVE


@pytest.mark.postgres
def test_rest_acquire_with_a_job_id_release_and_submission_cost_the_same_whatever_the_history(
    token_client, local_pool, owner, settings
):
    """Cost independent of history (tests/plans.py), over thousands of ended sessions and
    finished jobs: every statement of an acquire with a
    scheduler job id, its repeat (R-SESS-2), a submission, the release and a refusal."""
    from apps.scheduling.models import Device, PoolQueue
    from tests.plans import assert_history_free, fill_history, sent_statements
    from tests.scheduling.pulser_sequences import analog_sequence

    settings.GRIDGATE_TASKS_EAGER = False
    fill_history(owner, local_pool)
    Device.objects.create(pool=local_pool, name="emu", driver="emulator", config={"max_atoms": 4})
    PoolQueue.objects.update_or_create(pool=local_pool, defaults={"awaiting_work": False})
    body = {"resource_class": local_pool.classes.get().pk, "external_id": "4242.1"}
    job = {"payload": {"sequence": analog_sequence(2)}, "shots": 1}
    answers, sent = [], []
    sent += sent_statements(lambda: answers.append(token_client.post("/api/v1/sessions/", body, format="json")))
    session_id = answers[-1].json()["id"]
    sent += sent_statements(lambda: answers.append(token_client.post("/api/v1/sessions/", body, format="json")))
    for _ in range(2):  # the second from the process's memory of the session
        sent += sent_statements(
            lambda: answers.append(token_client.post(f"/api/v1/sessions/{session_id}/jobs/", job, format="json"))
        )
    sent += sent_statements(lambda: answers.append(token_client.delete(f"/api/v1/sessions/{session_id}/")))
    # A refusal of a full pool, and its probe for due sessions that could make room.
    local_pool.slots_total = 1
    local_pool.save()
    assert token_client.post("/api/v1/sessions/", {"resource_class": body["resource_class"]}).status_code == 201
    sent += sent_statements(lambda: answers.append(token_client.post("/api/v1/sessions/", body, format="json")))
    assert [answer.status_code for answer in answers] == [201, 200, 201, 201, 204, 409]
    assert_history_free(sent)
