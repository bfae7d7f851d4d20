"""Allocation periods at the edges of the calendar: a rolling window of days that no date can
end (an operator typing seconds into ``window_days``) is refused with a form error, never saved
to answer 500 on every page, the API and the dispatcher that read the grant's period."""

import pytest
from django.urls import reverse

from apps.allocations.models import Allocation
from tests.admin_forms import change_form_data

pytestmark = pytest.mark.django_db


def test_a_rolling_window_past_the_calendars_end_is_a_form_error(admin_client, qpu, owner, grant):
    mine = grant(qpu, user=owner, device_seconds=100)
    url = reverse("admin:allocations_allocation_change", args=[mine.pk])
    # 31 536 000: a year in seconds, typed as days (86 000 years: no date ends that window).
    data = change_form_data(admin_client.get(url)) | {"period": "rolling", "window_days": "31536000"}
    response = admin_client.post(url, data)
    assert response.status_code == 200
    assert "window_days" in response.context["adminform"].form.errors
    mine = Allocation.objects.get(pk=mine.pk)
    assert (mine.period, mine.window_days) == ("fixed", None)
    assert admin_client.get(reverse("admin:allocations_allocation_changelist")).status_code == 200


def test_a_new_grant_with_such_a_window_is_refused_and_the_pages_stay_up(admin_client, qpu, owner, api):
    url = reverse("admin:allocations_allocation_add")
    data = change_form_data(admin_client.get(url)) | {
        "name": "typo",
        "pool": str(qpu.pk),
        "user": str(owner.pk),
        "device_seconds": "3600",
        "period": "rolling",
        "starts_at_0": "2026-11-01",
        "starts_at_1": "00:00:00",
        "window_days": "31536000",
    }
    response = admin_client.post(url, data)
    assert response.status_code == 200
    assert "window_days" in response.context["adminform"].form.errors
    assert not Allocation.objects.filter(name="typo").exists()
    assert admin_client.get(reverse("admin:allocations_allocation_changelist")).status_code == 200
    assert api(owner).get("/api/v1/allocations/").status_code == 200


def test_a_century_long_window_is_still_a_window(admin_client, qpu, owner, grant):
    mine = grant(qpu, user=owner, device_seconds=100)
    url = reverse("admin:allocations_allocation_change", args=[mine.pk])
    data = change_form_data(admin_client.get(url)) | {"period": "rolling", "window_days": "36525"}
    response = admin_client.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert Allocation.objects.get(pk=mine.pk).window_days == 36525
