"""Per-user credentials on Qarnot: what is Qarnot's own (docs/backends.md "Per-user credentials").
What every provider does is proved in test_remote_contract.py over the Qarnot driver
(tests/backends/conftest.py), whose double checks every call about a case against its owner's
account (``expect_owner``).
"""

import pytest

from apps.backends import qarnot as qb
from apps.credentials import services as credential_services
from apps.credentials.models import ConnectionState, RemoteConnection
from apps.resources.models import ResourceClass, ResourcePool
from tests.backends.conftest import QarnotDriver

pytestmark = pytest.mark.django_db

PROVIDER = "qarnot"  # the ``driver`` fixture's
SERVICE_TOKEN = "qarnot-TOKEN-value-9f8e7d"
(ADA_TOKEN,) = QarnotDriver.credentials["ada"]


@pytest.fixture
def double(driver):
    return driver.double


@pytest.fixture
def user_pool(driver):
    return driver.pool


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
    assert gone.status_code == 200 and gone.json() == QarnotDriver.disconnected
    assert not RemoteConnection.objects.exists() and ADA_TOKEN not in gone.content.decode()


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


def test_f3_a_connection_never_follows_its_pool_to_another_host(driver, user_pool, double, ada, staff, api, settings):
    """F3: a user with "change resource pool" moved a per-user Qarnot pool's cluster_url after ada
    connected; her next launch-options call sent her token to the new host. A connection now
    remembers the provider URLs it was made against and is not used after they change: ada is
    asked to reconnect, and the change is in the pool's admin history."""
    from django.contrib.admin.models import LogEntry

    settings.GRIDGATE_LAUNCH_OPTIONS_CACHE_SECONDS = 0
    assert "Token saved" in driver.paste(ada, ADA_TOKEN).content.decode()
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
    assert "Token saved" in driver.paste(ada, ADA_TOKEN).content.decode()  # she reconnects, knowingly
    assert RemoteConnection.objects.get(user=ada, pool=user_pool).provider_urls == {"cluster_url": double.url}


def test_f3_a_pool_moved_behind_the_services_back_still_gets_no_credential(driver, user_pool, ada):
    """F3: the check is made where the credential is used, whoever changed the pool (a shell, a
    migration): the connection is refused there too."""
    assert "Token saved" in driver.paste(ada, ADA_TOKEN).content.decode()
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
