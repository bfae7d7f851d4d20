import pytest

from apps.resources.models import ResourceClass, ResourcePool
from apps.sessions import services
from apps.sessions.models import Session

pytestmark = pytest.mark.django_db


@pytest.fixture
def session(owner):
    pool = ResourcePool.objects.create(name="qpu", kind="local", public=True, slots_total=10)
    klass = ResourceClass.objects.create(pool=pool, name="access", cpu=1, memory=1, default=True)
    return services.admit(user=owner, resource_class=klass, slots=3, external_id="771").session


def test_session_admin_lists_filters_and_searches(admin_client, session):
    for url in [
        "/admin/compute_sessions/session/",
        f"/admin/compute_sessions/session/?pool__id__exact={session.pool_id}&status__exact=active",
        "/admin/compute_sessions/session/?q=771",
        f"/admin/compute_sessions/session/{session.pk}/change/",
    ]:
        response = admin_client.get(url)
        assert response.status_code == 200, url
    assert "771" in admin_client.get("/admin/compute_sessions/session/?q=771").content.decode()


def test_admin_revoke_action_uses_the_service(admin_client, session):
    response = admin_client.post(
        "/admin/compute_sessions/session/",
        {"action": "revoke_sessions", "_selected_action": [str(session.pk)]},
        follow=True,
    )
    assert "Revoked 1 session(s)." in response.content.decode()
    session.refresh_from_db()
    assert (session.status, session.revocation_reason) == ("revoked", "manual")


def test_pool_admin_shows_slots_used(admin_client, session, member):
    # A second class and more sessions (one revoked): counts must not multiply through joins.
    other = ResourceClass.objects.create(pool=session.pool, name="other", cpu=1, memory=1)
    services.admit(user=member, resource_class=other, slots=2)
    ended = services.admit(user=member, resource_class=other, slots=4).session
    services.release(user=ended.user, session_id=ended.pk)
    page = admin_client.get("/admin/resources/resourcepool/").content.decode()
    assert "5 / 10" in page and '<td class="field-class_count">2</td>' in page
    assert "5 / 10" in admin_client.get(f"/admin/resources/resourcepool/{session.pool_id}/change/").content.decode()


def test_sessions_cannot_be_added_by_form(admin_client, session):
    assert admin_client.get("/admin/compute_sessions/session/add/").status_code == 403
    assert Session.objects.count() == 1


def test_an_active_session_is_not_deleted_by_the_admin(admin_client, session):
    """Deleting an active session's row would skip release: the pool's usage would go on counting
    its slots (a new session finds the pool full) and its jobs would go with it. Staff revoke."""
    from apps.resources.models import PoolUsage

    admin_client.post(f"/admin/compute_sessions/session/{session.pk}/delete/", {"post": "yes"})
    admin_client.post(
        "/admin/compute_sessions/session/",
        {"action": "delete_selected", "_selected_action": [str(session.pk)], "post": "yes"},
    )
    assert Session.objects.filter(pk=session.pk, status="active").exists()
    held = sum(Session.objects.active().filter(pool=session.pool).values_list("slots", flat=True))
    assert PoolUsage.objects.get(pool=session.pool).slots_used == held == 3
