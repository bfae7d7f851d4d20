"""Saving a licence state's page (every field read-only: the sync writes them) never writes back
what the sync recorded meanwhile."""

import pytest
from django.urls import reverse

from apps.licences.admin import LicenceStateAdmin
from apps.licences.models import LicenceState
from tests import factories
from tests.admin_forms import change_form_data

pytestmark = pytest.mark.django_db


def test_saving_a_licence_states_page_never_forgets_a_slurm_reservation_the_sync_made(admin_client, monkeypatch):
    pool = factories.pool("qpu-licensed", slots_total=4)
    state, _ = LicenceState.objects.update_or_create(
        pool=pool, defaults={"licence": "qpu@slurmdb", "count": 1, "reservations": ["gg-1"]}
    )
    url = reverse("admin:licences_licencestate_change", args=[state.pk])
    data = change_form_data(admin_client.get(url))
    original = LicenceStateAdmin.save_form

    def save_form(self, request, form, change):  # the sync creates a Slurm reservation between read and save
        obj = original(self, request, form, change)
        LicenceState.objects.filter(pk=obj.pk).update(count=2, reservations=["gg-1", "gg-2"])
        return obj

    monkeypatch.setattr(LicenceStateAdmin, "save_form", save_form)
    response = admin_client.post(url, data)
    assert response.status_code == 302
    state.refresh_from_db()
    # Forgotten, gg-2 would never be removed from Slurm when its window ends or is cancelled.
    assert (state.count, state.reservations) == (2, ["gg-1", "gg-2"])
