"""Per-user readiness of pools: a pool that would refuse this user's work says so and why, on
``GET /resource-pools/`` (``usable``, ``unusable_reason``, ``runs``) and on the pages, where it is
listed after the usable ones and is not offered in the case form. The rules are the launch's own
(R-CASE-8's linked account, per-user credentials), asked without a provider call."""

import pytest
from cryptography.fernet import Fernet
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.credentials.models import RemoteConnection
from apps.qrmi.models import UnixAccount
from apps.resources.models import ResourceClass, ResourcePool
from apps.scheduling.models import Device

pytestmark = pytest.mark.django_db

NOBODY = 65534  # an account every host has


def page(user) -> str:
    client = Client()
    client.force_login(user)
    return client.get("/").content.decode()


def pool_answer(api, user, name) -> dict:
    rows = api(user).get("/api/v1/resource-pools/").json()["results"]
    return next(row for row in rows if row["name"] == name)


@pytest.fixture
def cases_pool(db):
    """A local pool that runs each case as its owner's own Unix account (no sandbox for others)."""
    pool = ResourcePool.objects.create(name="cluster", kind="local", public=True)
    ResourceClass.objects.create(pool=pool, name="small", cpu=1, memory=1, default=True)
    return pool


@pytest.fixture
def qpu(db):
    pool = ResourcePool.objects.create(name="qpu", kind="local", public=True, slots_total=2)
    ResourceClass.objects.create(pool=pool, name="access", cpu=1, memory=1, default=True)
    Device.objects.create(pool=pool, name="emu", driver="emulator", config={"pulser_device": "AnalogDevice"})
    return pool


def test_a_pool_needing_a_linked_account_is_not_usable_by_an_unlinked_user(api, owner, cases_pool):
    answer = pool_answer(api, owner, "cluster")

    assert (answer["usable"], answer["runs"]) == (False, "cases")
    assert "yours is not linked" in answer["unusable_reason"]
    assert "not usable by you</strong> — Pool &#x27;cluster&#x27; runs each case as its owner" in page(owner)


def test_the_same_pool_is_ready_for_a_linked_user(api, owner, cases_pool):
    UnixAccount.objects.create(user=owner, unix_uid=NOBODY)

    answer = pool_answer(api, owner, "cluster")

    assert (answer["usable"], answer["unusable_reason"], answer["runs"]) == (True, None, "cases")
    home = page(owner)
    assert "not usable by you" not in home
    assert "Takes cases (commands run on the Local backend):\n      ready" in home


def test_a_qpu_pool_is_usable_and_takes_jobs(api, owner, qpu):
    assert (pool_answer(api, owner, "qpu")["usable"], pool_answer(api, owner, "qpu")["runs"]) == (True, "jobs")


def test_refusing_pools_come_after_usable_ones_and_are_not_in_the_case_form(
    owner, cases_pool, qpu, local_pool, settings
):
    settings.GRIDGATE_SANDBOX_USER = "nobody"
    local_pool.sandbox_unlinked = True  # unlinked users run as the sandbox account: usable
    local_pool.save()

    home = page(owner)

    order = [home.index(f'id="pool-{pool.pk}"') for pool in (local_pool, qpu, cases_pool)]
    assert order == sorted(order)  # "cluster" sorts first by name, but refuses: last
    assert home.index("Pools that would refuse your work") < order[2]
    client = Client()
    client.force_login(owner)
    form = client.get("/cases/").content.decode()
    assert "local/small" in form and "cluster/small" not in form


def test_a_per_user_credentials_pool_needs_the_users_connection(api, owner, settings):
    settings.GRIDGATE_CREDENTIALS_KEY = [Fernet.generate_key().decode()]
    pool = ResourcePool(name="qarnot", kind="qarnot", public=True, remote={"profile": "docker-batch"})
    pool.full_clean()
    pool.save()
    ResourceClass.objects.create(pool=pool, name="4c", cpu=4, memory=8, default=True)

    refused = pool_answer(api, owner, "qarnot")
    assert refused["usable"] is False and "connect it first at /connections/" in refused["unusable_reason"]

    RemoteConnection.objects.create(user=owner, pool=pool, sealed_secret="x", connected_at=timezone.now())
    assert pool_answer(api, owner, "qarnot")["usable"] is True


def test_the_pool_list_reads_readiness_in_constant_queries(api, owner):
    client = api(owner)

    def queries(n):
        for i in range(n):
            pool = ResourcePool.objects.create(name=f"p{n}-{i}", kind="local", public=True)
            ResourceClass.objects.create(pool=pool, name="c", cpu=1, memory=1, default=True)
        with CaptureQueriesContext(connection) as captured:
            assert client.get("/api/v1/resource-pools/").status_code == 200
        return len(captured)

    assert queries(2) == queries(6)


def test_a_pool_missing_what_its_backend_needs_says_so_before_anyone_launches(settings, monkeypatch, tmp_path):
    """Each backend's ``needs`` (a working directory: Slurm, FirecREST) and ``commands`` (Slurm's
    tools on this host), read without a provider call."""
    from apps.backends.readiness import case_readiness

    settings.GRIDGATE_CASE_BACKENDS = None  # every kind to its own backend
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch here
    slurm = ResourcePool.objects.create(name="hpc", kind="slurm", public=True)
    assert "no working directory on the cluster" in case_readiness(slurm).message
    slurm.remote = {"working_root": "/scratch/gridgate"}
    assert "the cluster's tools are not installed here" in case_readiness(slurm).message
    for tool in ("sbatch", "squeue", "scancel"):
        (tmp_path / tool).write_text("#!/bin/sh\n")
        (tmp_path / tool).chmod(0o755)
    assert case_readiness(slurm).ready
    firecrest = ResourcePool(name="fc", kind="firecrest", remote={"credentials": "service"})
    monkeypatch.setenv("GRIDGATE_CRED_FIRECREST_CLIENT_ID", "x")
    monkeypatch.setenv("GRIDGATE_CRED_FIRECREST_CLIENT_SECRET", "y")
    assert "no working directory on the cluster" in case_readiness(firecrest).message
