"""SPEC §9: the common acquire and release over REST cost at most 4 SQL statements, token
authentication included (transactional tests: no test savepoints inflate the count)."""

import pytest
from rest_framework.test import APIClient

from apps.sessions.models import Session, SessionStatus
from tests.conftest import used_token_key

pytestmark = pytest.mark.django_db(transaction=True)

BUDGET = 4


@pytest.fixture
def token_client(owner):
    return APIClient(HTTP_AUTHORIZATION=f"Token {used_token_key(owner)}")


def test_rest_acquire_runs_at_most_four_statements(token_client, private_pool, owner, statement_budget):
    """Token lookup, class + access (+ the pool lock on SQLite), then on PostgreSQL the pool lock
    and the insert-if-it-fits sent at once, in one transaction; on SQLite the insert and the
    others' usage sum (R-SESS-1)."""
    private_pool.groups.first().user_set.add(owner)
    klass = private_pool.classes.get()
    with statement_budget(BUDGET):
        response = token_client.post(
            "/api/v1/sessions/", {"resource_class": klass.pk, "slots": 2, "external_id": "4242"}, format="json"
        )
    assert response.status_code == 201, response.content
    assert Session.objects.get(pk=response.data["id"]).slots == 2


def test_rest_release_runs_at_most_four_statements(token_client, local_pool, owner, open_session, statement_budget):
    """Token lookup, the owner's compare-and-set UPDATE (R-SESS-4), the jobs probe."""
    session = open_session(local_pool, owner)
    with statement_budget(BUDGET):
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
