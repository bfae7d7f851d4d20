"""The "API tokens" user page (/tokens/): a user lists, creates and revokes their own tokens; a new
key is shown once, in the answer to its creation, and kept nowhere."""

from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from apps.accounts.models import ApiToken
from apps.accounts.services import issue_token

pytestmark = pytest.mark.django_db

PAGE = "/tokens/"
CHEAP = "/api/v1/backends/"


def signed_in(user, **kwargs) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client


def works(key: str) -> bool:
    return APIClient(HTTP_AUTHORIZATION=f"Token {key}").get(CHEAP).status_code == 200


def test_the_page_lists_ones_own_tokens_with_their_state(member, owner):
    used, used_key = issue_token(member, name="laptop")
    assert works(used_key)  # records its use
    ApiToken.objects.filter(pk=used.pk).update(last_used_at=datetime(2026, 5, 4, 3, 2, tzinfo=UTC))
    old, _ = issue_token(member, name="old ci")
    ApiToken.objects.filter(pk=old.pk).update(expires_at=timezone.now() - timedelta(days=1))
    theirs, _ = issue_token(owner, name="someone else's")
    response = signed_in(member).get(PAGE)
    assert response.status_code == 200
    page = response.content.decode()
    assert "laptop" in page and f"{used.prefix}…" in page and "2026-05-04 03:02" in page
    assert "old ci" in page and page.count('<span class="status status-failed">Expired</span>') == 1
    assert page.count('<span class="muted">never</span>') == 1  # the old one
    assert "someone else" not in page and theirs.prefix not in page
    assert used.digest not in page


def test_the_form_shows_the_default_and_maximum_terms(member, settings):
    settings.GRIDGATE_TOKEN_DAYS, settings.GRIDGATE_TOKEN_MAX_DAYS = 30, 120
    page = signed_in(member).get(PAGE).content.decode()
    assert 'value="30"' in page and 'max="120"' in page and "at most 120" in page


def test_the_navigation_links_to_the_page(member):
    page = signed_in(member).get("/sessions/").content.decode()
    assert f'href="{PAGE}"' in page and "API tokens" in page


def test_the_page_needs_a_signed_in_user():
    response = Client().get(PAGE)
    assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_creating_a_token_on_the_page_shows_its_key_once(member):
    client = signed_in(member)
    response = client.post(PAGE, {"name": "notebook", "expires_in_days": "7"})
    assert response.status_code == 201
    token = ApiToken.objects.get(user=member)
    key = response.context["created"]["key"]
    assert key in response.content.decode() and key.startswith(token.prefix)
    assert token.name == "notebook"
    assert abs(token.expires_at - (timezone.now() + timedelta(days=7))) < timedelta(minutes=1)
    assert "no-store" in response.get("Cache-Control", "")  # no browser or proxy keeps the page with it
    assert works(key)
    # Kept nowhere: not in the session, not in a message waiting for the next page.
    assert not any(key in str(value) for value in client.session.values())
    again = client.get(PAGE).content.decode()
    assert key not in again and f"{token.prefix}…" in again


def test_a_term_above_the_maximum_is_refused_on_the_page(member, settings):
    settings.GRIDGATE_TOKEN_MAX_DAYS = 30
    response = signed_in(member).post(PAGE, {"name": "too long", "expires_in_days": "31"})
    assert response.status_code == 400
    assert "A token may last at most 30 days on this site." in response.content.decode()
    assert not ApiToken.objects.exists()


def test_a_missing_name_is_refused_on_the_page(member):
    response = signed_in(member).post(PAGE, {"name": "", "expires_in_days": "7"})
    assert response.status_code == 400 and not ApiToken.objects.exists()


def test_revoking_on_the_page_stops_the_key(member):
    token, key = issue_token(member, name="laptop")
    response = signed_in(member).post(f"{PAGE}{token.pk}/revoke/", follow=True)
    assert response.redirect_chain == [(PAGE, 302)]
    assert "revoked" in response.content.decode()
    assert not ApiToken.objects.filter(pk=token.pk).exists()
    assert not works(key)


def test_a_user_cannot_revoke_another_users_token_through_the_page(member, owner, staff):
    theirs, their_key = issue_token(owner)
    for caller in (member, staff):
        assert signed_in(caller).post(f"{PAGE}{theirs.pk}/revoke/").status_code == 404
    assert ApiToken.objects.filter(pk=theirs.pk).exists() and works(their_key)


def test_revoking_takes_a_post_with_the_csrf_token(member):
    token, _ = issue_token(member)
    assert signed_in(member).get(f"{PAGE}{token.pk}/revoke/").status_code == 405
    assert signed_in(member, enforce_csrf_checks=True).post(f"{PAGE}{token.pk}/revoke/").status_code == 403
    assert ApiToken.objects.filter(pk=token.pk).exists()
