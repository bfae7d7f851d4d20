"""Per-user credentials on FirecREST (docs/backends.md "Per-user credentials").

Everything on loopback: the FirecREST double issues per-user tokens (authorization code + PKCE,
rotating refresh tokens, revocation) and **checks on every call about a case that the token's
subject is the case owner's** (``expect_owner``); the ``double`` fixture fails the test if any
call was not (a job under the service account on a per-user pool fails here). The real
pyfirecrest client runs; the browser is played by the Django test client and httpx.
"""

import logging
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from cryptography.fernet import Fernet
from django.db import connection as db
from django.utils import timezone

from apps.backends import firecrest as fc
from apps.backends.firecrest import client as fc_client
from apps.cases import passes, workspace
from apps.cases.models import Case, CaseEvent, CaseStatus
from apps.credentials import sealing
from apps.credentials import services as credential_services
from apps.credentials.models import ConnectionState, RemoteConnection
from apps.resources.models import ResourceClass, ResourcePool
from apps.resources.remote import revocation_endpoint
from tests.backends.conftest import browser, owned_case, raw_sealed, wait_for_terminal, wait_until
from tests.cases.conftest import launched
from tests.doubles.firecrest_server import FirecrestDouble

pytestmark = pytest.mark.django_db

SECRET = "s3cr3t-client-VALUE-42"
KEY = Fernet.generate_key().decode()


@pytest.fixture(autouse=True)
def sealing_key(settings):
    settings.GRIDGATE_CREDENTIALS_KEY = [KEY]


@pytest.fixture
def double(tmp_path, monkeypatch):
    monkeypatch.setenv("GRIDGATE_CRED_FC_ID", "gridgate-client")
    monkeypatch.setenv("GRIDGATE_CRED_FC_SECRET", SECRET)
    monkeypatch.setattr(fc_client, "TIMEOUT", 5.0)
    fc._clients.clear()
    credential_services.forget_access_tokens()
    server = FirecrestDouble(tmp_path / "hpc", client_secret=SECRET).start()
    server.add_user("ada")
    server.add_user("bob")
    yield server
    server.reap()
    server.stop()
    fc._clients.clear()
    credential_services.forget_access_tokens()
    # The double refused (403) and recorded every call about a case made with another subject's
    # token than its owner's: there must be none.
    assert server.violations == []


def remote_for(double, **extra):
    return {
        "api_url": double.url,
        "token_uri": double.token_uri,
        "authorization_uri": double.authorization_uri,
        "system_name": double.system,
        "partition": "debug",
        "working_root": str(double.fs_root / "scratch"),
        "client_id_env": "GRIDGATE_CRED_FC_ID",
        "client_secret_env": "GRIDGATE_CRED_FC_SECRET",
        **extra,
    }


@pytest.fixture
def user_pool(double):
    pool = ResourcePool(name="daint-users", kind="firecrest", public=True, remote=remote_for(double))
    pool.full_clean()  # valid as written: no "credentials" key means each user's own
    pool.save()
    ResourceClass.objects.create(pool=pool, name="node", cpu=1, memory=1, default=True)
    return pool


def connect(client, double, pool, name):
    """The connect round trip: Gridgate → the provider's authorize endpoint (signed in as
    ``name``) → back to the callback. Returns (redirect to the provider, provider's redirect,
    the callback's answer)."""
    double.login_as = name
    start = client.post(f"/connections/{pool.pk}/connect/")
    assert start.status_code == 302, start.content
    provider = httpx.get(start["Location"], follow_redirects=False)
    assert provider.status_code == 302, provider.text
    back = urlsplit(provider.headers["location"])
    assert back.path == "/connections/callback/"
    done = client.get(f"{back.path}?{back.query}")
    assert done.status_code == 302
    return start, provider, done


def new_case(make_case, user, pool, command, double, *, inputs=None):
    return owned_case(make_case, user, pool, command, double, user.username, inputs=inputs)


# -- connecting ----------------------------------------------------------------------------------
def test_connect_round_trip_checks_the_state_sends_the_pkce_verifier_and_keeps_the_refresh_token_sealed(
    user_pool, double, ada
):
    client = browser(ada)
    double.login_as = "ada"
    start = client.post(f"/connections/{user_pool.pk}/connect/")
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
    assert "Connected to daint-users as ada" in done.content.decode()
    connection = RemoteConnection.objects.get(user=ada, pool=user_pool)
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


def test_a_callback_whose_code_the_provider_refuses_keeps_nothing(user_pool, double, ada):
    client = browser(ada)
    double.login_as = "ada"
    start = client.post(f"/connections/{user_pool.pk}/connect/")
    state = parse_qs(urlsplit(start["Location"]).query)["state"][0]
    answer = client.get(f"/connections/callback/?code=made-up&state={state}", follow=True)
    assert "Connecting was refused" in answer.content.decode() and "Code not valid" in answer.content.decode()
    assert not RemoteConnection.objects.exists()


def test_a_provider_account_other_than_the_linked_identity_is_refused(user_pool, double, ada):
    """docs/identity.md: an operator links a user to their identity (issuer, subject); connecting
    as someone else at that provider is refused."""
    from apps.accounts.models import Identity

    Identity.objects.create(user=ada, issuer=double.issuer, subject=double.subject_of("ada"))
    _start, _provider, done = connect(browser(ada), double, user_pool, "bob")  # signed in there as bob
    assert not RemoteConnection.objects.exists()
    connect(browser(ada), double, user_pool, "ada")
    assert RemoteConnection.objects.get(user=ada).subject == double.subject_of("ada")


# -- running cases under the owner's token -------------------------------------------------------
def test_a_case_is_launched_polled_and_fetched_under_its_owners_token(user_pool, double, ada, make_case, api):
    connect(browser(ada), double, user_pool, "ada")
    case = new_case(make_case, ada, user_pool, "cat in.txt > out.txt; echo hello", double)
    case = launched(case)
    assert case.status == CaseStatus.PENDING, case.last_error
    case = wait_for_terminal(case)
    assert case.status == CaseStatus.DONE, case.last_error
    assert (workspace.case_dir(case.id) / "results" / "out.txt").read_text() == "input\n"
    assert "hello" in (workspace.case_dir(case.id) / "stdout.log").read_text()
    (job,) = double.user_jobs()
    assert job.owner == double.subject_of("ada")
    # Item 5: the identity it ran under, on the case (API, admin) and in its history.
    label = f"user ada (subject {double.subject_of('ada')})"
    assert case.remote_identity == label
    assert api(ada).get(f"/api/v1/cases/{case.id}/").json()["remote_identity"] == label
    submitted = case.events.get(to_status=CaseStatus.PENDING)
    assert submitted.message == f"submitted as {case.remote_id} under {label}"
    events = api(ada).get(f"/api/v1/cases/{case.id}/events/").json()["results"]
    assert any(label in event["message"] for event in events)


def test_two_users_cases_on_one_pool_each_run_under_their_own_subject(user_pool, double, ada, bob, make_case):
    connect(browser(ada), double, user_pool, "ada")
    connect(browser(bob), double, user_pool, "bob")
    mine = launched(new_case(make_case, ada, user_pool, "echo ada > who.txt", double))
    theirs = launched(new_case(make_case, bob, user_pool, "echo bob > who.txt", double))
    assert mine.status == theirs.status == CaseStatus.PENDING
    before = len(double.status_calls())
    passes.poll_pass(case_ids=[mine.id, theirs.id])
    # R-BACK-4 per credential: one listing per user (each user's listing shows only their jobs).
    assert double.status_calls()[before:] == [f"/compute/{double.system}/jobs"] * 2
    mine, theirs = wait_for_terminal(mine), wait_for_terminal(theirs)
    assert mine.status == theirs.status == CaseStatus.DONE
    owners = {job.name: job.owner for job in double.user_jobs()}
    assert owners == {str(mine.id): double.subject_of("ada"), str(theirs.id): double.subject_of("bob")}
    assert "ada" in mine.remote_identity and "bob" in theirs.remote_identity
    for case, name in ((mine, "ada"), (theirs, "bob")):
        assert (workspace.case_dir(case.id) / "results" / "who.txt").read_text() == f"{name}\n"


def test_refresh_token_rotation_is_stored_back_sealed(user_pool, double, ada, make_case):
    connect(browser(ada), double, user_pool, "ada")
    connection = RemoteConnection.objects.get(user=ada)
    (first,) = double.live_refresh_tokens("ada")
    first_refreshed = connection.last_refreshed_at
    credential_services.forget_access_tokens()  # a worker process without the token: it must refresh
    case = launched(new_case(make_case, ada, user_pool, "true", double))
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


def test_revoked_connection_fails_the_launch_with_the_reconnect_message_and_polls_keep_the_state(
    user_pool, double, ada, make_case, api
):
    connect(browser(ada), double, user_pool, "ada")
    running = launched(
        new_case(make_case, ada, user_pool, "echo started; while [ ! -e go ]; do sleep 0.1; done; echo done", double)
    )
    work = double.fs_root / "scratch" / str(running.id) / "work"
    wait_until(lambda: (double.fs_root / "scratch" / str(running.id) / "stdout").exists(), what="the job to start")
    passes.poll_pass(case_ids=[running.id])
    running.refresh_from_db()
    assert running.status == CaseStatus.RUNNING

    double.revoke_user("ada")  # e.g. an administrator ended ada's sessions at the provider
    # A launch the worker carries out with the revoked grant fails, saying where to reconnect.
    second = launched(new_case(make_case, ada, user_pool, "true", double))
    assert second.status == CaseStatus.FAILED
    assert "has expired or was revoked" in second.last_error and "reconnect at /connections/" in second.last_error
    assert RemoteConnection.objects.get(user=ada).state == ConnectionState.FAILED

    # Polls keep the running case as it is: no failure counted, no transition, a note saying why.
    Case.objects.filter(pk=running.pk).update(next_poll_at=None)
    for _ in range(3):
        passes.poll_pass(case_ids=[running.id])
    running.refresh_from_db()
    assert running.status == CaseStatus.RUNNING and running.poll_failures == 0
    assert running.status_message.startswith("waiting for its owner to reconnect")
    assert "/connections/" in running.status_message
    notes = running.events.filter(kind=CaseEvent.Kind.NOTE, message__startswith="waiting for its owner")
    assert notes.count() == 1  # said once, not at every poll
    assert api(ada).get(f"/api/v1/cases/{running.id}/").json()["status_message"] == running.status_message

    # Now that the failure is known, a launch is refused up front with the same advice (403).
    third = new_case(make_case, ada, user_pool, "true", double)
    refused = api(ada).post(f"/api/v1/cases/{third.id}/launch/", {}, format="json")
    assert refused.status_code == 403 and refused.json()["connect_url"] == "/connections/"
    assert "reconnect at /connections/" in refused.json()["detail"]
    # Only the owner's own credential may act on their job: a cancel waits for the reconnect too.
    cancel = api(ada).post(f"/api/v1/cases/{running.id}/cancel/")
    assert cancel.status_code == 409 and "until its owner reconnects" in cancel.json()["detail"]
    running.refresh_from_db()
    assert running.status == CaseStatus.RUNNING
    (work / "go").write_text("")


def test_reconnecting_resumes_the_waiting_cases(user_pool, double, ada, make_case):
    connect(browser(ada), double, user_pool, "ada")
    case = launched(
        new_case(make_case, ada, user_pool, "echo started; while [ ! -e go ]; do sleep 0.1; done; echo done", double)
    )
    double.revoke_user("ada")
    passes.poll_pass(case_ids=[case.id])
    case.refresh_from_db()
    assert case.status == CaseStatus.PENDING and case.status_message.startswith("waiting for its owner")
    waiting_until = case.next_poll_at

    (double.fs_root / "scratch" / str(case.id) / "work" / "go").write_text("")
    connect(browser(ada), double, user_pool, "ada")  # reconnect: a new grant
    case.refresh_from_db()
    assert case.next_poll_at < waiting_until  # made due at once, not at the end of the back-off
    assert RemoteConnection.objects.get(user=ada).state == ConnectionState.CONNECTED
    case = wait_for_terminal(case)
    assert case.status == CaseStatus.DONE and case.status_message == ""
    assert "done" in (workspace.case_dir(case.id) / "stdout.log").read_text()


def test_launch_without_a_connection_is_refused_naming_the_connections_page(user_pool, double, ada, make_case, api):
    case = new_case(make_case, ada, user_pool, "true", double)
    response = api(ada).post(f"/api/v1/cases/{case.id}/launch/", {}, format="json")
    assert response.status_code == 403
    assert "connect it first at /connections/" in response.json()["detail"]
    case.refresh_from_db()
    assert case.status == CaseStatus.PREPARED and case.launch_requested_at is None
    assert double.user_jobs() == []


def test_service_account_pools_record_the_service_identity(double, ada, make_case):
    pool = ResourcePool.objects.create(
        name="daint-service", kind="firecrest", public=True, remote=remote_for(double, credentials="service")
    )
    ResourceClass.objects.create(pool=pool, name="node", cpu=1, memory=1, default=True)
    case = launched(make_case(user=ada, resource_class=pool.classes.get(), command="true"))
    assert case.status == CaseStatus.PENDING, case.last_error
    assert case.remote_identity == "service account (GRIDGATE_CRED_FC_ID)"
    assert double.user_jobs()[0].owner == "service-account-gridgate-client"
    assert not RemoteConnection.objects.exists() and "authorization_code" not in double.grants
    assert wait_for_terminal(case).status == CaseStatus.DONE


# -- secrets --------------------------------------------------------------------------------------
def test_secrets_never_appear_in_responses_logs_schema_or_admin(
    user_pool, double, ada, make_case, api, admin_client, caplog
):
    caplog.set_level(logging.DEBUG)
    client = browser(ada)
    start, provider, done = connect(client, double, user_pool, "ada")
    connection = RemoteConnection.objects.get(user=ada)
    credential_services.forget_access_tokens()
    case = wait_for_terminal(launched(new_case(make_case, ada, user_pool, "echo out", double)))
    assert case.status == CaseStatus.DONE
    double.revoke_user("ada")
    credential_services.forget_access_tokens()
    failed = launched(new_case(make_case, ada, user_pool, "true", double))
    assert failed.status == CaseStatus.FAILED

    pages = [
        start,
        done,
        client.get("/connections/"),
        api(ada).get("/api/v1/connections/"),
        api(ada).get(f"/api/v1/connections/{user_pool.pk}/"),
        api(ada).get(f"/api/v1/cases/{case.id}/"),
        api(ada).get(f"/api/v1/cases/{case.id}/events/"),
        api(ada).get(f"/api/v1/cases/{failed.id}/"),
        api(ada).get("/api/schema/"),
        admin_client.get("/admin/credentials/remoteconnection/"),
        admin_client.get(f"/admin/credentials/remoteconnection/{connection.pk}/change/"),
        admin_client.get(f"/admin/cases/case/{case.id}/change/"),
    ]
    secrets = list(double.refresh_tokens) + [
        token for token, subject in double.token_subjects.items() if subject == double.subject_of("ada")
    ]
    assert len(secrets) >= 4
    sealed = raw_sealed(connection.pk)
    texts = [page.content.decode() + str(dict(page.items())) for page in pages] + [caplog.text, failed.last_error]
    for text in texts:
        for secret in [*secrets, sealed, KEY]:
            assert secret not in text
    assert all(page.status_code in (200, 302) for page in pages)
    assert "sealed_secret" not in pages[8].content.decode()  # not in the OpenAPI schema either
    assert double.verifiers[-1] not in caplog.text


def test_staff_see_connections_in_the_admin_and_can_delete_them(user_pool, double, ada, admin_client):
    connect(browser(ada), double, user_pool, "ada")
    connection = RemoteConnection.objects.get(user=ada)
    listing = admin_client.get("/admin/credentials/remoteconnection/").content.decode()
    assert "ada" in listing and double.subject_of("ada") in listing
    assert admin_client.get("/admin/credentials/remoteconnection/add/").status_code == 403
    page = admin_client.get(f"/admin/credentials/remoteconnection/{connection.pk}/change/").content.decode()
    assert "sealed" not in page.lower() and 'name="sealed_secret"' not in page
    answer = admin_client.post(f"/admin/credentials/remoteconnection/{connection.pk}/delete/", {"post": "yes"})
    assert answer.status_code == 302 and not RemoteConnection.objects.exists()
    assert double.live_refresh_tokens("ada") == [] and double.revocations == ["refresh_token"]


def test_deleting_several_connections_in_the_admin_revokes_each_grant(user_pool, double, ada, bob, admin_client):
    connect(browser(ada), double, user_pool, "ada")
    connect(browser(bob), double, user_pool, "bob")
    ids = [str(pk) for pk in RemoteConnection.objects.values_list("pk", flat=True)]
    answer = admin_client.post(
        "/admin/credentials/remoteconnection/",
        {"action": "delete_selected", "_selected_action": ids, "post": "yes"},
        follow=True,
    )
    assert answer.status_code == 200 and "has revoked it" in answer.content.decode()
    assert not RemoteConnection.objects.exists()
    assert double.live_refresh_tokens("ada") == [] and double.live_refresh_tokens("bob") == []


# -- disconnecting revokes the grant at the provider (RFC 7009) --------------------------------------
def test_disconnecting_revokes_the_grant_at_the_identity_provider_and_no_other(user_pool, double, ada, bob, api):
    connect(browser(ada), double, user_pool, "ada")
    connect(browser(bob), double, user_pool, "bob")
    assert double.live_refresh_tokens("ada")
    answer = api(ada).delete(f"/api/v1/connections/{user_pool.pk}/")
    assert answer.status_code == 200
    assert answer.json() == {
        "revoked": True,
        "detail": "Gridgate no longer holds the grant, and the identity provider has revoked it.",
    }
    assert double.revocations == ["refresh_token"]
    assert double.live_refresh_tokens("ada") == []  # the provider's session is over
    assert double.live_refresh_tokens("bob") and RemoteConnection.objects.filter(user=bob).exists()


def test_the_rotated_refresh_token_is_the_one_revoked(user_pool, double, ada, make_case):
    connect(browser(ada), double, user_pool, "ada")
    first = double.live_refresh_tokens("ada")
    credential_services.forget_access_tokens()  # the launch runs the refresh grant
    case = wait_for_terminal(launched(new_case(make_case, ada, user_pool, "true", double)))  # a refresh grant
    assert case.status == CaseStatus.DONE
    rotated = double.live_refresh_tokens("ada")
    assert rotated and rotated != first
    credential_services.disconnect(user=ada, pool_id=user_pool.pk)
    assert double.live_refresh_tokens("ada") == []


def test_when_the_provider_cannot_revoke_the_credential_is_still_forgotten_and_the_user_told(
    user_pool, double, ada, api, caplog
):
    caplog.set_level(logging.DEBUG)
    connect(browser(ada), double, user_pool, "ada")
    (token,) = double.live_refresh_tokens("ada")
    double.fault("/auth/revoke", status=503, body={"error": "temporarily_unavailable", "error_description": token})
    answer = api(ada).delete(f"/api/v1/connections/{user_pool.pk}/")
    assert answer.status_code == 200 and answer.json()["revoked"] is False
    detail = answer.json()["detail"]
    assert "revoking it failed (the identity provider refused (HTTP 503, temporarily_unavailable: ***))" in detail
    assert "end it at the identity provider" in detail
    assert not RemoteConnection.objects.exists()
    assert (
        token not in answer.content.decode() and token not in caplog.text and "revoking its grant failed" in caplog.text
    )


def test_a_pool_with_no_revocation_endpoint_says_the_grant_was_not_revoked(double, ada, api):
    remote = remote_for(double, token_uri=f"{double.url}/auth/issue", authorization_uri=double.authorization_uri)
    pool = ResourcePool.objects.create(name="no-revoke", kind="firecrest", public=True, remote=remote)
    RemoteConnection.objects.create(
        user=ada,
        pool=pool,
        sealed_secret=sealing.seal("rt-1"),
        subject="s",
        connected_at=timezone.now(),
        provider_urls=credential_services.provider_urls(pool),
    )
    answer = api(ada).delete(f"/api/v1/connections/{pool.pk}/").json()
    assert answer["revoked"] is False and "names no revocation endpoint (revocation_uri)" in answer["detail"]
    assert double.revocations == []


def test_the_revocation_endpoint_is_the_pools_or_keycloaks_beside_the_token_endpoint():
    keycloak = "https://idp.example.org/realms/hpc/protocol/openid-connect/token"
    assert revocation_endpoint({"token_uri": keycloak}) == keycloak[: -len("token")] + "revoke"
    assert revocation_endpoint({"token_uri": keycloak, "revocation_uri": "https://idp/x"}) == "https://idp/x"
    assert revocation_endpoint({"token_uri": "https://idp.example.org/oauth2/issue"}) is None


# -- the API and the page -------------------------------------------------------------------------
def test_api_lists_and_deletes_only_the_callers_own_connections(user_pool, double, ada, bob, api):
    connect(browser(ada), double, user_pool, "ada")
    connect(browser(bob), double, user_pool, "bob")
    (row,) = api(ada).get("/api/v1/connections/").json()
    assert row["pool"] == user_pool.pk and row["state"] == "connected"
    assert row["subject"] == double.subject_of("ada") and row["connect_url"] == "/connections/"
    assert set(row) == {
        "pool", "pool_name", "kind", "state", "subject", "connected_at", "last_refreshed_at", "failed_at",
        "failure", "connect_url",
    }  # fmt: skip
    assert api(ada).delete(f"/api/v1/connections/{user_pool.pk}/").status_code == 200
    assert api(ada).delete(f"/api/v1/connections/{user_pool.pk}/").status_code == 404
    assert api(ada).get("/api/v1/connections/").json()[0]["state"] == "not_connected"
    assert RemoteConnection.objects.filter(user=bob).exists()  # bob's is untouched


def test_the_connections_page_lists_pools_needing_credentials_with_their_state(user_pool, double, ada, local_pool):
    client = browser(ada)
    page = client.get("/connections/").content.decode()
    assert "daint-users" in page and "Not connected" in page and local_pool.name not in page
    connect(client, double, user_pool, "ada")
    RemoteConnection.objects.filter(user=ada).update(state=ConnectionState.FAILED, failure="Token is not active")
    page = client.get("/connections/").content.decode()
    assert "Failed: reconnect" in page and "Token is not active" in page and "Reconnect" in page
    assert "Your sign-in grant is revoked at the identity provider." in page  # the disconnect's confirmation
    page = client.post(f"/connections/{user_pool.pk}/disconnect/", follow=True).content.decode()
    assert not RemoteConnection.objects.exists()
    assert "Disconnected: Gridgate no longer holds the grant, and the identity provider has revoked it." in page


def test_without_the_credentials_key_connecting_is_refused_with_a_clear_message_and_the_app_still_starts(
    settings, user_pool, double, ada, api
):
    from django.core.management import call_command

    settings.GRIDGATE_CREDENTIALS_KEY = []
    call_command("check")  # the site starts without it
    client = browser(ada)
    page = client.get("/connections/")
    assert page.status_code == 200 and "GRIDGATE_CREDENTIALS_KEY" in page.content.decode()
    answer = client.post(f"/connections/{user_pool.pk}/connect/", follow=True)
    assert "the operators have not set GRIDGATE_CREDENTIALS_KEY" in answer.content.decode()
    assert double.grants == [] and not RemoteConnection.objects.exists()
    assert client.get("/").status_code == 200
    assert api(ada).get("/api/v1/connections/").status_code == 200


# -- the pool option --------------------------------------------------------------------------------
def test_the_credentials_option_is_validated_and_set_through_the_api_and_the_admin(api, staff, admin_client, double):
    client = api(staff)
    body = {"name": "fresh", "kind": "firecrest", "public": True, "remote": remote_for(double)}
    created = client.post("/api/v1/resource-pools/", body, format="json")
    assert created.status_code == 201, created.content
    pool = ResourcePool.objects.get(name="fresh")
    assert credential_services.needs_user_credentials(pool)  # a new pool: each user's own, by default
    bad = client.patch(
        f"/api/v1/resource-pools/{pool.pk}/", {"remote": remote_for(double, credentials="x")}, format="json"
    )
    assert bad.status_code == 400 and "'credentials' must be 'user'" in str(bad.json())
    no_endpoint = remote_for(double, token_uri="https://idp.example.org/oauth2/issue")
    no_endpoint.pop("authorization_uri")
    refused = client.patch(f"/api/v1/resource-pools/{pool.pk}/", {"remote": no_endpoint}, format="json")
    assert refused.status_code == 400 and "authorization_uri" in str(refused.json())
    service = client.patch(
        f"/api/v1/resource-pools/{pool.pk}/", {"remote": remote_for(double, credentials="service")}, format="json"
    )
    assert service.status_code == 200 and service.json()["remote"]["credentials"] == "service"
    pool.refresh_from_db()
    assert not credential_services.needs_user_credentials(pool)

    import json

    from tests.resources.test_admin import inline_data, pool_form

    remote = json.dumps({"profile": "docker-batch", "credentials": "service"})
    data = pool_form(kind="qarnot", remote=remote, name="via-admin") | inline_data([])
    answer = admin_client.post("/admin/resources/resourcepool/add/", data)
    assert answer.status_code == 302, answer.content.decode()[:2000]
    assert ResourcePool.objects.get(name="via-admin").remote["credentials"] == "service"
    refused = admin_client.post(
        "/admin/resources/resourcepool/add/",
        pool_form(kind="qarnot", remote='{"profile": "p", "credentials": "everyone"}', name="bad") | inline_data([]),
    )
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


def test_doctor_of_a_per_user_pool_checks_the_key_and_the_public_client(user_pool, double, settings):
    checks = {check.name: check for check in fc.FirecrestBackend().doctor(user_pool)}
    assert checks["credentials"].ok and checks["authorization"].ok and checks["client"].ok, checks
    assert checks["revocation"].ok and checks["revocation"].message.endswith(f"{double.url}/auth/revoke")
    double.public_client_id = "renamed"
    settings.GRIDGATE_CREDENTIALS_KEY = []
    checks = {check.name: check for check in fc.FirecrestBackend().doctor(user_pool)}
    assert not checks["credentials"].ok and "GRIDGATE_CREDENTIALS_KEY" in checks["credentials"].message
    assert not checks["client"].ok and "public client gridgate-firecrest" in checks["client"].message
    assert not checks["revocation"].ok and "invalid_client" in checks["revocation"].message


def test_doctor_says_when_disconnecting_cannot_revoke_grants(double):
    remote = remote_for(double, token_uri=f"{double.url}/auth/issue")
    pool = ResourcePool.objects.create(name="no-revoke", kind="firecrest", public=True, remote=remote)
    checks = {check.name: check for check in fc.FirecrestBackend().doctor(pool)}
    assert not checks["revocation"].ok
    assert checks["revocation"].message == (
        "disconnecting cannot revoke users' grants: this pool names no revocation endpoint (revocation_uri): "
        "set revocation_uri"
    )


def test_rotating_the_credentials_key_reseals_every_connection_and_they_keep_working(
    user_pool, double, ada, make_case, settings
):
    from django.core.management import call_command

    connect(browser(ada), double, user_pool, "ada")
    connection = RemoteConnection.objects.get(user=ada)
    new_key = Fernet.generate_key().decode()
    settings.GRIDGATE_CREDENTIALS_KEY = [new_key, KEY]  # the new key first, the old one still opens
    call_command("reseal_connections")
    settings.GRIDGATE_CREDENTIALS_KEY = [new_key]  # the old key dropped
    (live,) = double.live_refresh_tokens("ada")
    assert Fernet(new_key).decrypt(raw_sealed(connection.pk).encode()).decode() == live
    credential_services.forget_access_tokens()  # the next call refreshes with the re-sealed token
    case = launched(new_case(make_case, ada, user_pool, "true", double))
    assert case.status == CaseStatus.PENDING, case.last_error
    assert wait_for_terminal(case).status == CaseStatus.DONE


def test_a_credential_no_configured_key_opens_is_reported_and_left_for_its_user_to_reconnect(
    user_pool, double, ada, settings
):
    from django.core.management import CommandError, call_command

    connect(browser(ada), double, user_pool, "ada")
    connection = RemoteConnection.objects.get(user=ada)
    before = raw_sealed(connection.pk)
    settings.GRIDGATE_CREDENTIALS_KEY = [Fernet.generate_key().decode()]  # the old key dropped too early
    with pytest.raises(CommandError, match=f"ids {connection.pk}"):
        call_command("reseal_connections")
    assert raw_sealed(connection.pk) == before  # left as it was: the old key can still be put back


def test_r_cred_2_credentials_do_not_change_while_cases_of_the_pool_run(user_pool, double, ada, make_case, api, staff):
    case = make_case(user=ada, resource_class=user_pool.classes.get(), command="true")
    Case.objects.filter(pk=case.pk).update(status=CaseStatus.RUNNING, remote_id="1@cluster")
    to_service = {"remote": remote_for(double, credentials="service")}
    refused = api(staff).patch(f"/api/v1/resource-pools/{user_pool.pk}/", to_service, format="json")
    assert refused.status_code == 400 and "cannot change while cases of this pool" in str(refused.json())
    assert credential_services.needs_user_credentials(ResourcePool.objects.get(pk=user_pool.pk))
    # Other edits of the remote still go through while they run.
    same = api(staff).patch(
        f"/api/v1/resource-pools/{user_pool.pk}/", {"remote": remote_for(double, partition="debug")}, format="json"
    )
    assert same.status_code == 200, same.content
    Case.objects.filter(pk=case.pk).update(status=CaseStatus.DONE, results_fetched=True)
    assert api(staff).patch(f"/api/v1/resource-pools/{user_pool.pk}/", to_service, format="json").status_code == 200


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_refreshes_of_one_connection_never_use_a_refresh_token_twice(user_pool, double, ada):
    """Eight workers needing ada's token at once: each refresh waits for the previous one's rotated
    token (the connection's row lock), so none reuses a spent one, which would make the provider
    end the whole session."""
    from concurrent.futures import ThreadPoolExecutor

    connect(browser(ada), double, user_pool, "ada")
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


# -- the launch form asks with the user's own credential ------------------------------------------
def test_a_connected_user_chooses_among_the_partitions_their_own_account_sees(user_pool, double, ada, bob, api):
    from apps.backends.services import check_launch_options
    from apps.core.exceptions import Invalid

    double.partitions = ["debug", "normal", "gpu"]
    url = f"/api/v1/resource-classes/{user_pool.classes.get().pk}/launch-options/"

    def partitions(user):
        (option,) = [o for o in api(user).get(url).json()["options"] if o["key"] == "partition"]
        return [choice["value"] for choice in option["choices"]]

    assert partitions(ada) == ["debug"]  # not connected yet: the pool's own partition
    connect(browser(ada), double, user_pool, "ada")
    asked = len(double.calls)
    assert partitions(ada) == ["debug", "normal", "gpu"]  # asked under ada's own token
    assert ("GET", f"/status/{double.system}/partitions") in double.calls[asked:]
    assert partitions(bob) == ["debug"]  # ada's answer (cached for her) is not bob's
    resource_class = user_pool.classes.get()
    assert check_launch_options(resource_class, {"partition": "gpu"}, ada) == {"partition": "gpu"}
    with pytest.raises(Invalid, match="one of debug"):
        check_launch_options(resource_class, {"partition": "gpu"}, bob)
    RemoteConnection.objects.filter(user=ada).update(state=ConnectionState.FAILED)
    assert partitions(ada) == ["debug"]  # a failed connection asks nothing


def test_f3_a_refresh_token_never_goes_to_a_token_uri_the_pool_was_moved_to(double, user_pool, ada, monkeypatch):
    """F3: FirecREST's token_uri would have received users' refresh tokens the same way a moved
    Qarnot cluster_url received API tokens. The refresh grant reads the connection and the pool
    under the row lock and refuses (reconnect) when the URLs differ from those it was made with."""
    from apps.credentials import oauth

    connect(browser(ada), double, user_pool, "ada")
    connection = RemoteConnection.objects.get(user=ada, pool=user_pool)
    sent = []
    monkeypatch.setattr(oauth, "refresh", lambda remote, token: sent.append((remote["token_uri"], token)))
    ResourcePool.objects.filter(pk=user_pool.pk).update(
        remote=dict(user_pool.remote, token_uri="https://collector.example.org/token")
    )
    with pytest.raises(credential_services.CredentialsRequired, match="other provider URLs"):
        credential_services._refresh(connection.pk, connection.generation)
    assert sent == []
