"""Identity as an operator meets it (docs/identity.md): sign-out that signs out, API access that
ends with the provider's word, groups that survive a provider leaving the claim out, operators'
links, usernames that cannot pass for another's. Against the real test provider
(oidc-provider-mock) as tests/accounts/test_oidc.py, and its JWT double for bearer tokens."""

import logging
from datetime import timedelta
from io import StringIO
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from cryptography.fernet import Fernet
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from apps.accounts import oidc
from apps.accounts.models import ApiToken, Identity
from apps.resources.models import ResourcePool
from apps.resources.selectors import visible_pools
from tests.accounts.test_oidc import bearer, put_user, sign_in

User = get_user_model()


@pytest.fixture
def sealing_key(settings):
    settings.GRIDGATE_CREDENTIALS_KEY = [Fernet.generate_key().decode()]


def past_renewal(client):
    session = client.session
    session["oidc_id_token_expiration"] = 0
    session.save()


def new_token(client) -> str:
    response = client.post("/api/v1/auth/tokens/", {"name": "laptop"}, content_type="application/json")
    assert response.status_code == 201, response.content
    return response.json()["token"]


def test_f2_a_session_past_its_renewal_answers_401_on_the_api_and_mints_no_token(provider):
    """F2: the prompt=none renewal ran on pages only: a session cookie past it still answered
    /api/v1/cases/ and created a 365-day personal token, which outlived the provider's sign-out."""
    put_user(provider, "sub-ada", preferred_username="ada")
    client = Client()
    sign_in(client, provider, "sub-ada")
    assert client.get("/api/v1/cases/").status_code == 200
    past_renewal(client)
    assert client.get("/api/v1/cases/").status_code == 401
    minted = client.post("/api/v1/auth/tokens/", {"name": "x", "expires_in_days": 365}, content_type="application/json")
    assert minted.status_code == 401 and not ApiToken.objects.exists()
    assert client.get("/jobs/")["Location"].startswith(f"{provider}/oauth2/authorize?")  # a page renews it


def test_f2_personal_tokens_end_when_the_provider_says_the_user_is_gone(provider, sealing_key, settings):
    """F2: a personal token of a provider-signed user is confirmed with a refresh grant (the
    sign-in's refresh token, sealed) every GRIDGATE_OIDC_RECHECK_SECONDS; the provider's refusal
    ends the user's tokens."""
    put_user(provider, "sub-ada", preferred_username="ada")
    client = Client()
    sign_in(client, provider, "sub-ada")
    identity = Identity.objects.get(subject="sub-ada")
    assert identity.sealed_refresh_token and identity.checked_at is not None
    key = new_token(client)
    api = Client(HTTP_AUTHORIZATION=f"Token {key}")
    assert api.get("/api/v1/cases/").status_code == 200

    Identity.objects.update(checked_at=timezone.now() - timedelta(seconds=settings.GRIDGATE_OIDC_RECHECK_SECONDS + 1))
    assert oidc.recheck_identities() == {"checked": 1, "ended": 0}  # still known there: rotated, kept
    assert api.get("/api/v1/cases/").status_code == 200
    assert oidc.recheck_identities() == {"checked": 0, "ended": 0}  # not due again yet

    requests.post(f"{provider}/users/sub-ada/revoke-tokens", timeout=10).raise_for_status()  # signed out there
    Identity.objects.update(checked_at=timezone.now() - timedelta(seconds=settings.GRIDGATE_OIDC_RECHECK_SECONDS + 1))
    assert oidc.recheck_identities() == {"checked": 0, "ended": 1}
    assert api.get("/api/v1/cases/").status_code == 401
    assert not ApiToken.objects.exists() and Identity.objects.get().sealed_refresh_token == ""


def test_f2_the_recheck_runs_in_the_workers_tick_loop():
    """F2: the recheck is one of the worker's periodic passes."""
    from apps.core import ticker

    assert ticker.registered()["accounts.recheck_identities"].func is oidc.recheck_identities


def test_f2_without_a_refresh_token_to_confirm_with_a_token_lasts_no_longer_than_the_session(provider, settings):
    """F2: with no refresh token held to confirm the sign-in later, a token lasts no longer than
    the browser session would."""
    put_user(provider, "sub-ada", preferred_username="ada")
    client = Client()
    sign_in(client, provider, "sub-ada")  # no GRIDGATE_CREDENTIALS_KEY: the refresh token is not kept
    new_token(client)
    token = ApiToken.objects.get()
    assert token.expires_at <= timezone.now() + timedelta(seconds=settings.OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS + 5)


def test_groups_are_asked_for_and_an_absent_claim_keeps_them_with_a_warning(provider, caplog):
    """Providers that release the groups claim per scope sent none with the former default scopes,
    and an absent claim was read as "no groups": every group pool was lost at the next sign-in."""
    group = Group.objects.create(name="qpu-users")
    pool = ResourcePool.objects.create(name="qpu", kind="local", public=False)
    pool.groups.add(group)
    put_user(provider, "sub-ada", preferred_username="ada", groups=["qpu-users"])
    client = Client()
    start = client.get("/oidc/authenticate/")
    assert "groups" in parse_qs(urlsplit(start["Location"]).query)["scope"][0].split()
    sign_in(client, provider, "sub-ada")
    ada = User.objects.get(username="ada")
    assert pool in visible_pools(ada)

    put_user(provider, "sub-ada", preferred_username="ada")  # the claim left out
    with caplog.at_level(logging.WARNING, logger="apps.accounts.oidc"):
        sign_in(Client(), provider, "sub-ada")
    assert pool in visible_pools(ada) and "sent no 'groups' claim" in caplog.text
    put_user(provider, "sub-ada", preferred_username="ada", groups=[])  # an empty claim still removes
    sign_in(Client(), provider, "sub-ada")
    assert pool not in visible_pools(ada)


def test_rp_initiated_logout_signs_out_at_the_provider_too(provider):
    """Log out was local only: "Sign in" right after re-admitted the previous user with no password
    on a shared terminal. /logout/ now sends the browser to the provider's end-session endpoint
    with the ID token as its hint, and back to the login page."""
    put_user(provider, "sub-ada", preferred_username="ada")
    client = Client()
    sign_in(client, provider, "sub-ada")
    id_token = client.session["oidc_id_token"]
    out = client.post("/logout/")
    assert out.status_code == 302 and out["Location"].startswith(f"{provider}/oauth2/end_session?")
    query = parse_qs(urlsplit(out["Location"]).query)
    assert query["id_token_hint"] == [id_token]
    assert query["post_logout_redirect_uri"] == ["http://testserver/login/"]
    assert client.get("/jobs/").status_code == 302 and "_auth_user_id" not in client.session
    confirm = requests.get(out["Location"], timeout=10)  # the provider's own sign-out page
    assert confirm.status_code == 200 and "http://testserver/login/" in confirm.text


def test_a_password_session_logs_out_locally(client, owner):
    client.force_login(owner)
    assert client.post("/logout/")["Location"] == "/login/"


@pytest.mark.parametrize(
    "claimed, why",
    [
        ("alice\u200b", "holds characters"),  # a zero-width space: invisible
        ("\u0430lice", "mixes scripts"),  # Cyrillic а + Latin lice
        ("../admin", "holds characters"),
        ("-rf", "holds characters"),
        ("\u0430\u04cf\u0456\u0441\u0435", "looks like the existing account"),  # all Cyrillic: 'alice'
    ],
)
def test_f9_provider_usernames_that_pass_for_another_are_refused(provider, claimed, why, db):
    """F9: OIDC usernames were not validated: alice\\u200b, Cyrillic аlice and ../admin became users."""
    User.objects.create_user("alice")
    put_user(provider, "sub-x", preferred_username=claimed)
    client = Client()
    done = sign_in(client, provider, "sub-x")
    assert done["Location"] == "/login/?sso=failed"
    assert why in client.get("/login/?sso=failed").content.decode()
    assert User.objects.count() == 1 and not Identity.objects.exists()


def test_f9_usernames_are_nfkc_normalised(provider):
    """F9: a fullwidth ａｄａ is the account ada."""
    put_user(provider, "sub-ada", preferred_username="\uff41\uff44\uff41")  # fullwidth ａｄａ
    sign_in(Client(), provider, "sub-ada")
    assert User.objects.filter(username="ada").exists()


def test_operators_link_identities_in_the_admin_and_with_link_identity(provider, admin_client, owner):
    """The docs sent operators to admin → Identities, which did not exist: a refused sign-in of an
    existing local name had no remedy."""
    assert admin_client.get("/admin/accounts/identity/").status_code == 200
    assert admin_client.get("/admin/accounts/identity/add/").status_code == 200
    page = admin_client.get(f"/admin/auth/user/{owner.pk}/change/").content.decode()
    assert "identities-TOTAL_FORMS" in page

    put_user(provider, "sub-owner", preferred_username="owner")
    assert sign_in(Client(), provider, "sub-owner")["Location"] == "/login/?sso=failed"  # taken name
    out = StringIO()
    call_command("link_identity", "owner", "sub-owner", "--note", "the same person", stdout=out)
    assert "linked to owner" in out.getvalue()
    client = Client()
    assert sign_in(client, provider, "sub-owner")["Location"] == "/jobs/"
    assert client.get("/jobs/").context["user"] == owner
    with pytest.raises(Exception, match="already owner's"):
        call_command("link_identity", "staff", "sub-owner", stdout=StringIO())


def test_a_service_account_is_told_it_needs_an_operator_and_works_once_mapped(issuer, client, db):
    """A client credentials token (the SPANK plugin's) was told to "sign in once on the web pages"."""
    token = issuer.token(sub="spank-client", client_id="spank-client")
    refused = bearer(client, token)
    assert refused.status_code == 401 and "link_identity" in refused.json()["detail"]
    call_command("link_identity", "svc-spank", "spank-client", "--create", stdout=StringIO())
    response = bearer(client, token)
    assert response.status_code == 200 and response.wsgi_request.user.username == "svc-spank"
