"""Per-user credentials on Qarnot (docs/backends.md "Per-user credentials").

The user pastes their API token once on the connections page; it is checked against the API and
kept sealed. The Qarnot double knows several accounts (token → e-mail) and checks **every call
about a case** (its task, by name or uuid, and its buckets, by the S3 access key the SDK signs
with: the account's e-mail) against the case owner's account (``expect_owner``); the fixture fails
the test on any call that was not.
"""

import logging

import pytest
from cryptography.fernet import Fernet

from apps.backends import qarnot as qb
from apps.backends.qarnot import client as qb_client
from apps.cases import passes, workspace
from apps.cases.models import Case, CaseStatus
from apps.credentials import services as credential_services
from apps.credentials.models import ConnectionState, RemoteConnection
from apps.resources.models import ResourceClass, ResourcePool
from tests.backends.conftest import browser, owned_case, raw_sealed, wait_for_terminal
from tests.cases.conftest import launched
from tests.doubles.qarnot_server import QarnotDouble

pytestmark = pytest.mark.django_db

SERVICE_TOKEN = "qarnot-TOKEN-value-9f8e7d"
ADA_TOKEN = "qarnot-ada-PERSONAL-token-1a2b3c"
BOB_TOKEN = "qarnot-bob-PERSONAL-token-4d5e6f"
KEY = Fernet.generate_key().decode()


@pytest.fixture(scope="module")
def double():
    server = QarnotDouble(token=SERVICE_TOKEN).start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def fresh(double, monkeypatch, settings):
    settings.GRIDGATE_CREDENTIALS_KEY = [KEY]
    monkeypatch.setenv("GRIDGATE_CRED_QARNOT_TOKEN", SERVICE_TOKEN)
    monkeypatch.setattr(qb_client, "RETRY_WAIT", 0.01)
    monkeypatch.setattr(qb_client, "TIMEOUT", 3)
    qb._connections.clear()
    double.faults.clear()
    # moto's buckets are one store per process, shared with test_qarnot.py's double: no limit here.
    double.user = {"email": "gridgate@example.org", "maxBucket": 100_000, "quotaBytesBucket": 10 << 30}
    double.accounts = {SERVICE_TOKEN: "gridgate@example.org"}
    double.add_account(ADA_TOKEN, "ada@example.org")
    double.add_account(BOB_TOKEN, "bob@example.org")
    double.case_owners.clear()
    double.violations.clear()
    yield
    double.reap()
    qb._connections.clear()
    assert double.violations == []  # every call about a case came from its owner's account


@pytest.fixture
def user_pool(double):
    pool = ResourcePool(
        name="qarnot-users",
        kind="qarnot",
        public=True,
        remote={"profile": "docker-batch", "cluster_url": double.url, "snapshot_interval": 1, "max_upload_mb": 1},
    )
    pool.full_clean()
    pool.save()
    ResourceClass.objects.create(pool=pool, name="4c", cpu=4, memory=8, default=True)
    return pool


def paste(user, pool, token):
    return browser(user).post(f"/connections/{pool.pk}/token/", {"token": token}, follow=True)


def test_a_pasted_token_runs_that_users_case_under_their_account(user_pool, double, ada, make_case, api):
    answer = paste(ada, user_pool, ADA_TOKEN)
    assert "Token saved for qarnot-users (Qarnot account ada@example.org)" in answer.content.decode()
    connection = RemoteConnection.objects.get(user=ada, pool=user_pool)
    assert connection.subject == "ada@example.org" and connection.state == ConnectionState.CONNECTED
    case = launched(owned_case(make_case, ada, user_pool, "cat in.txt > out.txt", double, "ada@example.org"))
    assert case.status == CaseStatus.PENDING, case.last_error
    case = wait_for_terminal(case, timeout=90)
    assert case.status == CaseStatus.DONE, case.last_error
    assert (workspace.case_dir(case.id) / "results" / "out.txt").read_text() == "input\n"
    assert double.tasks[case.remote_id].owner == "ada@example.org"
    label = "user ada (Qarnot account ada@example.org)"
    assert case.remote_identity == label
    assert api(ada).get(f"/api/v1/cases/{case.id}/").json()["remote_identity"] == label
    assert f"under {label}" in browser(ada).get(f"/cases/{case.id}/").content.decode()
    assert case.events.filter(message__endswith=f"under {label}").exists()


def test_two_users_qarnot_cases_each_use_their_own_token(user_pool, double, ada, bob, make_case):
    paste(ada, user_pool, ADA_TOKEN)
    paste(bob, user_pool, BOB_TOKEN)
    mine = launched(owned_case(make_case, ada, user_pool, "echo ada", double, "ada@example.org"))
    theirs = launched(owned_case(make_case, bob, user_pool, "echo bob", double, "bob@example.org"))
    mine, theirs = wait_for_terminal(mine, timeout=90), wait_for_terminal(theirs, timeout=90)
    assert mine.status == theirs.status == CaseStatus.DONE
    assert double.tasks[mine.remote_id].owner == "ada@example.org"
    assert double.tasks[theirs.remote_id].owner == "bob@example.org"


def test_a_token_qarnot_refuses_is_not_kept(user_pool, double, ada):
    answer = paste(ada, user_pool, "not-a-token-of-anyone")
    assert "Qarnot refused this token" in answer.content.decode()
    assert not RemoteConnection.objects.exists()


def test_a_revoked_token_makes_polls_wait_and_a_new_token_resumes_them(user_pool, double, ada, make_case):
    paste(ada, user_pool, ADA_TOKEN)
    double.hold = {"FullyExecuting"}
    try:
        case = launched(owned_case(make_case, ada, user_pool, "echo hi", double, "ada@example.org"))
        assert case.status == CaseStatus.PENDING, case.last_error
        double.revoke(ADA_TOKEN)  # deleted in Qarnot's console
        qb._connections.clear()  # a new worker process: no connection kept from before
        for _ in range(2):
            Case.objects.filter(pk=case.pk).update(next_poll_at=None)
            passes.poll_pass(case_ids=[case.id])
        case.refresh_from_db()
        assert case.status == CaseStatus.PENDING and case.poll_failures == 0
        assert case.status_message.startswith("waiting for its owner to reconnect")
        assert "reconnect at /connections/" in case.status_message
        assert RemoteConnection.objects.get(user=ada).state == ConnectionState.FAILED
        double.add_account("qarnot-ada-NEW-token-777", "ada@example.org")
        paste(ada, user_pool, "qarnot-ada-NEW-token-777")
    finally:
        double.hold = set()
    case = wait_for_terminal(case, timeout=90)
    assert case.status == CaseStatus.DONE and case.status_message == ""


def test_the_api_token_never_appears_in_responses_logs_or_the_admin_and_is_stored_sealed(
    user_pool, double, ada, make_case, api, admin_client, caplog
):
    caplog.set_level(logging.DEBUG)
    pasted = paste(ada, user_pool, ADA_TOKEN)
    connection = RemoteConnection.objects.get(user=ada)
    case = wait_for_terminal(launched(owned_case(make_case, ada, user_pool, "true", double, "ada@example.org")))
    double.revoke(ADA_TOKEN)
    qb._connections.clear()
    failed = launched(owned_case(make_case, ada, user_pool, "true", double, "ada@example.org"))
    assert failed.status == CaseStatus.FAILED and "reconnect at /connections/" in failed.last_error
    sealed = raw_sealed(connection.pk)
    assert ADA_TOKEN not in sealed and Fernet(KEY).decrypt(sealed.encode()).decode() == ADA_TOKEN
    pages = [
        pasted,
        browser(ada).get("/connections/"),
        api(ada).get("/api/v1/connections/"),
        api(ada).get(f"/api/v1/cases/{case.id}/"),
        api(ada).get(f"/api/v1/cases/{failed.id}/events/"),
        api(ada).get("/api/schema/"),
        admin_client.get("/admin/credentials/remoteconnection/"),
        admin_client.get(f"/admin/credentials/remoteconnection/{connection.pk}/change/"),
    ]
    for text in [page.content.decode() for page in pages] + [caplog.text, failed.last_error]:
        assert ADA_TOKEN not in text and sealed not in text


def test_without_the_key_pasting_a_token_is_refused_with_a_clear_message(user_pool, double, ada, settings):
    settings.GRIDGATE_CREDENTIALS_KEY = []
    answer = paste(ada, user_pool, ADA_TOKEN)
    assert "the operators have not set GRIDGATE_CREDENTIALS_KEY" in answer.content.decode()
    assert not RemoteConnection.objects.exists()


def test_service_account_qarnot_pools_are_unchanged(double, ada, make_case, monkeypatch):
    pool = ResourcePool.objects.create(
        name="qarnot-service",
        kind="qarnot",
        public=True,
        remote={"profile": "docker-batch", "cluster_url": double.url, "credentials": "service", "max_upload_mb": 1},
    )
    ResourceClass.objects.create(pool=pool, name="4c", cpu=4, memory=8, default=True)
    case = launched(make_case(user=ada, resource_class=pool.classes.get(), command="true"))
    assert case.status == CaseStatus.PENDING, case.last_error
    assert case.remote_identity == "service account (GRIDGATE_CRED_QARNOT_TOKEN)"
    assert double.tasks[case.remote_id].owner == "gridgate@example.org"
    assert wait_for_terminal(case, timeout=90).status == CaseStatus.DONE
    assert credential_services.identity_for(ada, pool).mode == "service"


def test_a_script_keeps_its_qarnot_token_through_the_api_and_never_gets_it_back(user_pool, double, ada, api):
    client = api(ada)
    url = f"/api/v1/connections/{user_pool.pk}/"
    refused = client.put(url, {"token": "not-a-token-of-anyone"}, format="json")
    assert refused.status_code == 400 and "Qarnot refused this token" in refused.json()["detail"]
    assert not RemoteConnection.objects.exists()
    wrong = client.put(url, {"client_id": "x", "client_secret": "y"}, format="json")
    assert wrong.status_code == 400 and "'token'" in str(wrong.json())
    answer = client.put(url, {"token": ADA_TOKEN}, format="json")
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert (body["state"], body["subject"]) == ("connected", "ada@example.org")
    assert ADA_TOKEN not in answer.content.decode()
    assert RemoteConnection.objects.get(user=ada, pool=user_pool).subject == "ada@example.org"
    gone = client.delete(url)
    assert gone.status_code == 200 and gone.json() == {
        "revoked": None,  # the user's own token: Gridgate forgets it, the user deletes it at Qarnot
        "detail": "Gridgate no longer holds the API token; it stays valid at the provider until its owner "
        "deletes it there.",
    }
    assert not RemoteConnection.objects.exists() and ADA_TOKEN not in gone.content.decode()


def test_a_connected_user_chooses_among_the_node_types_their_own_account_sees(user_pool, double, ada, bob, api):
    url = f"/api/v1/resource-classes/{user_pool.classes.get().pk}/launch-options/"

    def node_types(user):
        (option,) = [o for o in api(user).get(url).json()["options"] if o["key"] == "node_type"]
        return [choice["value"] for choice in option["choices"]]

    assert node_types(ada) == []  # not connected yet: the catalogue is per account
    paste(ada, user_pool, ADA_TOKEN)
    assert node_types(ada) == ["8c-32g-amd-rome", "16c-64g-intel"]  # read with ada's own token
    assert node_types(bob) == []


class Listener:
    """A host the pool is moved to: records the Authorization header of every request it gets."""

    def __init__(self):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        seen = self.seen = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                seen.append(self.headers.get("Authorization", ""))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"storage": null}')

            do_POST = do_GET  # noqa: N815

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def test_f3_a_connection_never_follows_its_pool_to_another_host(user_pool, double, ada, staff, api, settings):
    """F3: a user with "change resource pool" moved a per-user Qarnot pool's cluster_url after ada
    connected; her next launch-options call sent her token to the new host. A connection now
    remembers the provider URLs it was made against and is not used after they change: ada is
    asked to reconnect, and the change is in the pool's admin history."""
    from django.contrib.admin.models import LogEntry

    settings.GRIDGATE_LAUNCH_OPTIONS_CACHE_SECONDS = 0
    assert "Token saved" in paste(ada, user_pool, ADA_TOKEN).content.decode()
    elsewhere = Listener()
    try:
        remote = dict(user_pool.remote, cluster_url=elsewhere.url)
        moved = api(staff).patch(f"/api/v1/resource-pools/{user_pool.pk}/", {"remote": remote}, format="json")
        assert moved.status_code == 200, moved.content
        qb._connections.clear()
        answer = api(ada).get(f"/api/v1/resource-classes/{user_pool.classes.get().pk}/launch-options/")
        assert answer.status_code == 200 and ADA_TOKEN not in " ".join(elsewhere.seen)  # her token went nowhere
        state = api(ada).get(f"/api/v1/connections/{user_pool.pk}/").json()
        assert state["state"] == "failed" and "provider URLs changed" in state["failure"]
    finally:
        elsewhere.stop()
    connection = RemoteConnection.objects.get(user=ada, pool=user_pool)
    assert connection.state == ConnectionState.FAILED and "cluster_url" in connection.failure
    entry = LogEntry.objects.get(object_id=str(user_pool.pk))
    assert entry.user == staff and f"cluster_url {double.url} → {elsewhere.url}" in entry.change_message
    assert "1 user connection(s) must reconnect" in entry.change_message

    back = dict(user_pool.remote, cluster_url=double.url)
    assert (
        api(staff).patch(f"/api/v1/resource-pools/{user_pool.pk}/", {"remote": back}, format="json").status_code == 200
    )
    assert "Token saved" in paste(ada, user_pool, ADA_TOKEN).content.decode()  # she reconnects, knowingly
    assert RemoteConnection.objects.get(user=ada, pool=user_pool).provider_urls == {"cluster_url": double.url}


def test_f3_a_pool_moved_behind_the_services_back_still_gets_no_credential(user_pool, ada):
    """F3: the check is made where the credential is used, whoever changed the pool (a shell, a
    migration): the connection is refused there too."""
    assert "Token saved" in paste(ada, user_pool, ADA_TOKEN).content.decode()
    ResourcePool.objects.filter(pk=user_pool.pk).update(
        remote=dict(user_pool.remote, cluster_url="https://elsewhere.example.org")
    )
    pool = ResourcePool.objects.get(pk=user_pool.pk)
    identity = credential_services.identity_for(ada, pool)
    with pytest.raises(credential_services.CredentialsRequired, match="other provider URLs"):
        identity.token()


@pytest.mark.credential_binding
def test_f8_a_pool_cannot_use_a_credential_variable_bound_to_another(double, staff, api, monkeypatch, settings):
    """F8: any pool could name another pool's GRIDGATE_CRED_ variable: whoever may change one pool
    pointed it at the service account of another, then at a host of theirs. A variable is now read
    only for the pools <NAME>_POOLS binds it to, which the environment sets, not a pool editor."""
    settings.GRIDGATE_LAUNCH_OPTIONS_CACHE_SECONDS = 0
    service = {"profile": "docker-batch", "cluster_url": double.url, "credentials": "service"}
    owned = ResourcePool.objects.create(name="render", kind="qarnot", public=True, remote=service)
    ResourceClass.objects.create(pool=owned, name="c", cpu=1, memory=1, default=True)
    monkeypatch.setenv("GRIDGATE_CRED_QARNOT_TOKEN_POOLS", str(owned.pk))
    elsewhere = Listener()
    try:
        theirs = ResourcePool.objects.create(
            name="mine",
            kind="qarnot",
            public=True,
            remote={**service, "cluster_url": elsewhere.url, "token_env": "GRIDGATE_CRED_QARNOT_TOKEN"},
        )
        ResourceClass.objects.create(pool=theirs, name="c", cpu=1, memory=1, default=True)
        qb._connections.clear()
        refused = api(staff).get(f"/api/v1/resource-classes/{theirs.classes.get().pk}/launch-options/").json()
        assert SERVICE_TOKEN not in " ".join(elsewhere.seen)  # the service's token went nowhere
        assert refused["degraded"] and f"GRIDGATE_CRED_QARNOT_TOKEN_POOLS={theirs.pk}" in refused["message"]
    finally:
        elsewhere.stop()
    allowed = api(staff).get(f"/api/v1/resource-classes/{owned.classes.get().pk}/launch-options/").json()
    assert not allowed["degraded"], allowed
