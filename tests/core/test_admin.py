"""Admin pages for stuck coordination state: leases, idempotency keys, pool queues."""

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.core.models import IdempotencyKey, Lease, WorkerHeartbeat
from apps.resources.models import ResourcePool
from apps.scheduling.models import Device, PoolQueue

pytestmark = pytest.mark.django_db


def test_lease_admin_lists_filters_and_expires_a_stuck_lease(admin_client):
    stuck = Lease.objects.create(
        name="cases.passes", owner="dead-worker", expires_at=timezone.now() + timedelta(hours=1)
    )
    for url in ["/admin/core/lease/", "/admin/core/lease/?held=yes", "/admin/core/lease/?q=dead"]:
        response = admin_client.get(url)
        assert response.status_code == 200 and "dead-worker" in response.content.decode(), url
    assert "dead-worker" not in admin_client.get("/admin/core/lease/?held=no").content.decode()
    response = admin_client.post(
        "/admin/core/lease/", {"action": "expire_now", "_selected_action": [stuck.pk]}, follow=True
    )
    assert "1 lease(s) expired" in response.content.decode()
    stuck.refresh_from_db()
    assert stuck.expires_at <= timezone.now()
    assert admin_client.get("/admin/core/lease/add/").status_code == 403


def test_worker_heartbeat_admin_lists_hosts_and_deletes_a_retired_one(admin_client):
    """A retired host's heartbeat would keep the "worker dead" alert firing."""
    WorkerHeartbeat.objects.create(name="retired-host", seen_at=timezone.now() - timedelta(days=3))
    response = admin_client.get("/admin/core/workerheartbeat/")
    assert response.status_code == 200 and "retired-host" in response.content.decode()
    admin_client.post("/admin/core/workerheartbeat/retired-host/delete/", {"post": "yes"})
    assert not WorkerHeartbeat.objects.filter(name="retired-host").exists()
    assert admin_client.get("/admin/core/workerheartbeat/add/").status_code == 403


def test_idempotency_key_admin_shows_stuck_keys_and_releases_only_unanswered_ones(admin_client, owner):
    past = timezone.now() - timedelta(minutes=5)
    stuck = IdempotencyKey.objects.create(user=owner, key="stuck-1", fingerprint="x", locked_until=past)
    answered = IdempotencyKey.objects.create(
        user=owner, key="done-1", fingerprint="y", response_status=201, response_body={"id": 1}
    )
    page = admin_client.get("/admin/core/idempotencykey/?state=stuck").content.decode()
    assert "stuck-1" in page and "done-1" not in page
    assert admin_client.get(f"/admin/core/idempotencykey/{answered.pk}/change/").status_code == 200
    response = admin_client.post(
        "/admin/core/idempotencykey/",
        {"action": "release_in_flight", "_selected_action": [stuck.pk, answered.pk]},
        follow=True,
    )
    assert "1 in-flight key(s) released" in response.content.decode()
    assert list(IdempotencyKey.objects.values_list("key", flat=True)) == ["done-1"]


def test_pool_queue_admin_lists_queues_with_their_waiting_jobs(admin_client, owner, open_session):
    from apps.resources.models import ResourceClass
    from apps.scheduling import services

    pool = ResourcePool.objects.create(name="qpu", public=True, slots_total=4)
    ResourceClass.objects.create(pool=pool, name="access", cpu=1, memory=1, default=True)
    Device.objects.create(pool=pool, name="parked", driver="fake", online=False)  # R-DEV-1: a pool that runs jobs
    services.submit_job(user=owner, session_id=open_session(pool, owner).pk, payload={"sequence": "{}"}, shots=1)
    PoolQueue.objects.get_or_create(pool=pool)
    response = admin_client.get("/admin/scheduling/poolqueue/?q=qpu")
    assert response.status_code == 200
    assert "qpu" in response.content.decode()
    assert admin_client.get("/admin/scheduling/poolqueue/add/").status_code == 403


def test_every_admin_bulk_action_names_the_permission_it_needs():
    """Django offers an action without ``permissions`` to every staff user who may view the list:
    each of ours changes something, so each must name the permission it needs."""
    from django.contrib import admin

    unguarded = []
    for model, model_admin in admin.site._registry.items():
        for function, name, _description in model_admin._get_base_actions():
            if not getattr(function, "allowed_permissions", None):
                unguarded.append(f"{model._meta.label}.{name}")
    assert unguarded == []
