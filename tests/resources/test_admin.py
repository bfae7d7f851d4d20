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
