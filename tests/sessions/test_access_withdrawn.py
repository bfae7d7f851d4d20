"""R-POOL-8 after the fact: a grant withdrawn ends its holder's sessions on the pool (reason
``access``: slots freed, pending jobs cancelled), from every path that withdraws one: the API's
PATCH of the pool's users, a user's groups in the admin, the pool made private, the account
deactivated. Sessions of users who may still use the pool are untouched."""

import json
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import Group

from apps.scheduling.models import Job, JobStatus
from apps.scheduling.services import submit_job
from apps.sessions import tasks
from apps.sessions.models import RevocationReason, Session, SessionStatus
from tests import factories

pytestmark = pytest.mark.django_db

EXAMPLE = json.loads((Path(settings.BASE_DIR) / "examples" / "bell-like-analog.json").read_text())


@pytest.fixture
def private(db):
    """A private pool granted to alice directly, to the group 'lab' (bob), and carol is staff."""
    pool = factories.pool("qpu", public=False)
    factories.device(pool, online=False)  # jobs wait: one stays pending
    alice, bob = factories.user("alice"), factories.user("bob", groups=["lab"])
    carol = factories.user("carol", is_staff=True)
    pool.users.add(alice)
    pool.groups.add(Group.objects.get(name="lab"))
    return pool, alice, bob, carol


def ended(session) -> str | None:
    session.refresh_from_db()
    return session.revocation_reason if session.status == SessionStatus.REVOKED else None


def test_a_user_removed_from_a_pools_users_loses_their_session_and_its_pending_job(
    private, api, staff, django_capture_on_commit_callbacks
):
    pool, alice, bob, carol = private
    mine, others = factories.session(pool, alice), factories.session(pool, bob)
    job = submit_job(user=alice, session_id=mine.pk, payload=EXAMPLE["payload"], shots=10)
    with django_capture_on_commit_callbacks(execute=True):
        response = api(staff).patch(f"/api/v1/resource-pools/{pool.pk}/", {"users": []}, format="json")
    assert response.status_code == 200, response.content
    assert ended(mine) == RevocationReason.ACCESS and ended(others) is None
    assert Job.objects.get(pk=job.pk).status == JobStatus.CANCELLED
    refused = api(alice).post(f"/api/v1/sessions/{mine.pk}/jobs/", EXAMPLE, format="json")
    assert refused.status_code == 403 and "has ended (revoked, access)" in refused.json()["detail"]


def test_a_user_taken_out_of_the_granted_group_loses_their_session(private, django_capture_on_commit_callbacks):
    pool, alice, bob, carol = private
    session = factories.session(pool, bob)
    with django_capture_on_commit_callbacks(execute=True):
        Group.objects.get(name="lab").user_set.remove(bob)
    assert ended(session) == RevocationReason.ACCESS


def test_leaving_a_group_from_the_users_side_or_its_deletion_ends_the_sessions_it_granted(
    private, django_capture_on_commit_callbacks
):
    pool, alice, bob, carol = private
    lab = Group.objects.get(name="lab")
    dave = factories.user("dave", groups=["lab"])
    bobs, daves = factories.session(pool, bob), factories.session(pool, dave)
    with django_capture_on_commit_callbacks(execute=True):
        bob.groups.remove(lab)
    assert (ended(bobs), ended(daves)) == (RevocationReason.ACCESS, None)
    with django_capture_on_commit_callbacks(execute=True):
        lab.delete()
    assert ended(daves) == RevocationReason.ACCESS


def test_a_pool_made_private_ends_the_sessions_of_those_it_is_not_granted_to(
    api, staff, django_capture_on_commit_callbacks
):
    pool = factories.pool("qpu", public=True)
    alice, dave, carol = factories.user("alice"), factories.user("dave"), factories.user("carol", is_staff=True)
    pool.users.add(alice)
    kept, lost, staffs = (factories.session(pool, user) for user in (alice, dave, carol))
    with django_capture_on_commit_callbacks(execute=True):
        response = api(staff).patch(f"/api/v1/resource-pools/{pool.pk}/", {"public": False}, format="json")
    assert response.status_code == 200, response.content
    assert (ended(kept), ended(lost), ended(staffs)) == (None, RevocationReason.ACCESS, None)


def test_a_deactivated_or_demoted_account_loses_its_sessions(private, django_capture_on_commit_callbacks):
    pool, alice, bob, carol = private
    public = factories.pool("cpu", public=True)
    on_public, on_private, staff_only = (
        factories.session(public, alice),
        factories.session(pool, alice),
        factories.session(pool, carol),
    )
    with django_capture_on_commit_callbacks(execute=True):
        alice.is_active = False
        alice.save()
        carol.is_staff = False
        carol.save()
    assert ended(on_public) == ended(on_private) == ended(staff_only) == RevocationReason.ACCESS


def test_the_minutely_sweep_ends_what_a_withdrawn_grant_left_running():
    """Should a process die between the change's commit and its revocation, the sessions sweep
    (every minute) ends them."""
    pool = factories.pool("qpu", public=False)
    alice = factories.user("alice")
    pool.users.add(alice)
    session = factories.session(pool, alice)
    pool.users.remove(alice)  # no on-commit callback runs here: as if the process had died
    assert ended(session) is None
    assert tasks.expire_sessions()["access_withdrawn"] == 1
    assert ended(session) == RevocationReason.ACCESS
    assert Session.objects.get(pk=session.pk).status == SessionStatus.REVOKED
