"""Sessions API: admission, idempotency, service principals, release/revoke, slots, visibility."""

import pytest

from apps.resources.models import ResourceClass, ResourcePool
from apps.sessions.models import Session

pytestmark = pytest.mark.django_db


@pytest.fixture
def qpu(db, owner):
    pool = ResourcePool.objects.create(name="qpu", kind="local", slots_total=4)
    pool.users.add(owner)
    ResourceClass.objects.create(pool=pool, name="access", cpu=1, memory=1, default=True)
    return pool


def open_session(client, pool, **body):
    return client.post("/api/v1/sessions/", {"resource_class": pool.classes.get().pk, **body}, format="json")


def test_new_session_is_201_with_launch_spec(api, owner, qpu):
    response = open_session(api(owner), qpu, slots=2)
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["user"] == "owner" and body["pool"] == qpu.pk and body["slots"] == 2
    assert body["status"] == "active" and body["launch_spec"]["resources"] == {"cpu": 1, "memory": 1, "gpu": 0}


def test_no_capacity_is_409_with_slots_available(api, owner, qpu):
    assert open_session(api(owner), qpu, slots=3).status_code == 201
    response = open_session(api(owner), qpu, slots=2)
    assert response.status_code == 409
    assert response.json()["slots_available"] == 1
    assert Session.objects.count() == 1


def test_second_identical_request_returns_existing_session(api, owner, qpu):
    """R-SESS-2: the scheduler job identifies the session, whichever alias names it."""
    first = open_session(api(owner), qpu, slots=2, slurm_job_id="4242")
    second = open_session(api(owner), qpu, slots=2, scheduler_job_id="4242")
    assert (first.status_code, second.status_code) == (201, 200)
    assert first.json()["id"] == second.json()["id"]
    assert first.json()["external_id"] == "4242"


def test_same_external_id_with_different_slots_is_409(api, owner, qpu):
    open_session(api(owner), qpu, slots=1, external_id="4242")
    response = open_session(api(owner), qpu, slots=2, external_id="4242")
    assert response.status_code == 409 and "different parameters" in response.json()["detail"]


def test_same_external_id_with_another_class_is_409(api, owner, qpu):
    """R-SESS-2: the same scheduler job asking for another class is another request, not a repeat."""
    first = open_session(api(owner), qpu, external_id="4242")
    large = ResourceClass.objects.create(pool=qpu, name="large", cpu=2, memory=2)
    response = api(owner).post("/api/v1/sessions/", {"resource_class": large.pk, "external_id": "4242"}, format="json")
    assert response.status_code == 409 and "different parameters" in response.json()["detail"]
    assert response.json()["session"] == first.json()["id"]


def test_array_task_ids_are_distinct_sessions(api, owner, qpu):
    a = open_session(api(owner), qpu, external_id="1234.1")
    b = open_session(api(owner), qpu, external_id="1234.2")
    assert (a.status_code, b.status_code) == (201, 201) and a.json()["id"] != b.json()["id"]


def test_released_external_id_may_open_a_new_session(api, owner, qpu):
    first = open_session(api(owner), qpu, external_id="9").json()["id"]
    assert api(owner).delete(f"/api/v1/sessions/{first}/").status_code == 204
    second = open_session(api(owner), qpu, external_id="9")
    assert second.status_code == 201 and second.json()["id"] != first


def test_conflicting_aliases_are_a_400(api, owner, qpu):
    response = open_session(api(owner), qpu, external_id="1", slurm_job_id="2")
    assert response.status_code == 400 and "external_id" in response.json()


@pytest.mark.parametrize("slots", [0, -1, "many"])
def test_bad_slots_are_a_400(api, owner, qpu, slots):
    assert open_session(api(owner), qpu, slots=slots).status_code == 400


def test_quota_admission_refuses_what_does_not_fit(api, owner):
    pool = ResourcePool.objects.create(name="lab", kind="local", public=True, quota_cpu=4, quota_memory=8, quota_gpu=0)
    ResourceClass.objects.create(pool=pool, name="three", cpu=3, memory=2, default=True)
    assert open_session(api(owner), pool).status_code == 201
    response = open_session(api(owner), pool)
    assert response.status_code == 409
    assert "quota" in response.json()["detail"] and response.json()["quota_exceeded"]
    assert Session.objects.count() == 1


def test_class_of_an_invisible_pool_is_refused(api, outsider, qpu):
    response = open_session(api(outsider), qpu)
    assert response.status_code == 400 and "resource_class" in response.json()


def test_user_field_for_someone_else_is_403_without_act_on_behalf(api, owner, member, qpu):
    response = open_session(api(owner), qpu, user="member")
    assert response.status_code == 403
    assert not Session.objects.exists()


def test_service_principal_opens_lists_and_releases_for_a_user(api, owner, service_principal, qpu):
    qpu.users.add(service_principal)  # the plugin can see the pool ...
    client = api(service_principal)
    response = open_session(client, qpu, user="owner", slurm_job_id="55")
    assert response.status_code == 201 and response.json()["user"] == "owner"
    sid = response.json()["id"]
    listed = client.get("/api/v1/sessions/?user=owner&external_id=55").json()
    assert [s["id"] for s in listed["results"]] == [sid]
    assert client.delete(f"/api/v1/sessions/{sid}/").status_code == 204
    assert Session.objects.get(pk=sid).revocation_reason == "released"


def test_service_principal_cannot_open_for_a_user_without_pool_access(api, member, service_principal, qpu):
    qpu.users.add(service_principal)
    response = open_session(api(service_principal), qpu, user="member")
    assert response.status_code == 403 and "may not use pool" in response.json()["detail"]


def test_release_is_idempotent(api, owner, qpu):
    sid = open_session(api(owner), qpu).json()["id"]
    assert api(owner).delete(f"/api/v1/sessions/{sid}/").status_code == 204
    assert api(owner).delete(f"/api/v1/sessions/{sid}/").status_code == 204
    session = Session.objects.get(pk=sid)
    assert (session.status, session.revocation_reason) == ("revoked", "released")


def test_revoke_frees_capacity_at_once(api, owner, staff, qpu):
    sid = open_session(api(owner), qpu, slots=4).json()["id"]
    assert open_session(api(owner), qpu, slots=1).status_code == 409
    response = api(staff).post(f"/api/v1/sessions/{sid}/revoke/")
    assert response.status_code == 200 and response.json()["revocation_reason"] == "manual"
    assert open_session(api(owner), qpu, slots=4).status_code == 201


def test_revoke_is_staff_only(api, owner, qpu):
    sid = open_session(api(owner), qpu).json()["id"]
    assert api(owner).post(f"/api/v1/sessions/{sid}/revoke/").status_code == 403


def test_revoked_session_is_never_reopened(api, owner, staff, qpu):
    sid = open_session(api(owner), qpu, external_id="x").json()["id"]
    api(staff).post(f"/api/v1/sessions/{sid}/revoke/")
    api(owner).delete(f"/api/v1/sessions/{sid}/")
    assert Session.objects.get(pk=sid).revocation_reason == "manual"


def test_outsider_cannot_see_or_release_another_users_session(api, owner, outsider, qpu):
    sid = open_session(api(owner), qpu).json()["id"]
    assert api(outsider).get(f"/api/v1/sessions/{sid}/").status_code == 404
    assert api(outsider).delete(f"/api/v1/sessions/{sid}/").status_code == 404
    assert api(outsider).get("/api/v1/sessions/").json()["count"] == 0
    assert Session.objects.get(pk=sid).status == "active"


def test_staff_sees_all_sessions_with_filters(api, owner, staff, qpu):
    open_session(api(owner), qpu)
    body = api(staff).get(f"/api/v1/sessions/?pool={qpu.pk}&status=active").json()
    assert body["count"] == 1


def test_slots_endpoint_reports_total_used_and_available_slots(api, owner, qpu):
    """R-SESS-6: what external load sensors and a licence sync read; released slots are free."""
    open_session(api(owner), qpu, slots=3)
    released = open_session(api(owner), qpu, slots=1).json()["id"]
    assert api(owner).delete(f"/api/v1/sessions/{released}/").status_code == 204
    assert api(owner).get(f"/api/v1/resource-pools/{qpu.pk}/slots/").json() == {
        "slots_total": 4,
        "slots_used": 3,
        "slots_available": 1,
    }


def test_slots_endpoint_never_reports_fewer_than_zero_available(api, owner, staff, qpu):
    """R-SESS-6: slots_total lowered below what sessions hold (they keep their slots): none available."""
    open_session(api(owner), qpu, slots=3)
    ResourcePool.objects.filter(pk=qpu.pk).update(slots_total=2)
    assert api(owner).get(f"/api/v1/resource-pools/{qpu.pk}/slots/").json() == {
        "slots_total": 2,
        "slots_used": 3,
        "slots_available": 0,
    }


def test_slots_endpoint_is_404_without_slots_total(api, owner, local_pool):
    """R-SESS-6: a pool that counts no slots has nothing to report."""
    assert api(owner).get(f"/api/v1/resource-pools/{local_pool.pk}/slots/").status_code == 404


def test_slots_endpoint_hides_invisible_pools(api, outsider, qpu):
    assert api(outsider).get(f"/api/v1/resource-pools/{qpu.pk}/slots/").status_code == 404


def test_accessible_needs_no_authentication_and_does_not_block_admission(api, owner, staff, qpu):
    """R-SESS-5: only the bool and the message, to anyone who may see the (private) pool without
    a login from a load sensor's network, or to its users; staff set it; a hint, not a gate."""
    api(staff).put(f"/api/v1/resource-pools/{qpu.pk}/accessible/", {"is_accessible": False, "message": "down"})
    assert api(owner).get(f"/api/v1/resource-pools/{qpu.pk}/accessible/").json() == {
        "is_accessible": False,
        "message": "down",
    }
    assert open_session(api(owner), qpu).status_code == 201


def test_idempotency_key_replays_the_first_response(api, owner, qpu):
    client = api(owner)
    headers = {"HTTP_IDEMPOTENCY_KEY": "abc-1"}
    first = client.post("/api/v1/sessions/", {"resource_class": qpu.classes.get().pk}, format="json", **headers)
    again = client.post("/api/v1/sessions/", {"resource_class": qpu.classes.get().pk}, format="json", **headers)
    assert (first.status_code, again.status_code) == (201, 201)
    assert first.json() == again.json() and again["Idempotent-Replayed"] == "true"
    assert Session.objects.count() == 1


def test_idempotency_key_with_a_different_body_is_409(api, owner, qpu):
    client = api(owner)
    headers = {"HTTP_IDEMPOTENCY_KEY": "abc-2"}
    client.post("/api/v1/sessions/", {"resource_class": qpu.classes.get().pk}, format="json", **headers)
    response = client.post(
        "/api/v1/sessions/", {"resource_class": qpu.classes.get().pk, "slots": 2}, format="json", **headers
    )
    assert response.status_code == 409 and "different request" in response.json()["detail"]
    assert Session.objects.count() == 1


def test_idempotency_key_is_per_user(api, owner, staff, qpu):
    headers = {"HTTP_IDEMPOTENCY_KEY": "shared"}
    body = {"resource_class": qpu.classes.get().pk}
    assert api(owner).post("/api/v1/sessions/", body, format="json", **headers).status_code == 201
    assert api(staff).post("/api/v1/sessions/", body, format="json", **headers).status_code == 201


def test_failed_request_does_not_burn_the_idempotency_key(api, owner, qpu):
    client = api(owner)
    headers = {"HTTP_IDEMPOTENCY_KEY": "retry-me"}
    blocker = open_session(client, qpu, slots=4).json()["id"]
    body = {"resource_class": qpu.classes.get().pk, "slots": 2}
    assert client.post("/api/v1/sessions/", body, format="json", **headers).status_code == 409
    client.delete(f"/api/v1/sessions/{blocker}/")
    assert client.post("/api/v1/sessions/", body, format="json", **headers).status_code == 201


def test_deleting_a_pool_with_sessions_is_409_not_500(api, owner, staff, qpu):
    open_session(api(owner), qpu)
    response = api(staff).delete(f"/api/v1/resource-pools/{qpu.pk}/")
    assert response.status_code == 409 and "still in use" in response.json()["detail"]
    assert ResourcePool.objects.filter(pk=qpu.pk).exists()


def test_user_field_does_not_reveal_whether_a_username_exists(api, owner, qpu):
    assert open_session(api(owner), qpu, user="ghost").status_code == 403
    assert open_session(api(owner), qpu, user="owner").status_code == 201  # naming oneself is fine


def test_service_principal_cannot_open_a_session_for_a_deactivated_user(api, owner, service_principal, qpu):
    """A deactivated account has lost its access: QRMI's acquire refused its uid as unknown, but
    the API opened sessions in its name (holding the pool's slots and its allocation)."""
    qpu.users.add(service_principal)
    owner.is_active = False
    owner.save()
    response = open_session(api(service_principal), qpu, user="owner")
    assert response.status_code == 403 and "deactivated" in response.json()["detail"]
    assert not Session.objects.exists()


def test_service_principal_naming_an_unknown_user_gets_400(api, service_principal, qpu):
    qpu.users.add(service_principal)
    response = open_session(api(service_principal), qpu, user="ghost")
    assert response.status_code == 400 and "ghost" in response.json()["user"][0]


def test_quota_refusal_carries_slots_available(api, owner):
    pool = ResourcePool.objects.create(name="lab", public=True, quota_cpu=1, quota_memory=8, quota_gpu=0)
    ResourceClass.objects.create(pool=pool, name="one", cpu=1, memory=1, default=True)
    open_session(api(owner), pool)
    body = open_session(api(owner), pool).json()
    assert "slots_available" in body and body["slots_available"] is None


def test_expired_session_is_not_returned_as_the_existing_one(api, owner, qpu):
    first = open_session(api(owner), qpu, external_id="77").json()["id"]
    Session.objects.filter(pk=first).update(expires_at="2000-01-01T00:00:00Z")
    again = open_session(api(owner), qpu, external_id="77")
    assert again.status_code == 201 and again.json()["id"] != first
    assert Session.objects.get(pk=first).revocation_reason == "max_lifetime"


def test_hidden_pool_ids_cannot_be_probed_through_filters(api, outsider, qpu):
    response = api(outsider).get(f"/api/v1/sessions/?pool={qpu.pk}")
    other = api(outsider).get("/api/v1/sessions/?pool=999999")
    assert response.status_code == other.status_code == 400  # same answer as a pool that does not exist
