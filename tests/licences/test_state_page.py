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


def test_a_licence_state_is_never_deleted_by_hand_but_goes_with_its_pool(
    admin_client, monkeypatch, django_capture_on_commit_callbacks
):
    """The state is the sync's memory of what it made in Slurm. Deleted on its page (or by the
    list's bulk delete), the licence it last pushed was never set to 0 after the pool's licence
    changed, and the Slurm reservations it mirrored were never removed: the next sync started from
    nothing. Deleting the pool takes it, and closes the licence and its reservations."""
    from apps.licences import services as licence_services

    pool = factories.pool("qpu-licensed", slots_total=4)
    state, _ = LicenceState.objects.update_or_create(
        pool=pool, defaults={"licence": "qpu@slurmdb", "count": 1, "reservations": ["gg-1"]}
    )
    page = reverse("admin:licences_licencestate_delete", args=[state.pk])
    assert admin_client.post(page, {"post": "yes"}).status_code == 403
    admin_client.post(
        reverse("admin:licences_licencestate_changelist"),
        {"action": "delete_selected", "_selected_action": [str(state.pk)], "post": "yes"},
    )
    assert LicenceState.objects.filter(pk=state.pk).exists()

    sent = []
    monkeypatch.setattr(licence_services, "enqueue", lambda func, *args: sent.append((func, *args)))
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(reverse("admin:resources_resourcepool_delete", args=[pool.pk]), {"post": "yes"})
    assert response.status_code == 302
    assert not LicenceState.objects.filter(pk=state.pk).exists()
    assert sent == [("apps.licences.tasks.close_licences", ["qpu@slurmdb"], ["gg-1"])]
