"""An operator's note on an identity never writes back the refresh token and check time the
worker's recheck (or a sign-in) stored meanwhile."""

import pytest
from django.urls import reverse
from django.utils import timezone

from apps.accounts.admin import IdentityAdmin
from apps.accounts.models import Identity
from tests.admin_forms import change_form_data

pytestmark = pytest.mark.django_db


def test_editing_an_identitys_note_never_restores_the_refresh_token_the_recheck_rotated(
    admin_client, member, monkeypatch
):
    before = timezone.now() - timezone.timedelta(hours=2)
    identity = Identity.objects.create(
        user=member, issuer="https://idp.example", subject="s-1", sealed_refresh_token="old", checked_at=before
    )
    url = reverse("admin:accounts_identity_change", args=[identity.pk])
    data = change_form_data(admin_client.get(url)) | {"note": "merged account"}
    original = IdentityAdmin.save_form
    rotated_at = timezone.now()

    def save_form(self, request, form, change):  # the recheck rotates the token between read and save
        obj = original(self, request, form, change)
        Identity.objects.filter(pk=obj.pk).update(sealed_refresh_token="rotated", checked_at=rotated_at)
        return obj

    monkeypatch.setattr(IdentityAdmin, "save_form", save_form)
    response = admin_client.post(url, data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    identity.refresh_from_db()
    assert identity.note == "merged account"
    # The old token was spent at the provider: traded again, it would end the user's API tokens.
    assert (identity.sealed_refresh_token, identity.checked_at) == ("rotated", rotated_at)
