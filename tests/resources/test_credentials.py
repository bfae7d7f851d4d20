"""Staff → SECRET_KEY → root. A pool or device names the variables holding its credentials and the
URL they are sent to; only GRIDGATE_CRED_* variables may be named, and only staff holding the
model's permission write pools, classes and devices."""

import pytest
from django.contrib.auth.models import Permission

from apps.backends.qarnot import QarnotBackend
from apps.resources.models import ResourcePool
from apps.scheduling.drivers.pasqal_qpu import QpuClient, QpuError
from tests.backends.conftest import Listener

pytestmark = pytest.mark.django_db

SETTINGS = ("SECRET_KEY", "DATABASE_URL", "GRIDGATE_REDIS_URL", "QARNOT_TOKEN", "GRIDGATE_CRED_")


@pytest.mark.parametrize("name", SETTINGS)
def test_a_pool_naming_a_service_setting_or_any_unprefixed_variable_is_refused(api, staff, name):
    body = {"name": "q", "kind": "qarnot", "public": True, "remote": {"profile": "docker-batch", "token_env": name}}
    response = api(staff).post("/api/v1/resource-pools/", body, format="json")
    assert response.status_code == 400, response.content
    assert "GRIDGATE_CRED_" in str(response.json()["remote"])
    assert not ResourcePool.objects.filter(name="q").exists()


def test_a_pool_naming_a_credential_variable_is_accepted_and_the_defaults_carry_the_prefix(api, staff):
    body = {"name": "q", "kind": "qarnot", "public": True, "remote": {"profile": "docker-batch"}}
    response = api(staff).post("/api/v1/resource-pools/", body, format="json")
    assert response.status_code == 201, response.content
    assert ResourcePool.objects.get(name="q").remote_config()["token_env"] == "GRIDGATE_CRED_QARNOT_TOKEN"
    body = {"name": "f", "kind": "qarnot", "public": True, "remote": {"profile": "p", "token_env": "GRIDGATE_CRED_Q2"}}
    assert api(staff).post("/api/v1/resource-pools/", body, format="json").status_code == 201


@pytest.fixture
def qpu_pool(db):
    return ResourcePool.objects.create(name="qpu", kind="local", public=True)


def test_a_device_naming_secret_key_is_refused(api, staff, qpu_pool):
    config = {"url": "http://127.0.0.1:9", "auth_header": "Authorization", "auth_env": "SECRET_KEY"}
    body = {"pool": qpu_pool.pk, "name": "qpu", "driver": "pasqal_qpu", "config": config}
    response = api(staff).post("/api/v1/devices/", body, format="json")
    assert response.status_code == 400 and "GRIDGATE_CRED_" in str(response.json()), response.content


def test_a_row_written_before_the_rule_sends_no_setting_anywhere(monkeypatch, settings):
    """The attack itself: a pool (or device) saved before the rule names SECRET_KEY and a URL of
    the attacker's; the service refuses to read the variable, and nothing reaches the listener."""
    settings.GRIDGATE_ALLOW_INSECURE_REMOTES = True
    monkeypatch.setenv("SECRET_KEY", "the-web-process-secret-key-4711")
    pool = ResourcePool.objects.create(name="old", kind="qarnot", public=True, remote={"profile": "p"})
    with Listener() as listener:
        ResourcePool.objects.filter(pk=pool.pk).update(
            # bypasses clean(); a row of before the per-user option: the migration made it "service"
            remote={"profile": "p", "token_env": "SECRET_KEY", "cluster_url": listener.url, "credentials": "service"}
        )
        pool.refresh_from_db()
        checks = {check.name: check for check in QarnotBackend().doctor(pool)}
        assert not checks["credentials"].ok and "GRIDGATE_CRED_" in checks["credentials"].message
        assert "4711" not in checks["credentials"].message
        with pytest.raises(QpuError) as refused:
            QpuClient({"url": listener.url, "auth_header": "Authorization", "auth_env": "SECRET_KEY"})
    assert "GRIDGATE_CRED_" in str(refused.value) and "4711" not in str(refused.value)
    assert listener.seen == []


def test_pool_class_and_device_writes_need_the_model_permission_not_just_staff(
    api, bare_staff, staff, local_pool, qpu_pool
):
    rc = local_pool.classes.get()
    writes = [
        ("post", "/api/v1/resource-pools/", {"name": "n", "kind": "local", "public": True}),
        ("patch", f"/api/v1/resource-pools/{local_pool.pk}/", {"idle_timeout": 120}),
        ("put", f"/api/v1/resource-pools/{local_pool.pk}/accessible/", {"is_accessible": False, "message": "x"}),
        ("post", f"/api/v1/resource-pools/{local_pool.pk}/classes/", {"name": "big", "cpu": 2, "memory": 4}),
        ("patch", f"/api/v1/resource-classes/{rc.pk}/", {"memory": 3}),
        ("post", "/api/v1/devices/", {"pool": qpu_pool.pk, "name": "d", "driver": "fake", "config": {}}),
    ]
    client = api(bare_staff)
    for method, url, body in writes:
        assert getattr(client, method)(url, body, format="json").status_code == 403, (method, url)
    local_pool.refresh_from_db()
    assert local_pool.idle_timeout == 3600 and local_pool.is_accessible and local_pool.classes.count() == 1
    # Reads stay open to staff (and to users, for the pools they may use).
    assert client.get(f"/api/v1/resource-pools/{local_pool.pk}/").status_code == 200
    # The operator fixture holds the permissions: the same creations go through.
    operator = api(staff)
    for method, url, body in writes:
        if method == "post":
            assert operator.post(url, body, format="json").status_code == 201, url


def test_a_pool_write_that_edits_classes_needs_the_class_permissions_too(api, bare_staff, local_pool):
    bare_staff.user_permissions.add(Permission.objects.get(codename="change_resourcepool"))
    client = api(bare_staff)
    url = f"/api/v1/resource-pools/{local_pool.pk}/"
    classes = [{"id": local_pool.classes.get().pk, "memory": 3}]
    assert client.patch(url, {"classes": classes}, format="json").status_code == 403
    assert client.patch(url, {"idle_timeout": 120}, format="json").status_code == 200
