"""Pool and class endpoints: permissions, matching, accessibility, pagination, query counts."""

import ipaddress

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.resources.models import ResourceClass, ResourcePool

pytestmark = pytest.mark.django_db


def test_non_staff_writes_are_forbidden(api, member, local_pool):
    klass = local_pool.classes.get()
    client = api(member)
    assert client.post("/api/v1/resource-pools/", {"name": "x", "kind": "local"}, format="json").status_code == 403
    assert client.patch(f"/api/v1/resource-pools/{local_pool.pk}/", {"public": False}, format="json").status_code == 403
    assert client.delete(f"/api/v1/resource-pools/{local_pool.pk}/").status_code == 403
    assert (
        client.post(
            f"/api/v1/resource-pools/{local_pool.pk}/classes/",
            {"name": "y", "cpu": 1, "memory": 1},
            format="json",
        ).status_code
        == 403
    )
    assert client.patch(f"/api/v1/resource-classes/{klass.pk}/", {"cpu": 2}, format="json").status_code == 403
    assert (
        client.put(f"/api/v1/resource-pools/{local_pool.pk}/accessible/", {"is_accessible": False}).status_code == 403
    )
    local_pool.refresh_from_db()
    assert local_pool.public and local_pool.is_accessible


def test_anonymous_requests_are_unauthorized(api, local_pool):
    assert api(None).get("/api/v1/resource-pools/").status_code == 401


def test_staff_creates_pool_with_classes_quota_and_grants(api, staff, member):
    response = api(staff).post(
        "/api/v1/resource-pools/",
        {
            "name": "gpu",
            "kind": "slurm",
            "public": False,
            "quota": {"cpu": 64, "memory": 512, "gpu": 8},
            "remote": {"partition": "gpu", "working_root": "/scratch/gg"},
            "slots_total": 4,
            "strategy": "fifo",
            "users": ["member"],
            "classes": [
                {"name": "a100", "cpu": 16, "memory": 128, "gpu": 1, "default": True},
                {
                    "name": "a100x4",
                    "cpu": 64,
                    "memory": 512,
                    "gpu": 4,
                    "remote": {"forward_resource_values": True},
                },
            ],
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["quota"] == {"cpu": 64, "memory": 512, "gpu": 8}
    assert body["users"] == ["member"] and body["slots_total"] == 4
    assert [c["name"] for c in body["classes"]] == ["a100", "a100x4"]
    assert api(member).get(f"/api/v1/resource-pools/{body['id']}/").status_code == 200


def test_unknown_user_in_grants_is_a_400(api, staff):
    response = api(staff).post(
        "/api/v1/resource-pools/", {"name": "x", "kind": "local", "users": ["ghost"]}, format="json"
    )
    assert response.status_code == 400 and "users" in response.json()


def test_duplicate_pool_name_is_a_400_keyed_by_name(api, staff, local_pool):
    response = api(staff).post("/api/v1/resource-pools/", {"name": "local", "kind": "local"}, format="json")
    assert response.status_code == 400 and "name" in response.json()


def test_matching_marks_classes_that_satisfy_the_request(api, member, local_pool):
    ResourceClass.objects.create(pool=local_pool, name="big", cpu=8, memory=32, gpu=1)
    results = api(member).get("/api/v1/resource-pools/?cpu=2&memory=4&gpu=1").json()["results"]
    matching = {c["name"]: c["matching"] for c in results[0]["classes"]}
    assert matching == {"big": True, "small": False}


def test_matching_rejects_non_numbers(api, member, local_pool):
    response = api(member).get("/api/v1/resource-pools/?cpu=lots")
    assert response.status_code == 400 and "cpu" in response.json()


def test_class_kind_is_derived_from_the_pool(api, member, firecrest_pool):
    klass = api(member).get(f"/api/v1/resource-pools/{firecrest_pool.pk}/classes/").json()[0]
    assert klass["kind"] == "firecrest"


def test_accessible_is_readable_without_authentication(api, local_pool):
    response = api(None).get(f"/api/v1/resource-pools/{local_pool.pk}/accessible/")
    assert response.status_code == 200
    assert response.json() == {"is_accessible": True, "message": ""}


def test_a_private_pools_accessible_is_404_unless_its_user_or_a_load_sensor_asks(
    api, private_pool, member, outsider, settings
):
    """F11: a private pool's accessibility answered anyone, naming the pool's state to people
    who may not know it exists. Now its users (and staff) and GRIDGATE_LOAD_SENSOR_NETWORKS only."""
    url = f"/api/v1/resource-pools/{private_pool.pk}/accessible/"
    assert api(None).get(url).status_code == 404
    assert api(outsider).get(url).status_code == 404
    assert api(member).get(url).status_code == 200
    settings.GRIDGATE_LOAD_SENSOR_NETWORKS = (ipaddress.ip_network("10.20.0.0/24"),)
    assert api(None).get(url, REMOTE_ADDR="10.20.0.5").status_code == 200
    assert api(None).get(url, REMOTE_ADDR="10.21.0.5").status_code == 404


def test_accessible_ignores_a_bad_token_on_get(local_pool):
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token not-a-token")
    assert client.get(f"/api/v1/resource-pools/{local_pool.pk}/accessible/").status_code == 200


def test_staff_sets_accessibility(api, staff, private_pool):
    response = api(staff).put(
        f"/api/v1/resource-pools/{private_pool.pk}/accessible/",
        {"is_accessible": False, "message": "QPU calibration until 14:00"},
        format="json",
    )
    assert response.status_code == 200
    assert api(staff).get(f"/api/v1/resource-pools/{private_pool.pk}/accessible/").json() == {
        "is_accessible": False,
        "message": "QPU calibration until 14:00",
    }


def test_pagination_is_deterministic_and_bounded(api, staff):
    ResourcePool.objects.bulk_create([ResourcePool(name=f"p{i:03d}", public=True) for i in range(30)])
    client = api(staff)
    first = client.get("/api/v1/resource-pools/?page_size=10").json()
    second = client.get("/api/v1/resource-pools/?page_size=10&page=2").json()
    assert first["count"] == 30 and first["next"] and first["previous"] is None
    assert [p["name"] for p in first["results"]] == [f"p{i:03d}" for i in range(10)]
    assert [p["name"] for p in second["results"]] == [f"p{i:03d}" for i in range(10, 20)]
    assert len(client.get("/api/v1/resource-pools/?page_size=100000").json()["results"]) == 30


def test_bad_page_is_404_not_500(api, staff, local_pool):
    assert api(staff).get("/api/v1/resource-pools/?page=99").status_code == 404


def test_pool_list_query_count_does_not_grow_with_pools(api, member):
    def count_queries():
        with CaptureQueriesContext(connection) as ctx:
            assert api(member).get("/api/v1/resource-pools/?page_size=500").status_code == 200
        return len(ctx)

    def add_pools(start, n):
        for i in range(start, start + n):
            pool = ResourcePool.objects.create(name=f"pool{i}", public=True)
            ResourceClass.objects.create(pool=pool, name="c", cpu=1, memory=1, default=True)

    add_pools(0, 2)
    few = count_queries()
    add_pools(2, 20)
    assert count_queries() == few


def test_malformed_json_body_is_400(api, staff):
    response = api(staff).generic("POST", "/api/v1/resource-pools/", "{not json", content_type="application/json")
    assert response.status_code == 400


def test_deleting_a_pool_removes_its_classes(api, staff, local_pool):
    assert api(staff).delete(f"/api/v1/resource-pools/{local_pool.pk}/").status_code == 204
    assert not ResourceClass.objects.exists()


def test_grants_are_shown_to_staff_only(api, member, staff, private_pool):
    private_pool.users.add(member)
    as_member = api(member).get(f"/api/v1/resource-pools/{private_pool.pk}/").json()
    as_staff = api(staff).get(f"/api/v1/resource-pools/{private_pool.pk}/").json()
    assert (as_member["users"], as_member["groups"]) == ([], [])
    assert as_staff["users"] == ["member"] and as_staff["groups"] == ["qpu-users"]


def test_a_pools_grants_are_listed_by_name(api, staff, private_pool, django_user_model):
    """The database returns a pool's grants in no set order: one pool read twice could list them
    differently."""
    from django.contrib.auth.models import Group

    private_pool.users.set([django_user_model.objects.create_user(name) for name in ("zoe", "amy")])
    private_pool.groups.set([Group.objects.create(name=name) for name in ("zeta", "alpha")])
    seen = api(staff).get(f"/api/v1/resource-pools/{private_pool.pk}/").json()
    assert seen["users"] == ["amy", "zoe"] and seen["groups"] == ["alpha", "zeta"]


def test_demo_refuses_to_run_without_debug_and_keeps_existing_passwords(settings, db):
    from django.contrib.auth import get_user_model
    from django.core.management import CommandError, call_command

    settings.DEBUG = False
    with pytest.raises(CommandError, match="DEBUG=true"):
        call_command("demo")
    user = get_user_model().objects.create_user("admin", password="a-real-password")
    call_command("demo", "--force")
    user.refresh_from_db()
    assert user.check_password("a-real-password") and not user.is_superuser


def test_a_pool_patch_with_part_of_a_quota_merges_it_into_the_current_one(api, staff):
    """`{"quota": {"memory": 4}}` was a KeyError 500: it changes the memory and keeps the rest."""
    pool = ResourcePool.objects.create(name="q", kind="local", quota_cpu=8, quota_memory=16, quota_gpu=2)
    response = api(staff).patch(f"/api/v1/resource-pools/{pool.pk}/", {"quota": {"memory": 4}}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["quota"] == {"cpu": 8, "memory": 4, "gpu": 2}
    pool.refresh_from_db()
    assert (pool.quota_cpu, pool.quota_memory, pool.quota_gpu) == (8, 4, 2)


def test_part_of_a_quota_on_a_pool_without_one_is_400_naming_what_is_missing(api, staff):
    pool = ResourcePool.objects.create(name="q", kind="local")
    response = api(staff).patch(f"/api/v1/resource-pools/{pool.pk}/", {"quota": {"memory": 4}}, format="json")
    assert response.status_code == 400, response.content
    assert set(response.json()["quota"]) == {"cpu"}
    pool.refresh_from_db()
    assert pool.quota is None
