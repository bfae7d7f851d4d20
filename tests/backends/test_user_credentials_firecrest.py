"""Per-user credentials on FirecREST: what is FirecREST's own (docs/backends.md "Per-user
credentials"): the OAuth connect (authorization code + PKCE), rotating refresh tokens, revocation
at the identity provider (RFC 7009), re-sealing, the pool option. What every provider does is
proved in test_remote_contract.py; both run over the FirecREST driver (tests/backends/conftest.py),
whose double is also the identity provider and **checks on every call about a case that the
token's subject is the case owner's** (``expect_owner``).
"""

import json
import logging
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from cryptography.fernet import Fernet
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import connection as db

from apps.accounts.models import Identity
from apps.backends import firecrest as fc
from apps.cases.models import Case, CaseStatus
from apps.credentials import oauth
from apps.credentials import services as credential_services
from apps.credentials.models import ConnectionState, RemoteConnection
from apps.resources.models import ResourcePool
from apps.resources.remote import revocation_endpoint
from tests.backends.conftest import SEALING_KEY as KEY
from tests.backends.conftest import FirecrestDriver, browser, raw_sealed, wait_for_terminal
from tests.cases.conftest import launched
from tests.concurrency import locked_while
from tests.resources.test_admin import inline_data, pool_form

pytestmark = pytest.mark.django_db

PROVIDER = "firecrest"  # the ``driver`` fixture's
remote_for = FirecrestDriver.remote


def set_remote(client, pool, remote: dict):
    """``PATCH`` of ``pool``'s remote through the API, as ``client``."""
    return client.patch(f"/api/v1/resource-pools/{pool.pk}/", {"remote": remote}, format="json")


# -- connecting ----------------------------------------------------------------------------------
def test_connect_round_trip_checks_the_state_sends_the_pkce_verifier_and_keeps_the_refresh_token_sealed(
    driver, double, ada
):
    client = browser(ada)
    start = driver.start(client, ada)
    query = parse_qs(urlsplit(start["Location"]).query)
    assert start["Location"].startswith(double.authorization_uri)
    assert query["code_challenge_method"] == ["S256"] and query["client_id"] == ["gridgate-firecrest"]
    assert query["redirect_uri"] == ["http://testserver/connections/callback/"]
    assert "offline_access" in query["scope"][0].split()
    provider = httpx.get(start["Location"], follow_redirects=False)
    back = parse_qs(urlsplit(provider.headers["location"]).query)

    # A callback with another state (a forged or foreign answer) is refused; nothing is kept.
    forged = client.get(f"/connections/callback/?code={back['code'][0]}&state=forged", follow=True)
    assert "unknown here or was already used" in forged.content.decode()
    assert not RemoteConnection.objects.exists()

    done = client.get(f"/connections/callback/?code={back['code'][0]}&state={back['state'][0]}", follow=True)
    assert f"Connected to {driver.pool.name} as ada" in done.content.decode()
    connection = RemoteConnection.objects.get(user=ada, pool=driver.pool)
    assert connection.state == ConnectionState.CONNECTED and connection.subject == double.subject_of("ada")
    assert connection.issuer == double.issuer and connection.last_refreshed_at is not None
    # PKCE: the verifier was sent with the code, hashes to the challenge (the double checks), and
    # never left this process before that (it is not in the authorization URL).
    assert double.verifiers and double.verifiers[-1] not in start["Location"]
    # The database column holds ciphertext only: the refresh token opens from it with the key.
    (refresh_token,) = double.live_refresh_tokens("ada")
    sealed = raw_sealed(connection.pk)
    assert refresh_token not in sealed and sealed.startswith("gAAAAA")
    assert Fernet(KEY).decrypt(sealed.encode()).decode() == refresh_token

    # The state is used once: replaying the callback is refused.
    replay = client.get(f"/connections/callback/?code={back['code'][0]}&state={back['state'][0]}", follow=True)
    assert "unknown here or was already used" in replay.content.decode()


def test_a_provider_account_other_than_the_linked_identity_is_refused(driver, double, ada):
    """docs/identity.md: an operator links a user to their identity (issuer, subject); connecting
    as someone else at that provider is refused."""
    Identity.objects.create(user=ada, issuer=double.issuer, subject=double.subject_of("ada"))
    driver.connect(ada, login_as="bob")  # signed in there as bob
    assert not RemoteConnection.objects.exists()
    driver.connect(ada)
    assert RemoteConnection.objects.get(user=ada).subject == double.subject_of("ada")


# -- rotating refresh tokens -------------------------------------------------------------------
def test_refresh_token_rotation_is_stored_back_sealed_and_the_rotated_one_is_revoked(driver, double, ada, make_case):
    driver.connect(ada)
    connection = RemoteConnection.objects.get(user=ada)
    (first,) = double.live_refresh_tokens("ada")
    first_refreshed = connection.last_refreshed_at
    credential_services.forget_access_tokens()  # a worker process without the token: it must refresh
    case = launched(driver.case(make_case, ada, "true"))
    assert case.status == CaseStatus.PENDING, case.last_error
    assert "refresh_token" in double.grants
    (second,) = double.live_refresh_tokens("ada")
    assert second != first and double.refresh_tokens[first]["state"] == "used"
    connection.refresh_from_db()
    sealed = raw_sealed(connection.pk)
    assert second not in sealed and first not in sealed
    assert Fernet(KEY).decrypt(sealed.encode()).decode() == second  # the rotated one, stored back
    assert connection.last_refreshed_at > first_refreshed
    # The next refresh uses the stored one (the first is spent: using it again would end the session).
    credential_services.forget_access_tokens()
    assert wait_for_terminal(case).status == CaseStatus.DONE
    assert double.live_refresh_tokens("ada") != [second]
    credential_services.disconnect(user=ada, pool_id=driver.pool.pk)  # RFC 7009: the one stored last is revoked
    assert double.live_refresh_tokens("ada") == []


# -- the admin --------------------------------------------------------------------------------------
def test_staff_see_connections_in_the_admin_and_can_delete_them(driver, double, ada, admin_client):
    driver.connect(ada)
    connection = RemoteConnection.objects.get(user=ada)
    listing = admin_client.get("/admin/credentials/remoteconnection/").content.decode()
    assert "ada" in listing and double.subject_of("ada") in listing
    assert admin_client.get("/admin/credentials/remoteconnection/add/").status_code == 403
    page = admin_client.get(f"/admin/credentials/remoteconnection/{connection.pk}/change/").content.decode()
    assert "sealed" not in page.lower() and 'name="sealed_secret"' not in page
    answer = admin_client.post(f"/admin/credentials/remoteconnection/{connection.pk}/delete/", {"post": "yes"})
    assert answer.status_code == 302 and not RemoteConnection.objects.exists()
    assert double.live_refresh_tokens("ada") == [] and double.revocations == ["refresh_token"]


def test_deleting_several_connections_in_the_admin_revokes_each_grant(driver, double, ada, bob, admin_client):
    driver.connect(ada)
    driver.connect(bob)
    ids = [str(pk) for pk in RemoteConnection.objects.values_list("pk", flat=True)]
    data = {"action": "delete_selected", "_selected_action": ids, "post": "yes"}
    answer = admin_client.post("/admin/credentials/remoteconnection/", data, follow=True)
    assert answer.status_code == 200 and "has revoked it" in answer.content.decode()
    assert not RemoteConnection.objects.exists()
    assert double.live_refresh_tokens("ada") == [] and double.live_refresh_tokens("bob") == []


def test_a_firecrest_credential_is_never_pasted_through_the_api(driver, ada, api):
    """A FirecREST pool connects in the browser (its OAuth flow): a PUT is refused by the rule the
    connections page follows, whatever it carries."""
    answer = api(ada).put(f"/api/v1/connections/{driver.pool.pk}/", {"token": "pasted"}, format="json")
    assert answer.status_code == 400 and "is a firecrest pool: connect it from" in answer.json()["detail"]
    assert not RemoteConnection.objects.exists()


# -- disconnecting revokes the grant at the provider (RFC 7009) --------------------------------------
def test_when_the_provider_cannot_revoke_the_credential_is_still_forgotten_and_the_user_told(
    driver, double, ada, api, caplog
):
    caplog.set_level(logging.DEBUG)
    driver.connect(ada)
    (token,) = double.live_refresh_tokens("ada")
    double.fault("/auth/revoke", status=503, body={"error": "temporarily_unavailable", "error_description": token})
    answer = api(ada).delete(f"/api/v1/connections/{driver.pool.pk}/")
    assert answer.status_code == 200 and answer.json()["revoked"] is False
    detail = answer.json()["detail"]
    assert "revoking it failed (the identity provider refused (HTTP 503, temporarily_unavailable: ***))" in detail
    assert "end it at the identity provider" in detail
    assert not RemoteConnection.objects.exists()
    assert token not in answer.content.decode() and token not in caplog.text
    assert "revoking its grant failed" in caplog.text


def test_without_a_revocation_endpoint_doctor_and_disconnect_say_grants_are_not_revoked(double, ada, api):
    remote = remote_for(double, token_uri=f"{double.url}/auth/issue")
    pool = ResourcePool.objects.create(name="no-revoke", kind="firecrest", public=True, remote=remote)
    checks = {check.name: check for check in fc.FirecrestBackend().doctor(pool)}
    assert not checks["revocation"].ok
    assert checks["revocation"].message == (
        "disconnecting cannot revoke users' grants: this pool names no revocation endpoint (revocation_uri): "
        "set revocation_uri"
    )
    credential_services._store(ada, pool, "rt-1", subject="s", username="")  # as a connect keeps a grant
    answer = api(ada).delete(f"/api/v1/connections/{pool.pk}/").json()
    assert answer["revoked"] is False and "names no revocation endpoint (revocation_uri)" in answer["detail"]
    assert double.revocations == []


def test_the_revocation_endpoint_is_the_pools_or_keycloaks_beside_the_token_endpoint():
    keycloak = "https://idp.example.org/realms/hpc/protocol/openid-connect/token"
    assert revocation_endpoint({"token_uri": keycloak}) == keycloak[: -len("token")] + "revoke"
    assert revocation_endpoint({"token_uri": keycloak, "revocation_uri": "https://idp/x"}) == "https://idp/x"
    assert revocation_endpoint({"token_uri": "https://idp.example.org/oauth2/issue"}) is None


# -- the page -------------------------------------------------------------------------------------
def test_the_connections_page_lists_pools_needing_credentials_with_their_state(driver, double, ada, local_pool):
    client = browser(ada)
    page = client.get("/connections/").content.decode()
    assert driver.pool.name in page and "Not connected" in page and local_pool.name not in page
    driver.connect(ada)
    RemoteConnection.objects.filter(user=ada).update(state=ConnectionState.FAILED, failure="Token is not active")
    page = client.get("/connections/").content.decode()
    assert "Failed: reconnect" in page and "Token is not active" in page and "Reconnect" in page
    assert "Your sign-in grant is revoked at the identity provider." in page  # the disconnect's confirmation
    page = client.post(f"/connections/{driver.pool.pk}/disconnect/", follow=True).content.decode()
    assert not RemoteConnection.objects.exists()
    assert "Disconnected: Gridgate no longer holds the grant, and the identity provider has revoked it." in page


# -- the pool option --------------------------------------------------------------------------------
def test_the_credentials_option_is_validated_and_set_through_the_api_and_the_admin(api, staff, admin_client, double):
    client = api(staff)
    body = {"name": "fresh", "kind": "firecrest", "public": True, "remote": remote_for(double)}
    created = client.post("/api/v1/resource-pools/", body, format="json")
    assert created.status_code == 201, created.content
    pool = ResourcePool.objects.get(name="fresh")
    assert credential_services.needs_user_credentials(pool)  # a new pool: each user's own, by default
    bad = set_remote(client, pool, remote_for(double, credentials="x"))
    assert bad.status_code == 400 and "'credentials' must be 'user'" in str(bad.json())
    no_endpoint = remote_for(double, token_uri="https://idp.example.org/oauth2/issue")
    no_endpoint.pop("authorization_uri")
    refused = set_remote(client, pool, no_endpoint)
    assert refused.status_code == 400 and "authorization_uri" in str(refused.json())
    service = set_remote(client, pool, remote_for(double, credentials="service"))
    assert service.status_code == 200 and service.json()["remote"]["credentials"] == "service"
    pool.refresh_from_db()
    assert not credential_services.needs_user_credentials(pool)

    remote = json.dumps({"profile": "docker-batch", "credentials": "service"})
    data = pool_form(kind="qarnot", remote=remote, name="via-admin") | inline_data([])
    answer = admin_client.post("/admin/resources/resourcepool/add/", data)
    assert answer.status_code == 302, answer.content.decode()[:2000]
    assert ResourcePool.objects.get(name="via-admin").remote["credentials"] == "service"
    data = pool_form(kind="qarnot", remote='{"profile": "p", "credentials": "everyone"}', name="bad") | inline_data([])
    refused = admin_client.post("/admin/resources/resourcepool/add/", data)
    assert refused.status_code == 200 and "must be &#x27;user&#x27;" in refused.content.decode()


def test_the_data_migration_keeps_the_service_account_of_existing_remote_pools(db):
    from importlib import import_module

    from django.apps import apps

    migration = import_module("apps.resources.migrations.0007_pools_keep_service_credentials")
    old_fc = ResourcePool.objects.create(name="old-fc", kind="firecrest", remote={"api_url": "https://a"})
    old_q = ResourcePool.objects.create(name="old-q", kind="qarnot", remote={"profile": "p"})
    chosen = ResourcePool.objects.create(name="chosen", kind="qarnot", remote={"profile": "p", "credentials": "user"})
    local = ResourcePool.objects.create(name="lab", kind="local")
    migration.keep_service_account(apps, None)
    remotes = {pool.name: pool.remote for pool in ResourcePool.objects.all()}
    assert remotes["old-fc"] == {"api_url": "https://a", "credentials": "service"}
    assert remotes["old-q"] == {"profile": "p", "credentials": "service"}
    assert remotes["chosen"]["credentials"] == "user" and remotes["lab"] == {}
    migration.forget_the_choice(apps, None)
    assert ResourcePool.objects.get(pk=old_fc.pk).remote == {"api_url": "https://a"}
    assert ResourcePool.objects.get(pk=chosen.pk).remote["credentials"] == "user"
    assert ResourcePool.objects.get(pk=old_q.pk).remote == {"profile": "p"} and local.remote == {}


def test_doctor_of_a_per_user_pool_checks_the_key_and_the_public_client(driver, double):
    """Without the key it fails: test_doctor_of_a_per_user_pool_needs_the_sealing_key (the contract)."""
    checks = {check.name: check for check in fc.FirecrestBackend().doctor(driver.pool)}
    assert checks["credentials"].ok and checks["authorization"].ok and checks["client"].ok, checks
    assert checks["revocation"].ok and checks["revocation"].message.endswith(f"{double.url}/auth/revoke")
    double.public_client_id = "renamed"
    checks = {check.name: check for check in fc.FirecrestBackend().doctor(driver.pool)}
    assert not checks["client"].ok and "public client gridgate-firecrest" in checks["client"].message
    assert not checks["revocation"].ok and "invalid_client" in checks["revocation"].message


def test_rotating_the_credentials_key_reseals_every_connection_and_they_keep_working(
    driver, double, ada, make_case, settings
):
    """A credential no configured key opens (the old key dropped too early) is reported and left as
    it was, for its user to reconnect or the old key to be put back."""
    driver.connect(ada)
    connection = RemoteConnection.objects.get(user=ada)
    before = raw_sealed(connection.pk)
    new_key = Fernet.generate_key().decode()
    settings.GRIDGATE_CREDENTIALS_KEY = [new_key]  # the old key dropped too early
    with pytest.raises(CommandError, match=f"ids {connection.pk}"):
        call_command("reseal_connections")
    assert raw_sealed(connection.pk) == before  # left as it was: the old key can still be put back
    settings.GRIDGATE_CREDENTIALS_KEY = [new_key, KEY]  # the new key first, the old one still opens
    call_command("reseal_connections")
    settings.GRIDGATE_CREDENTIALS_KEY = [new_key]  # the old key dropped
    (live,) = double.live_refresh_tokens("ada")
    assert Fernet(new_key).decrypt(raw_sealed(connection.pk).encode()).decode() == live
    credential_services.forget_access_tokens()  # the next call refreshes with the re-sealed token
    case = launched(driver.case(make_case, ada, "true"))
    assert case.status == CaseStatus.PENDING, case.last_error
    assert wait_for_terminal(case).status == CaseStatus.DONE


def test_r_cred_2_credentials_do_not_change_while_cases_of_the_pool_run(driver, double, ada, make_case, api, staff):
    case = make_case(user=ada, resource_class=driver.pool.classes.get(), command="true")
    Case.objects.filter(pk=case.pk).update(status=CaseStatus.RUNNING, remote_id="1@cluster")
    to_service = remote_for(double, credentials="service")
    refused = set_remote(api(staff), driver.pool, to_service)
    assert refused.status_code == 400 and "cannot change while cases of this pool" in str(refused.json())
    assert credential_services.needs_user_credentials(ResourcePool.objects.get(pk=driver.pool.pk))
    # Other edits of the remote still go through while they run.
    same = set_remote(api(staff), driver.pool, remote_for(double, partition="debug"))
    assert same.status_code == 200, same.content
    Case.objects.filter(pk=case.pk).update(status=CaseStatus.DONE, results_fetched=True)
    assert set_remote(api(staff), driver.pool, to_service).status_code == 200


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_refreshes_of_one_connection_never_use_a_refresh_token_twice(driver, double, ada):
    """Eight workers needing ada's token at once: each refresh waits for the previous one's rotated
    token (the connection's row lock), so none reuses a spent one, which would make the provider
    end the whole session."""
    driver.connect(ada)
    connection = RemoteConnection.objects.get(user=ada)
    double.fault("/auth/token", delay=0.1, times=8)  # widens the window in which they overlap

    def refresh(_):
        try:
            return credential_services._refresh(connection.pk, connection.generation)
        finally:
            db.close()  # each thread has its own connection

    with ThreadPoolExecutor(max_workers=8) as pool:
        tokens = list(pool.map(refresh, range(8)))
    assert len(set(tokens)) == 8
    assert RemoteConnection.objects.get(pk=connection.pk).state == ConnectionState.CONNECTED
    (live,) = double.live_refresh_tokens("ada")  # one chain of rotations, no reuse, session alive
    assert Fernet(KEY).decrypt(raw_sealed(connection.pk).encode()).decode() == live


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_refresh_and_a_disconnect_hold_the_connections_row_and_never_its_user_or_pool(driver, ada, monkeypatch):
    """The refresh calls the token endpoint with its row lock held (bounded by ``oauth.TIMEOUT``).
    Taken with the user and pool joined in, it locked their rows too: while an identity provider
    was slow, every insert naming the pool (an admission) or the user waited for it."""
    driver.connect(ada)
    connection, pool = RemoteConnection.objects.get(user=ada), driver.pool
    answers = locked_while(
        monkeypatch,
        oauth,
        "refresh",
        lambda: bool(credential_services._refresh(connection.pk, connection.generation)),
        [(RemoteConnection, connection.pk), (get_user_model(), ada.pk), (ResourcePool, pool.pk)],
    )
    assert answers == {
        ("RemoteConnection", connection.pk): True,
        ("User", ada.pk): False,
        ("ResourcePool", pool.pk): False,
        "result": True,
    }
    # Disconnecting deletes the row under its lock, the pool's row untouched.
    answers = locked_while(
        monkeypatch,
        RemoteConnection,
        "delete",
        lambda: credential_services.disconnect(user=ada, pool_id=pool.pk).revoked,
        [(RemoteConnection, connection.pk), (ResourcePool, pool.pk)],
    )
    assert answers == {("RemoteConnection", connection.pk): True, ("ResourcePool", pool.pk): False, "result": True}
