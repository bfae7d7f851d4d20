"""R-POOL-1 … R-POOL-8: each rule gives the same message through full_clean() and the API."""

from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError

from apps.resources.models import ResourceClass, ResourcePool
from tests.conftest import FIRECREST_REMOTE

pytestmark = pytest.mark.django_db


def clean_errors(instance) -> dict:
    with pytest.raises(ValidationError) as info:
        instance.full_clean()
    return info.value.message_dict


def assert_same_rule(model_errors: dict, model_key: str, response, api_key: str | None = None):
    assert response.status_code == 400, response.content
    api_messages = response.json()[api_key or model_key]
    assert model_errors[model_key]
    assert set(model_errors[model_key]) <= set(api_messages)


def pool_body(**overrides):
    body = {"name": "p", "kind": "local", "public": True, "classes": []}
    body.update(overrides)
    return body


# -- R-POOL-1 ------------------------------------------------------------------------------
def test_second_default_pool_is_refused_with_same_message(api, staff, local_pool):
    errors = clean_errors(ResourcePool(name="other", kind="local", public=True, default=True))
    response = api(staff).post("/api/v1/resource-pools/", pool_body(name="other", default=True), format="json")
    assert_same_rule(errors, "default", response)
    assert "already the default pool" in " ".join(errors["default"])
    assert ResourcePool.objects.filter(default=True).count() == 1


@pytest.mark.parametrize(
    "fields",
    [
        {"public": False},
        {"kind": "slurm", "remote": {}},
        {"quota_cpu": 4, "quota_memory": 8},
    ],
)
def test_default_pool_must_be_public_local_without_quota(api, staff, fields):
    pool = ResourcePool(name="d", kind="local", public=True, default=True)
    for key, value in fields.items():
        setattr(pool, key, value)
    errors = clean_errors(pool)
    body = pool_body(name="d", default=True)
    body.update({k: v for k, v in fields.items() if not k.startswith("quota")})
    if "quota_cpu" in fields:
        body["quota"] = {"cpu": 4, "memory": 8}
    response = api(staff).post("/api/v1/resource-pools/", body, format="json")
    assert_same_rule(errors, "default", response)
    assert not ResourcePool.objects.filter(name="d").exists()


# -- R-POOL-2 ------------------------------------------------------------------------------
def test_first_class_of_a_pool_must_be_the_default(api, staff):
    pool = ResourcePool.objects.create(name="p", kind="local", public=True)
    errors = clean_errors(ResourceClass(pool=pool, name="a", cpu=1, memory=1, default=False))
    response = api(staff).post(
        f"/api/v1/resource-pools/{pool.pk}/classes/", {"name": "a", "cpu": 1, "memory": 1}, format="json"
    )
    assert_same_rule(errors, "default", response)
    assert not pool.classes.exists()


def test_unsetting_the_only_default_class_is_refused(api, staff, local_pool):
    small = local_pool.classes.get()
    small.default = False
    errors = clean_errors(small)
    response = api(staff).patch(f"/api/v1/resource-classes/{small.pk}/", {"default": False}, format="json")
    assert_same_rule(errors, "default", response)
    small.refresh_from_db()
    assert small.default


def test_making_a_class_default_demotes_the_previous_default(api, staff, local_pool):
    response = api(staff).post(
        f"/api/v1/resource-pools/{local_pool.pk}/classes/",
        {"name": "big", "cpu": 4, "memory": 8, "default": True},
        format="json",
    )
    assert response.status_code == 201, response.content
    assert list(local_pool.classes.filter(default=True).values_list("name", flat=True)) == ["big"]


def test_default_class_is_deleted_only_last(api, staff, local_pool):
    ResourceClass.objects.create(pool=local_pool, name="medium", cpu=2, memory=4)
    small = local_pool.classes.get(name="small")
    response = api(staff).delete(f"/api/v1/resource-classes/{small.pk}/")
    assert response.status_code == 409
    assert "default class" in response.json()["detail"]
    assert local_pool.classes.count() == 2


def test_inline_classes_need_exactly_one_default(api, staff):
    body = pool_body(classes=[{"name": "a", "cpu": 1, "memory": 1}, {"name": "b", "cpu": 1, "memory": 1}])
    response = api(staff).post("/api/v1/resource-pools/", body, format="json")
    assert response.status_code == 400
    assert "exactly one default class" in str(response.json())
    assert not ResourcePool.objects.filter(name="p").exists()


# -- R-POOL-3 ------------------------------------------------------------------------------
def test_class_larger_than_quota_is_refused(api, staff):
    pool = ResourcePool.objects.create(name="q", kind="local", quota_cpu=4, quota_memory=8, quota_gpu=0)
    errors = clean_errors(ResourceClass(pool=pool, name="big", cpu=8, memory=4, default=True))
    response = api(staff).post(
        f"/api/v1/resource-pools/{pool.pk}/classes/",
        {"name": "big", "cpu": 8, "memory": 4, "default": True},
        format="json",
    )
    assert_same_rule(errors, "cpu", response)
    assert "exceeds the quota" in errors["cpu"][0]


def test_quota_change_must_still_fit_every_class(api, staff):
    pool = ResourcePool.objects.create(name="q", kind="local", quota_cpu=16, quota_memory=64, quota_gpu=0)
    ResourceClass.objects.create(pool=pool, name="big", cpu=8, memory=32, default=True)
    loaded = ResourcePool.objects.get(pk=pool.pk)
    loaded.quota_cpu = Decimal(4)
    errors = clean_errors(loaded)
    response = api(staff).patch(
        f"/api/v1/resource-pools/{pool.pk}/", {"quota": {"cpu": 4, "memory": 64}}, format="json"
    )
    assert_same_rule(errors, "quota_cpu", response, api_key="quota")
    assert "big (8" in errors["quota_cpu"][0]
    pool.refresh_from_db()
    assert pool.quota_cpu == 16


# -- R-POOL-4 ------------------------------------------------------------------------------
def test_slurm_like_class_needs_whole_cpu(api, staff, firecrest_pool):
    errors = clean_errors(ResourceClass(pool=firecrest_pool, name="half", cpu=Decimal("0.5"), memory=1))
    response = api(staff).post(
        f"/api/v1/resource-pools/{firecrest_pool.pk}/classes/",
        {"name": "half", "cpu": 0.5, "memory": 1},
        format="json",
    )
    assert_same_rule(errors, "cpu", response)
    assert "whole number of CPUs" in errors["cpu"][0]


def test_whole_cpu_written_as_decimal_is_stored_as_integer(api, staff, firecrest_pool):
    response = api(staff).post(
        f"/api/v1/resource-pools/{firecrest_pool.pk}/classes/",
        {"name": "two", "cpu": 2.0, "memory": 1},
        format="json",
    )
    assert response.status_code == 201, response.content
    assert response.json()["cpu"] == 2
    assert isinstance(response.json()["cpu"], int)
    assert ResourceClass.objects.get(name="two").cpu == 2


def test_legacy_fractional_cpu_rows_still_read(api, staff, firecrest_pool):
    # A row written before the rule (raw update bypasses clean()) must still be served.
    ResourceClass.objects.filter(pool=firecrest_pool).update(cpu=Decimal("1.5"))
    response = api(staff).get(f"/api/v1/resource-pools/{firecrest_pool.pk}/")
    assert response.status_code == 200
    assert response.json()["classes"][0]["cpu"] == 1.5
    # ... and editing an unrelated pool field does not trip over it.
    response = api(staff).patch(
        f"/api/v1/resource-pools/{firecrest_pool.pk}/",
        {"accessibility_message": "maintenance"},
        format="json",
    )
    assert response.status_code == 200, response.content


# -- R-POOL-5 ------------------------------------------------------------------------------
def test_local_class_with_remote_override_is_refused(api, staff, local_pool):
    errors = clean_errors(ResourceClass(pool=local_pool, name="x", cpu=1, memory=1, remote={"partition": "debug"}))
    response = api(staff).post(
        f"/api/v1/resource-pools/{local_pool.pk}/classes/",
        {"name": "x", "cpu": 1, "memory": 1, "remote": {"partition": "debug"}},
        format="json",
    )
    assert_same_rule(errors, "remote", response)
    assert "Slurm-like" in errors["remote"][0]


def test_system_name_override_only_in_firecrest_pools(api, staff):
    pool = ResourcePool.objects.create(name="s", kind="slurm", remote={"partition": "debug"})
    errors = clean_errors(
        ResourceClass(pool=pool, name="x", cpu=1, memory=1, default=True, remote={"system_name": "eiger"})
    )
    response = api(staff).post(
        f"/api/v1/resource-pools/{pool.pk}/classes/",
        {"name": "x", "cpu": 1, "memory": 1, "default": True, "remote": {"system_name": "eiger"}},
        format="json",
    )
    assert_same_rule(errors, "remote", response)
    assert "system_name is only accepted in firecrest pools" in errors["remote"][0]


def test_unknown_class_override_key_is_refused(firecrest_pool):
    errors = clean_errors(ResourceClass(pool=firecrest_pool, name="x", cpu=1, memory=1, remote={"partitoin": "debug"}))
    assert "unknown key 'partitoin'" in errors["remote"][0]


# -- pool remote validation ------------------------------------------------------------------
@pytest.mark.parametrize(
    "kind, remote, fragment",
    [
        ("firecrest", {"system_name": "daint", "token_uri": "https://a/t"}, "'api_url' is required"),
        ("firecrest", dict(FIRECREST_REMOTE, api_url="http://insecure/v2"), "https URL"),
        ("firecrest", dict(FIRECREST_REMOTE, colour="blue"), "unknown key 'colour'"),
        ("qarnot", {}, "'profile' is required"),
        ("runai", {"base_url": "ftp://x"}, "https URL"),
        ("local", {"partition": "x"}, "local pool takes no remote configuration"),
        ("slurm", {"working_root": "relative/path"}, "absolute path"),
    ],
)
def test_pool_remote_is_validated_per_kind(api, staff, kind, remote, fragment):
    errors = clean_errors(ResourcePool(name="r", kind=kind, remote=remote))
    response = api(staff).post("/api/v1/resource-pools/", pool_body(name="r", kind=kind, remote=remote), format="json")
    assert_same_rule(errors, "remote", response)
    assert fragment in " ".join(errors["remote"])


# -- R-BACK-6: no control characters (nor shell or #SBATCH metacharacters) in a remote value --------
@pytest.mark.parametrize(
    "kind, remote, fragment",
    [
        ("slurm", {"partition": "debug\n#SBATCH --uid=0"}, "control characters"),
        ("slurm", {"account": "proj1 --uid=0"}, "Slurm name"),
        ("slurm", {"partition": "debug\n"}, "control characters"),
        ("slurm", {"partition": "$(id)"}, "Slurm name"),
        ("slurm", {"working_root": "/scratch/a b"}, "no spaces"),
        ("slurm", {"working_root": "/scratch/x\n#SBATCH --uid=0"}, "control characters"),
        ("firecrest", dict(FIRECREST_REMOTE, system_name="daint\r\nHost: evil"), "control characters"),
        ("firecrest", dict(FIRECREST_REMOTE, api_url="https://fc.example.org/v2\n"), "control characters"),
        ("firecrest", dict(FIRECREST_REMOTE, client_id_env="FC_ID\n"), "environment variable name"),
        ("qarnot", {"profile": "docker-batch\x00"}, "control characters"),
        ("runai", {"base_url": "https://r.example.org", "project": "p\tq"}, "control characters"),
    ],
)
def test_r_back_6_control_characters_in_a_pool_remote_are_refused(api, staff, kind, remote, fragment):
    errors = clean_errors(ResourcePool(name="r", kind=kind, remote=remote))
    response = api(staff).post("/api/v1/resource-pools/", pool_body(name="r", kind=kind, remote=remote), format="json")
    assert_same_rule(errors, "remote", response)
    assert fragment in " ".join(errors["remote"])


@pytest.mark.parametrize("partition", ["debug\n#SBATCH --uid=0", "$(id)", "a b", "debug\x1b"])
def test_r_back_6_a_class_partition_override_must_be_a_slurm_name(api, staff, partition):
    pool = ResourcePool.objects.create(name="s", kind="slurm", remote={"partition": "debug"})
    rc = ResourceClass.objects.create(pool=pool, name="n", cpu=1, memory=1, default=True)
    response = api(staff).patch(
        f"/api/v1/resource-classes/{rc.pk}/", {"remote": {"partition": partition}}, format="json"
    )
    assert response.status_code == 400 and "remote" in response.json()
    rc.refresh_from_db()
    assert rc.remote in (None, {})


def test_insecure_remote_url_allowed_for_local_test_doubles(settings):
    settings.GRIDGATE_ALLOW_INSECURE_REMOTES = True
    ResourcePool(
        name="r", kind="firecrest", remote=dict(FIRECREST_REMOTE, api_url="http://127.0.0.1:9000/v2")
    ).full_clean()


# -- R-POOL-7 ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kind, remote, env_hint",
    [
        ("firecrest", dict(FIRECREST_REMOTE, client_secret="s3cr3t"), "client_secret_env"),
        ("qarnot", {"profile": "docker-batch", "token": "abc"}, "token_env"),
        ("runai", {"base_url": "https://runai.example.org", "api_key": "abc"}, "environment variable"),
    ],
)
def test_secrets_in_remote_are_refused_naming_the_env_variable(api, staff, kind, remote, env_hint):
    errors = clean_errors(ResourcePool(name="sec", kind=kind, remote=remote))
    response = api(staff).post(
        "/api/v1/resource-pools/", pool_body(name="sec", kind=kind, remote=remote), format="json"
    )
    assert_same_rule(errors, "remote", response)
    assert env_hint in errors["remote"][0]
    assert "s3cr3t" not in response.content.decode() and "abc" not in response.content.decode()
    assert not ResourcePool.objects.filter(name="sec").exists()


def test_env_variable_names_and_token_uri_are_not_secrets(db):
    ResourcePool(
        name="ok",
        kind="firecrest",
        remote=dict(
            FIRECREST_REMOTE, client_id_env="GRIDGATE_CRED_SITE_ID", client_secret_env="GRIDGATE_CRED_SITE_SECRET"
        ),
    ).full_clean()


# -- R-POOL-8 ------------------------------------------------------------------------------
def test_private_pool_is_invisible_to_outsiders(api, outsider, member, staff, private_pool, local_pool):
    names = lambda user: [p["name"] for p in api(user).get("/api/v1/resource-pools/").json()["results"]]  # noqa: E731
    assert names(outsider) == ["local"]
    assert names(member) == ["local", "qpu"]
    assert names(staff) == ["local", "qpu"]
    assert api(outsider).get(f"/api/v1/resource-pools/{private_pool.pk}/").status_code == 404
    klass = private_pool.classes.get()
    assert api(outsider).get(f"/api/v1/resource-classes/{klass.pk}/").status_code == 404
    assert api(outsider).get(f"/api/v1/resource-classes/{klass.pk}/launch-spec/").status_code == 404
    assert api(member).get(f"/api/v1/resource-classes/{klass.pk}/launch-spec/").status_code == 200


def test_directly_granted_user_sees_private_pool(api, outsider, private_pool):
    private_pool.users.add(outsider)
    assert api(outsider).get(f"/api/v1/resource-pools/{private_pool.pk}/").status_code == 200


def test_a_remote_url_that_cannot_be_parsed_is_400_not_500(api, staff):
    remote = dict(FIRECREST_REMOTE, api_url="https://[fc.example.org/v2")
    errors = clean_errors(ResourcePool(name="r", kind="firecrest", remote=remote))
    response = api(staff).post(
        "/api/v1/resource-pools/", pool_body(name="r", kind="firecrest", remote=remote), format="json"
    )
    assert_same_rule(errors, "remote", response)
