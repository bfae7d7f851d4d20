"""Operators see who holds which token until when, revoke them, and never see a key."""

import pytest

from apps.accounts.models import ApiToken
from apps.accounts.services import issue_token

pytestmark = pytest.mark.django_db

URL = "/admin/accounts/apitoken/"


def test_the_token_list_shows_holder_prefix_and_expiry_never_a_key(admin_client, member):
    token, key = issue_token(member, name="laptop")
    for url in [URL, f"{URL}?q=member", f"{URL}?q={token.prefix}", f"{URL}?state=valid", f"{URL}{token.pk}/change/"]:
        page = admin_client.get(url).content.decode()
        assert token.prefix in page and "member" in page, url
        assert key not in page and token.digest not in page, url
    assert token.prefix not in admin_client.get(f"{URL}?q=nobody").content.decode()
    assert token.prefix not in admin_client.get(f"{URL}?state=expired").content.decode()


def test_tokens_cannot_be_added_or_edited_in_the_admin(admin_client, member):
    token, _ = issue_token(member)
    assert admin_client.get(f"{URL}add/").status_code == 403
    admin_client.post(f"{URL}{token.pk}/change/", {"name": "renamed"})
    token.refresh_from_db()
    assert token.name == ""


def test_the_revoke_action_deletes_the_selected_tokens(admin_client, member, owner):
    revoked, _ = issue_token(member)
    kept, _ = issue_token(owner)
    response = admin_client.post(URL, {"action": "revoke", "_selected_action": [revoked.pk]}, follow=True)
    assert "1 token(s) revoked." in response.content.decode()
    assert list(ApiToken.objects.values_list("pk", flat=True)) == [kept.pk]


def test_the_token_list_shows_when_each_token_was_last_used(admin_client, member):
    from datetime import UTC, datetime

    used, _ = issue_token(member, name="used")
    ApiToken.objects.filter(pk=used.pk).update(last_used_at=datetime(2026, 5, 4, 3, 2, tzinfo=UTC))
    issue_token(member, name="unused")
    page = admin_client.get(URL).content.decode()
    assert "column-last_used_at" in page and "May 4, 2026, 3:02" in page
