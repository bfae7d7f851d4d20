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
