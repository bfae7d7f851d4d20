"""Rolling windows saved longer than a century before the form refused them (a year in seconds
typed as days) are clamped to a century by the upgrade: the allocation list, the API, admission
and the dispatcher read their period again instead of answering 500 (OverflowError)."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.urls import reverse
from django.utils import timezone

from apps.allocations.models import MAX_WINDOW_DAYS, Allocation
from apps.scheduling import passes, services

BEFORE = [("allocations", "0002_charges_protect_their_pool_and_allocation")]


@pytest.fixture
def migrated_from_before_the_clamp():
    """The allocations tables as they were before the clamp (no constraint on the window); the
    test then stores its rows and calls the returned function to upgrade."""
    executor = MigrationExecutor(connection)
    latest = [key for key in executor.loader.graph.leaf_nodes() if key[0] == "allocations"]
    executor.migrate(BEFORE)

    def upgrade():
        executor.loader.build_graph()
        executor.migrate(latest)

    yield upgrade
    upgrade()  # the next tests find the schema as migrated


@pytest.mark.django_db(transaction=True)
def test_a_stored_window_past_the_calendars_end_is_clamped_and_reads_again(
    migrated_from_before_the_clamp, qpu, owner, member, grant, open_session, admin_client, api
):
    typo = grant(qpu, user=owner, device_seconds=1_000, period="rolling", ends_at=None, window_days=30)
    Allocation.objects.filter(pk=typo.pk).update(window_days=31_536_000)  # as saved before the form refused it
    kept = grant(qpu, user=member, period="rolling", ends_at=None, window_days=30, device_seconds=9)

    migrated_from_before_the_clamp()

    assert admin_client.get(reverse("admin:allocations_allocation_changelist")).status_code == 200
    assert admin_client.get(reverse("admin:allocations_allocation_change", args=[typo.pk])).status_code == 200
    assert api(owner).get("/api/v1/allocations/").status_code == 200
    session = open_session(qpu, owner)  # admission reads the grant's period
    assert session.allocation_id == typo.pk
    job = services.submit_job(user=owner, session_id=session.pk, payload={}, shots=1)
    assert passes.dispatch_once(qpu.pk) == job  # the dispatcher's allocation check reads it too
    typo.refresh_from_db()
    assert typo.window_days == MAX_WINDOW_DAYS
    assert typo.period_at(timezone.now())[0] == typo.starts_at  # still its first window, where it spends
    assert Allocation.objects.get(pk=kept.pk).window_days == 30
