"""R-ALLOC-1 visible before spending: the pools page and the session page say what is left of
your project; /metrics has a gauge per allocation."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from apps.allocations.models import Allocation
from apps.metrics.collector import StateCollector

pytestmark = pytest.mark.django_db


def logged_in(user):
    client = Client()
    client.force_login(user)
    return client


def test_pools_page_says_what_is_left_of_your_project(qpu, owner, grant):
    mine = grant(qpu, name="lattice", user=owner, device_seconds=5 * 3600)
    Allocation.objects.filter(pk=mine.pk).update(used_device_seconds=3.8 * 3600, used_period_start=mine.starts_at)
    page = logged_in(owner).get("/").content.decode()
    assert "Your project lattice: 1.2 h of 5.0 h device time left this period" in page


def test_pools_page_says_nothing_without_a_project(qpu, owner, member, grant):
    grant(qpu, name="lattice", user=member, device_seconds=3600)
    assert "Your project" not in logged_in(owner).get("/").content.decode()


def test_session_page_says_what_is_left_of_its_project(qpu, owner, grant, open_session):
    grant(qpu, name="lattice", user=owner, device_seconds=3600)
    session = open_session(qpu, owner)
    page = logged_in(owner).get(f"/sessions/{session.pk}/").content.decode()
    assert "lattice: 1.0 h of 1.0 h device time left this period" in page


def test_metrics_have_a_gauge_per_allocation(qpu, owner, team, grant):
    mine = grant(qpu, name="lattice", user=owner, device_seconds=600)
    grant(qpu, name="cases", group=team, core_hours=10)
    Allocation.objects.filter(pk=mine.pk).update(used_device_seconds=700, used_period_start=mine.starts_at)
    families = {f.name: f for f in StateCollector()._allocations(timezone.now())}

    def sample(name, **labels):
        return [s.value for s in families[name].samples if all(s.labels[k] == v for k, v in labels.items())]

    assert sample("gridgate_allocation_granted", allocation="lattice", resource="device_seconds") == [600]
    assert sample("gridgate_allocation_used", allocation="lattice", resource="device_seconds") == [700]
    assert sample("gridgate_allocation_remaining", allocation="lattice", resource="device_seconds") == [-100]
    assert sample("gridgate_allocation_remaining", allocation="cases", resource="core_hours") == [10]
    assert sample("gridgate_allocation_granted", allocation="cases", resource="device_seconds") == []


def test_utilization_page_breaks_usage_down_per_user_group_and_project_with_csv_links(
    qpu, owner, member, team, grant, staff
):
    from apps.allocations.models import Charge, ChargeKind

    mine = grant(qpu, name="lattice", user=owner, device_seconds=10_000)
    theirs = grant(qpu, name="qsim", group=team, device_seconds=10_000)
    now = timezone.now() - timedelta(hours=2)  # inside the last 24 hours' whole buckets
    Charge.objects.create(
        kind=ChargeKind.JOB, allocation=mine, pool=qpu, user=owner, device_seconds=120, charged_at=now
    )
    Charge.objects.create(
        kind=ChargeKind.JOB, allocation=theirs, pool=qpu, user=member, device_seconds=60, charged_at=now
    )

    page = logged_in(staff).get("/utilization/?period=24h").content.decode()

    assert 'id="usage-user"' in page and 'id="usage-group"' in page and 'id="usage-project"' in page
    assert "lattice" in page and "qsim" in page and "team" in page
    assert "120.0" in page and "60.0" in page
    assert "/api/v1/accounting/usage/?group_by=project" in page and "format=csv" in page


def test_utilization_page_for_one_pool_breaks_down_that_pools_usage_only(qpu, local_pool, owner, member, grant, staff):
    from apps.allocations.models import Charge, ChargeKind

    here = grant(qpu, name="lattice", user=owner, device_seconds=10_000)
    elsewhere = grant(local_pool, name="cluster-project", user=member, core_hours=100)
    now = timezone.now() - timedelta(hours=2)
    Charge.objects.create(
        kind=ChargeKind.JOB, allocation=here, pool=qpu, user=owner, device_seconds=120, charged_at=now
    )
    Charge.objects.create(
        kind=ChargeKind.CASE, allocation=elsewhere, pool=local_pool, user=member, core_hours=3, charged_at=now
    )

    page = logged_in(staff).get(f"/utilization/?period=24h&pool={qpu.pk}").content.decode()

    assert "lattice" in page
    assert "cluster-project" not in page
