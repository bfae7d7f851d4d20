"""The admin: pool with classes inline, same rules and messages as the API."""

import pytest

from apps.resources.models import ResourcePool
from tests.conftest import FIRECREST_REMOTE

pytestmark = pytest.mark.django_db


def inline_data(classes, initial=0, prefix="classes"):
    data = {
        f"{prefix}-TOTAL_FORMS": str(len(classes)),
        f"{prefix}-INITIAL_FORMS": str(initial),
        f"{prefix}-MIN_NUM_FORMS": "0",
        f"{prefix}-MAX_NUM_FORMS": "1000",
    }
    for i, fields in enumerate(classes):
        for key, value in fields.items():
            data[f"{prefix}-{i}-{key}"] = value
    return data


def pool_form(**fields):
    """The pool change form, with the empty management form of the devices inline that the
    scheduling app adds to the same page."""
    data = inline_data([], prefix="devices") | {
        "name": "lab",
        "kind": "local",
        "remote": "{}",
        "strategy": "weighted_fair",
        "share_by": "user",
        "usage_half_life": "86400",
        "idle_timeout": "3600",
        "max_lifetime": "2592000",
        "is_accessible": "on",
        "accessibility_message": "",
    }
    data.update(fields)
    return data


CLASS = {
    "name": "c1",
    "cpu": "1",
    "memory": "2",
    "gpu": "0",
    "max_storage": "1",
    "default_storage": "1",
    "max_tasks": "512",
    "wall_time": "86400",
    "max_wall_time": "604800",
}


def test_admin_pages_render(admin_client, local_pool, firecrest_pool):
    for url in [
        "/admin/resources/resourcepool/",
        f"/admin/resources/resourcepool/{local_pool.pk}/change/",
        "/admin/resources/resourcepool/add/",
        "/admin/resources/resourceclass/",
        f"/admin/resources/resourceclass/{firecrest_pool.classes.get().pk}/change/",
    ]:
        assert admin_client.get(url).status_code == 200, url


def test_admin_creates_pool_with_inline_default_class(admin_client):
    data = pool_form() | inline_data([dict(CLASS, default="on")])
    response = admin_client.post("/admin/resources/resourcepool/add/", data)
    assert response.status_code == 302, response.content.decode()[:2000]
    assert ResourcePool.objects.get(name="lab").classes.get().default


def test_admin_refuses_class_set_without_default_with_the_api_message(admin_client):
    data = pool_form() | inline_data([CLASS])
    response = admin_client.post("/admin/resources/resourcepool/add/", data)
    assert response.status_code == 200
    assert "needs exactly one default class" in response.content.decode()
    assert not ResourcePool.objects.filter(name="lab").exists()


def test_admin_refuses_secret_in_remote(admin_client):
    data = pool_form(kind="qarnot", remote='{"profile": "docker-batch", "token": "abc"}') | inline_data([])
    response = admin_client.post("/admin/resources/resourcepool/add/", data)
    assert response.status_code == 200
    assert "token_env" in response.content.decode()


def test_admin_changes_kind_and_fixes_classes_in_one_save(admin_client):
    pool = ResourcePool.objects.create(name="lab", kind="local")
    klass = pool.classes.create(name="half", cpu="0.5", memory=1, default=True)
    import json

    base = pool_form(kind="firecrest", remote=json.dumps(FIRECREST_REMOTE))
    refused = base | inline_data([dict(CLASS, id=str(klass.pk), name="half", cpu="0.5", default="on")], initial=1)
    response = admin_client.post(f"/admin/resources/resourcepool/{pool.pk}/change/", refused)
    assert response.status_code == 200
    assert "need a whole number of CPUs (got 0.5)" in response.content.decode()
    pool.refresh_from_db()
    assert pool.kind == "local"

    fixed = base | inline_data([dict(CLASS, id=str(klass.pk), name="half", cpu="1", default="on")], initial=1)
    response = admin_client.post(f"/admin/resources/resourcepool/{pool.pk}/change/", fixed)
    assert response.status_code == 302, response.content.decode()[:3000]
    pool.refresh_from_db()
    assert pool.kind == "firecrest" and pool.classes.get().cpu == 1


def test_an_operator_without_class_permissions_cannot_change_a_pool_past_its_classes(client, api):
    """R-POOL-3/6 for staff who hold the pool's permissions but not the classes': Django leaves the
    classes inline off their page, and with it the only check of the class-dependent rules, so the
    admin saved a kind or a quota the stored classes do not fit; the API's PATCH refuses it them."""
    from django.contrib.auth.models import Permission

    from tests import factories
    from tests.admin_forms import change_form_data

    operator = factories.user("pools-only", is_staff=True)
    operator.user_permissions.set(Permission.objects.filter(codename__in=["view_resourcepool", "change_resourcepool"]))
    pool = factories.pool("lab", cpu="0.5", memory=4)
    client.force_login(operator)
    url = f"/admin/resources/resourcepool/{pool.pk}/change/"
    for change, body, message in [
        ({"kind": "slurm"}, {"kind": "slurm"}, "classes with a fractional cpu: access (cpu 0.5)"),
        ({"quota_cpu": "0.1", "quota_memory": "1"}, {"quota": {"cpu": "0.1", "memory": 1}}, "no longer fits"),
    ]:
        response = client.post(url, change_form_data(client.get(url)) | change)
        assert response.status_code == 200 and message in response.content.decode(), change
        refused = api(operator).patch(f"/api/v1/resource-pools/{pool.pk}/", body, format="json")
        assert refused.status_code == 400 and message in str(refused.json()), refused.json()
    pool.refresh_from_db()
    assert (pool.kind, pool.quota_cpu, pool.quota_memory) == ("local", None, None)


def test_a_default_class_the_admin_refuses_to_delete_is_neither_reported_nor_logged_deleted(admin_client, api, staff):
    """R-POOL-2: the default class goes last (the API's DELETE is a 409). The class page and the
    list's "delete selected" kept it, with the refusal, but Django had already logged the deletion
    in the class's history and then said "deleted successfully"."""
    from django.contrib.admin.models import LogEntry

    from tests import factories

    pool = factories.pool("lab")
    factories.resource_class(pool, "big", cpu=2, memory=2)
    default = pool.classes.get(default=True)
    assert api(staff).delete(f"/api/v1/resource-classes/{default.pk}/").status_code == 409
    for response in [
        admin_client.post(f"/admin/resources/resourceclass/{default.pk}/delete/", {"post": "yes"}, follow=True),
        admin_client.post(
            "/admin/resources/resourceclass/",
            {"action": "delete_selected", "_selected_action": [str(default.pk)], "post": "yes"},
            follow=True,
        ),
    ]:
        said = [str(message) for message in response.context["messages"]]
        assert len(said) == 1 and said[0].startswith("Not deleted: 'access' is the default class"), said
    assert pool.classes.filter(pk=default.pk).exists()
    assert not LogEntry.objects.exists()
