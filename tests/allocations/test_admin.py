"""The allocation's admin page: the used figures are the ledger's (a grant's dates moved keep what its period
spent), and an allocation stays on its pool."""

from datetime import datetime, timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from apps.allocations import services
from apps.allocations.models import Allocation, Charge, ChargeKind
from tests import factories
from tests.admin_forms import change_form_data

pytestmark = pytest.mark.django_db


def test_moving_a_grants_start_keeps_what_its_period_was_charged(admin_client, qpu, owner, grant):
    mine = grant(qpu, user=owner, device_seconds=100)
    now = timezone.now()
    charge = Charge(kind=ChargeKind.JOB, allocation=mine, pool=qpu, user=owner, device_seconds=90, charged_at=now)
    services._record([charge], {mine.pk: mine}, now)
    mine.refresh_from_db()
    assert mine.remaining_at(timezone.now())[0] == pytest.approx(10)

    url = reverse("admin:allocations_allocation_change", args=[mine.pk])
    data = change_form_data(admin_client.get(url))
    day = datetime.strptime(data["starts_at_0"], "%Y-%m-%d").date() - timedelta(days=1)
    data["starts_at_0"] = day.isoformat()  # the grant started a day earlier (a typo fixed)
    response = admin_client.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors

    mine = Allocation.objects.get(pk=mine.pk)
    assert mine.starts_at < now - timedelta(hours=24)
    assert mine.remaining_at(timezone.now())[0] == pytest.approx(10)  # the 90 s charged are still spent


def test_the_admin_never_moves_an_allocation_to_another_pool(admin_client, qpu, owner, grant):
    mine = grant(qpu, user=owner, device_seconds=100)
    session = factories.session(qpu, owner)
    assert session.allocation_id == mine.pk
    other = factories.pool("other")
    url = reverse("admin:allocations_allocation_change", args=[mine.pk])
    data = change_form_data(admin_client.get(url)) | {"pool": str(other.pk), "device_seconds": "200"}
    admin_client.post(url, data)
    mine = Allocation.objects.get(pk=mine.pk)
    assert (mine.pool_id, mine.device_seconds) == (qpu.pk, 200)  # the grant stays editable


def _charge_list_queries(admin_client) -> int:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as ctx:
        response = admin_client.get(reverse("admin:allocations_charge_changelist"))
    assert response.status_code == 200
    return len(ctx.captured_queries)


def test_the_ledger_page_costs_the_same_queries_whatever_the_charges_shown(admin_client, qpu, owner, grant):
    """Each row names its allocation as "<name> on <pool>": the pool comes with the row, not one
    query per charge."""
    now = timezone.now()

    def charge(allocation):
        Charge.objects.create(
            kind=ChargeKind.JOB, allocation=allocation, pool=qpu, user=owner, device_seconds=1, charged_at=now
        )

    charge(grant(qpu, user=owner, device_seconds=100, name="first"))
    few = _charge_list_queries(admin_client)
    for i in range(20):
        charge(grant(factories.pool(f"p{i}"), user=owner, device_seconds=100, name=f"project {i}"))
    assert _charge_list_queries(admin_client) == few


def test_a_charged_allocation_stays_with_its_project_and_an_uncharged_one_can_be_given_to_another(
    admin_client, qpu, owner, member, grant
):
    """R-ACCT-1: the usage export reads a charge's group through its allocation, so a charged
    grant given to another group or user in the admin moved past periods' usage with it."""
    from django.contrib.auth.models import Group

    team, other = Group.objects.create(name="team"), Group.objects.create(name="other")
    charged = grant(qpu, name="charged", group=team, device_seconds=100)
    fresh = grant(qpu, name="fresh", group=team, device_seconds=100)
    Charge.objects.create(
        kind=ChargeKind.JOB, allocation=charged, pool=qpu, user=owner, device_seconds=5, charged_at=timezone.now()
    )
    for allocation in (charged, fresh):
        url = reverse("admin:allocations_allocation_change", args=[allocation.pk])
        data = change_form_data(admin_client.get(url)) | {"group": str(other.pk), "device_seconds": "200"}
        assert admin_client.post(url, data).status_code == 302
    charged, fresh = Allocation.objects.get(pk=charged.pk), Allocation.objects.get(pk=fresh.pk)
    assert (charged.group_id, charged.device_seconds) == (team.pk, 200)  # the grant stays editable
    assert fresh.group_id == other.pk  # a typo fixed before anything was charged
