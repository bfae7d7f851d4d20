"""Sign-in with an OpenID Connect provider, groups from its claims, the password switch, and the
provider's JWTs as API bearer tokens (docs/identity.md).

The provider is a real one made for tests (oidc-provider-mock, started here on loopback): the
browser flow goes through its authorization form, its token and user-info endpoints and its
published keys. The bearer cases a provider does not produce on demand (expired, another
audience, an unpublished or rotated key) are signed by tests/doubles/jwks_server.py.
"""

import threading
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from oidc_provider_mock import run_server_in_thread

from apps.accounts import oidc, services
from apps.accounts.models import Identity
from apps.resources.models import ResourcePool
from apps.resources.selectors import visible_pools
from tests.doubles.jwks_server import Issuer

User = get_user_model()
SECRET = "oidc-CLIENT-secret-value-42"  # noqa: S105 - the test client's secret, looked for in answers


def configure(settings, issuer: str):
    settings.GRIDGATE_OIDC_ISSUER = issuer
    settings.OIDC_OP_AUTHORIZATION_ENDPOINT = issuer + "/oauth2/authorize"
    settings.OIDC_OP_TOKEN_ENDPOINT = issuer + "/oauth2/token"
    settings.OIDC_OP_USER_ENDPOINT = issuer + "/userinfo"
    settings.OIDC_OP_JWKS_ENDPOINT = issuer + "/jwks"
    settings.GRIDGATE_OIDC_END_SESSION_ENDPOINT = issuer + "/oauth2/end_session"
    settings.OIDC_RP_CLIENT_ID = "gridgate"
    settings.GRIDGATE_OIDC_AUDIENCE = "gridgate-api"
    settings.OIDC_RP_CLIENT_SECRET = SECRET


@pytest.fixture
def provider(settings, db):
    with run_server_in_thread() as server:
        url = f"http://localhost:{server.server_port}"
        configure(settings, url)
        yield url


def put_user(provider: str, sub: str, **claims) -> None:
    requests.put(f"{provider}/users/{sub}", json=claims, timeout=10).raise_for_status()


def sign_in(client: Client, provider: str, sub: str):
    """The browser's round trip: Gridgate → the provider's form (the user picks ``sub``) →
    Gridgate's callback. Returns the callback's response."""
    start = client.get("/oidc/authenticate/?next=/jobs/")
    assert start.status_code == 302 and start["Location"].startswith(f"{provider}/oauth2/authorize?")
    query = parse_qs(urlsplit(start["Location"]).query)
    assert query["code_challenge_method"] == ["S256"] and query["code_challenge"]  # PKCE
    assert SECRET not in start["Location"]
    chosen = requests.post(start["Location"], data={"sub": sub}, allow_redirects=False, timeout=10)
    assert chosen.status_code == 302, chosen.text[:500]
    callback = urlsplit(chosen.headers["Location"])
    return client.get(f"{callback.path}?{callback.query}")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_first_sign_ins_of_one_subject_at_once_make_one_account_and_both_sign_in(provider, monkeypatch):
    """Two tabs, or a double click while the provider signs the user in without asking: both
    callbacks find no account and create one. The second insert used to hit the unique username
    and answer 500; it now signs in as the account the first made."""
    put_user(provider, "sub-ada", preferred_username="ada")
    clients = [Client(raise_request_exception=False) for _ in range(2)]
    callbacks = []
    for client in clients:
        start = client.get("/oidc/authenticate/?next=/jobs/")
        chosen = requests.post(start["Location"], data={"sub": "sub-ada"}, allow_redirects=False, timeout=10)
        assert chosen.status_code == 302
        callback = urlsplit(chosen.headers["Location"])
        callbacks.append(f"{callback.path}?{callback.query}")
    manager = type(User.objects)
    made = manager.create_user
    both = threading.Barrier(2)

    def create_user(self, *args, **kwargs):  # both found the name free
        both.wait(timeout=30)
        return made(self, *args, **kwargs)

    monkeypatch.setattr(manager, "create_user", create_user)

    def finish(pair):
        client, url = pair
        try:
            return client.get(url)
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=2) as pool:
        answers = list(pool.map(finish, zip(clients, callbacks, strict=True)))
    assert [answer.status_code for answer in answers] == [302, 302]
    assert [answer["Location"] for answer in answers] == ["/jobs/", "/jobs/"]
    ada = User.objects.get(username="ada")
    assert list(Identity.objects.values_list("user", "subject")) == [(ada.pk, "sub-ada")]
    assert [int(client.session["_auth_user_id"]) for client in clients] == [ada.pk, ada.pk]


def test_oidc_sign_in_creates_the_user_from_claims_and_the_groups_claim_grants_and_revokes_a_pool(provider):
    group = Group.objects.create(name="centre/qpu-users")
    Group.objects.create(name="unrelated")
    pool = ResourcePool.objects.create(name="qpu", kind="local", public=False, slots_total=2)
    pool.groups.add(group)
    claims = {"preferred_username": "ada", "email": "ada@example.org", "given_name": "Ada", "family_name": "L"}
    put_user(provider, "sub-ada", **claims, groups=["/centre/qpu-users", "/not-a-group-here", 42])

    client = Client()
    done = sign_in(client, provider, "sub-ada")
    assert done.status_code == 302 and done["Location"] == "/jobs/"
    user = User.objects.get(username="ada")
    assert (user.email, user.first_name, user.last_name) == ("ada@example.org", "Ada", "L")
    assert Identity.objects.get(user=user).subject == "sub-ada"
    assert set(user.groups.values_list("name", flat=True)) == {"centre/qpu-users"}
    assert pool in visible_pools(user)
    assert client.get("/jobs/").status_code == 200

    put_user(provider, "sub-ada", **claims | {"email": "ada@new.example.org"}, groups=[])  # left the group
    assert sign_in(Client(), provider, "sub-ada").status_code == 302
    user = User.objects.get(pk=user.pk)
    assert user.email == "ada@new.example.org" and not user.groups.exists()
    assert pool not in visible_pools(user)
    assert User.objects.filter(username="ada").count() == 1


def test_oidc_first_sign_in_never_takes_over_a_local_account_with_the_same_username(provider, owner):
    put_user(provider, "sub-intruder", preferred_username="owner", groups=[])
    client = Client()
    done = sign_in(client, provider, "sub-intruder")
    assert done.status_code == 302 and done["Location"] == "/login/?sso=failed"
    assert not Identity.objects.exists()
    page = client.get("/login/?sso=failed").content.decode()
    assert "did not complete" in page and "already exists here" in page
    assert client.get("/jobs/").status_code == 302  # not signed in

    Identity.objects.create(user=owner, issuer=provider, subject="sub-owner")  # an operator links it
    put_user(provider, "sub-owner", preferred_username="owner-at-idp")
    linked = Client()
    assert sign_in(linked, provider, "sub-owner")["Location"] == "/jobs/"
    assert linked.get("/jobs/").context["user"] == owner


def test_oidc_an_expired_sign_in_goes_back_to_the_provider_and_its_refusal_signs_the_user_out(provider):
    put_user(provider, "sub-ada", preferred_username="ada")
    client = Client()
    sign_in(client, provider, "sub-ada")
    assert client.get("/jobs/").status_code == 200
    session = client.session
    session["oidc_id_token_expiration"] = 0  # the renewal period has passed
    session.save()

    again = client.get("/jobs/")
    assert again.status_code == 302 and again["Location"].startswith(f"{provider}/oauth2/authorize?")
    state = parse_qs(urlsplit(again["Location"]).query)
    assert state["prompt"] == ["none"]
    api = client.get("/api/v1/resource-pools/")  # the API never redirects: 401 until a page renewed it
    assert api.status_code == 401 and "needs renewing" in api.json()["detail"]
    # The provider answers that the account cannot sign in any more (disabled there).
    client.get(f"/oidc/callback/?error=login_required&state={state['state'][0]}")
    assert client.get("/jobs/").status_code == 302
    assert client.get("/jobs/")["Location"].startswith("/login/")


def test_oidc_a_user_deactivated_here_loses_their_provider_session_at_once(provider):
    put_user(provider, "sub-ada", preferred_username="ada")
    client = Client()
    sign_in(client, provider, "sub-ada")
    User.objects.filter(username="ada").update(is_active=False)
    assert client.get("/jobs/").status_code == 302


def test_oidc_sessions_end_when_the_provider_is_no_longer_configured(provider, settings):
    put_user(provider, "sub-ada", preferred_username="ada")
    client = Client()
    sign_in(client, provider, "sub-ada")
    settings.GRIDGATE_OIDC_ISSUER = ""
    assert client.get("/jobs/")["Location"].startswith("/login/")


def test_oidc_routes_are_off_without_a_provider(client, db):
    assert client.get("/oidc/authenticate/").status_code == 404
    assert client.get("/oidc/callback/?code=x&state=y").status_code == 404
    assert "Sign in with" not in client.get("/login/").content.decode()


def test_password_login_switch_staff_keeps_break_glass_accounts_and_off_refuses_every_password_path(
    settings, client, owner, staff
):
    settings.GRIDGATE_PASSWORD_LOGIN = "staff"
    assert client.post("/login/", {"username": "owner", "password": "pw"}).status_code == 200  # refused
    assert client.post("/api/v1/auth/token/", {"username": "owner", "password": "pw"}).status_code == 400
    assert client.post("/login/", {"username": "staff", "password": "pw"}).status_code == 302
    assert client.get("/jobs/").status_code == 200

    settings.GRIDGATE_PASSWORD_LOGIN = "off"
    assert client.get("/jobs/").status_code == 302  # the password session ends at its next request
    assert client.post("/api/v1/auth/token/", {"username": "staff", "password": "pw"}).status_code == 400
    assert Client().post("/admin/login/", {"username": "staff", "password": "pw"}).status_code == 200
    assert 'name="password"' not in client.get("/login/").content.decode()


def test_oidc_the_client_secret_appears_in_no_page_and_not_in_the_schema(provider, client, admin_client):
    assert SECRET not in client.get("/login/").content.decode()
    assert SECRET not in client.get("/oidc/authenticate/")["Location"]
    assert SECRET not in admin_client.get("/api/schema/").content.decode()


# -- API bearer tokens ----------------------------------------------------------------------------


@pytest.fixture
def issuer(settings, db):
    double = Issuer().start()
    configure(settings, double.url)
    oidc.KEYS.__init__()  # a process that never read this issuer's keys
    yield double
    double.stop()


@pytest.fixture
def linked(issuer, owner):
    Identity.objects.create(user=owner, issuer=issuer.url, subject="user-1")
    return owner


def bearer(client: Client, token: str, path: str = "/api/v1/resource-pools/"):
    return client.get(path, HTTP_AUTHORIZATION=f"Bearer {token}")


def test_oidc_the_web_clients_id_token_is_never_an_api_bearer_token(provider, client):
    """Identity finding: the web client's ID token (audience: the client id, no typ check) was
    accepted as an API bearer token. A bearer token must be an RFC 9068 access token (header typ
    at+jwt) for the API's audience."""
    put_user(provider, "sub-ada", preferred_username="ada")
    sign_in(Client(), provider, "sub-ada")
    start = requests.post(
        f"{provider}/oauth2/authorize?client_id=gridgate&response_type=code&scope=openid"
        "&redirect_uri=http://localhost/cb",
        data={"sub": "sub-ada"},
        allow_redirects=False,
        timeout=10,
    )
    code = parse_qs(urlsplit(start.headers["Location"]).query)["code"][0]
    tokens = requests.post(
        f"{provider}/oauth2/token",
        data={"grant_type": "authorization_code", "code": code, "redirect_uri": "http://localhost/cb"},
        auth=("gridgate", SECRET),
        timeout=10,
    ).json()
    refused = bearer(client, tokens["id_token"], "/api/v1/sessions/")
    assert refused.status_code == 401 and "not an access token" in refused.json()["detail"]


def test_oidc_bearer_access_token_authenticates_its_user_in_one_statement(issuer, linked, client):
    # The keys are cached (no call to the provider) and the user costs what a static token's does.
    assert bearer(client, issuer.token(), "/api/v1/sessions/").status_code == 200
    _, key = services.issue_token(linked)
    client.get("/api/v1/sessions/", HTTP_AUTHORIZATION=f"Token {key}")  # its first use is recorded once
    with CaptureQueriesContext(connection) as static:
        client.get("/api/v1/sessions/", HTTP_AUTHORIZATION=f"Token {key}")
    with CaptureQueriesContext(connection) as jwt_bearer:
        response = bearer(client, issuer.token(), "/api/v1/sessions/")
    assert response.status_code == 200 and response.wsgi_request.user == linked
    assert len(jwt_bearer.captured_queries) <= len(static.captured_queries)
    assert "accounts_identity" in jwt_bearer.captured_queries[0]["sql"]


def test_oidc_bearer_tokens_expired_for_another_audience_or_issuer_or_unknown_are_refused(issuer, linked, client):
    assert bearer(client, issuer.token()).status_code == 200
    refused = {
        "expired": issuer.token(lifetime=-120),
        "issued for another audience": issuer.token(audience="another-service"),
        "issued by another provider": issuer.token(iss="https://elsewhere.example.org"),
    }
    issuer.add_key("nowhere", publish=False)
    refused["signed with a key the identity provider does not publish"] = issuer.token(kid="nowhere")
    for reason, token in refused.items():
        response = bearer(client, token)
        assert response.status_code == 401 and reason in response.json()["detail"], (reason, response.content)
    stranger = bearer(client, issuer.token(sub="user-2"))
    assert stranger.status_code == 401 and "sign in once" in stranger.json()["detail"]
    for kind, claims in (("JWT", {}), ("at+jwt", {"nonce": "n"}), ("at+jwt", {"typ": "ID"})):
        id_like = bearer(client, issuer.token(header_typ=kind, **claims))  # an ID token, whatever its header
        assert id_like.status_code == 401 and "access token" in id_like.json()["detail"], (kind, claims)
    assert bearer(client, "not.a.jwt").status_code == 401
    unsigned = "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiJ1c2VyLTEifQ."  # alg none
    assert bearer(client, unsigned).status_code == 401


def test_oidc_bearer_keys_rotate_and_a_withdrawn_key_stops_working(issuer, linked, client, settings):
    settings.GRIDGATE_OIDC_JWKS_REFRESH_SECONDS = 3600
    old = issuer.token()
    assert bearer(client, old).status_code == 200 and issuer.fetches == 1
    for _ in range(3):  # unknown keys do not make every request fetch the keys again
        assert bearer(client, issuer.token(kid="key-1") + "x").status_code == 401
    issuer.add_key("ghost", publish=False)
    assert bearer(client, issuer.token(kid="ghost")).status_code == 401
    assert bearer(client, issuer.token(kid="ghost")).status_code == 401
    assert issuer.fetches == 1  # within the refresh interval

    settings.GRIDGATE_OIDC_JWKS_REFRESH_SECONDS = 0  # the interval has passed
    issuer.add_key("key-2")  # the provider rotates: the new key first published beside the old
    assert bearer(client, issuer.token(kid="key-2")).status_code == 200 and issuer.fetches == 2
    assert bearer(client, old).status_code == 200
    issuer.withdraw("key-1")
    oidc.KEYS._fetched_at = float("-inf")  # the hourly re-read
    assert bearer(client, issuer.token(kid="key-2")).status_code == 200
    assert bearer(client, old).status_code == 401


def test_oidc_bearer_tokens_are_ignored_without_a_provider(client, owner, settings):
    settings.GRIDGATE_OIDC_ISSUER = ""
    response = client.get("/api/v1/resource-pools/", HTTP_AUTHORIZATION="Bearer abc.def.ghi")
    assert response.status_code == 401 and "credentials were not provided" in response.json()["detail"]
