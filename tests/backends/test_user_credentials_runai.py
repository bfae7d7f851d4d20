"""Per-user credentials on Run:AI (docs/backends.md "Per-user credentials").

The user saves their own Run:AI access key (client id + secret) once on the connections page; it
is checked at the token endpoint and kept sealed. The Run:AI double knows several access keys
(client id → subject) and checks **every call about a case** (its workload, by name or id) against
the case owner's subject (``expect_owner``); the fixture fails the test on any call that was not.
"""

import json
import logging

import pytest
from cryptography.fernet import Fernet

from apps.backends import runai as rb
from apps.backends.runai import client as rb_client
from apps.cases import passes, workspace
from apps.cases.models import Case, CaseStatus
from apps.credentials import services as credential_services
from apps.credentials.models import ConnectionState, RemoteConnection
from apps.resources.models import ResourceClass, ResourcePool
from tests.backends.conftest import browser, owned_case, raw_sealed, wait_for_terminal
from tests.cases.conftest import launched
from tests.doubles.runai_server import RunaiDouble

pytestmark = pytest.mark.django_db

SERVICE_ID, SERVICE_SECRET = "gridgate-svc", "runai-SVC-secret-6e5d4c"
ADA_ID, ADA_SECRET = "ada-key", "runai-ada-PERSONAL-secret-1a2b3c"
BOB_ID, BOB_SECRET = "bob-key", "runai-bob-PERSONAL-secret-4d5e6f"
ADA_NEW_ID, ADA_NEW_SECRET = "ada-key-2", "runai-ada-RENEWED-secret-7a8b9c"
KEY = Fernet.generate_key().decode()


@pytest.fixture(scope="module")
def double():
    server = RunaiDouble(client_id=SERVICE_ID, client_secret=SERVICE_SECRET, subject="svc-gridgate").start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def fresh(double, monkeypatch, settings):
    settings.GRIDGATE_CREDENTIALS_KEY = [KEY]
    monkeypatch.setenv("GRIDGATE_CRED_RUNAI_CLIENT_ID", SERVICE_ID)
    monkeypatch.setenv("GRIDGATE_CRED_RUNAI_CLIENT_SECRET", SERVICE_SECRET)
    monkeypatch.setattr(rb_client, "BACKOFF", 0.01)
    rb._clients.clear()
    double.reset()
    double.add_client(ADA_ID, ADA_SECRET, "ada-subject", "ada@example.org")
    double.add_client(BOB_ID, BOB_SECRET, "bob-subject", "bob@example.org")
    yield
    double.reap()
    rb._clients.clear()
    assert double.violations == []  # every call about a case came from its owner's credential


@pytest.fixture
def user_pool(double, tmp_path):
    volume = tmp_path / "volume"
    volume.mkdir(mode=0o755)
    pool = ResourcePool(
        name="runai-users",
        kind="runai",
        public=True,
        remote={
            "base_url": double.url,
            "project": "team-a",
            "image": "registry.example.org/solver:1.2",
            "working_root": str(volume),
            "host_path": str(volume),
        },
    )
    pool.full_clean()
    pool.save()
    ResourceClass.objects.create(pool=pool, name="gpu", cpu=2, memory=4, gpu=1, default=True)
    return pool


def save_key(user, pool, client_id, secret):
    return browser(user).post(
        f"/connections/{pool.pk}/access-key/", {"client_id": client_id, "client_secret": secret}, follow=True
    )


def test_a_per_user_runai_pool_names_its_project():
    pool = ResourcePool(name="p", kind="runai", remote={"base_url": "https://runai.example.org"})
    with pytest.raises(Exception, match="'project' is required for per-user credentials"):
        pool.full_clean()


def test_a_saved_access_key_runs_that_users_case_under_their_account(user_pool, double, ada, make_case, api):
    answer = save_key(ada, user_pool, ADA_ID, ADA_SECRET)
    assert "Access key saved for runai-users (Run:AI account ada@example.org)" in answer.content.decode()
    connection = RemoteConnection.objects.get(user=ada, pool=user_pool)
    assert connection.subject == "ada-subject" and connection.state == ConnectionState.CONNECTED
    case = launched(owned_case(make_case, ada, user_pool, "cat in.txt > out.txt", double, "ada-subject"))
    assert case.status == CaseStatus.PENDING, case.last_error
    case = wait_for_terminal(case)
    assert case.status == CaseStatus.DONE, case.last_error
    assert (workspace.case_dir(case.id) / "results" / "out.txt").read_text() == "input\n"
    assert double.workloads[case.remote_id].owner == "ada-subject"
    assert case.remote_identity == "user ada (subject ada-subject)"
    assert api(ada).get(f"/api/v1/cases/{case.id}/").json()["remote_identity"] == case.remote_identity


def test_two_users_runai_cases_each_use_their_own_access_key(user_pool, double, ada, bob, make_case):
    save_key(ada, user_pool, ADA_ID, ADA_SECRET)
    save_key(bob, user_pool, BOB_ID, BOB_SECRET)
    mine = launched(owned_case(make_case, ada, user_pool, "echo ada", double, "ada-subject"))
    theirs = launched(owned_case(make_case, bob, user_pool, "echo bob", double, "bob-subject"))
    assert wait_for_terminal(mine).status == wait_for_terminal(theirs).status == CaseStatus.DONE
    assert double.workloads[mine.remote_id].owner == "ada-subject"
    assert double.workloads[theirs.remote_id].owner == "bob-subject"


def test_an_access_key_runai_refuses_is_not_kept(user_pool, double, ada):
    answer = save_key(ada, user_pool, ADA_ID, "not-the-secret")
    assert "Run:AI refused this access key" in answer.content.decode()
    assert not RemoteConnection.objects.exists()


def test_a_revoked_access_key_fails_the_launch_with_the_page_to_reconnect_at(user_pool, double, ada, make_case):
    save_key(ada, user_pool, ADA_ID, ADA_SECRET)
    double.revoke_client(ADA_ID)  # deleted in Run:AI's user settings
    case = launched(owned_case(make_case, ada, user_pool, "true", double, "ada-subject"))
    assert case.status == CaseStatus.FAILED and "reconnect at /connections/" in case.last_error
    assert RemoteConnection.objects.get(user=ada).state == ConnectionState.FAILED


def poll_once(case):
    Case.objects.filter(pk=case.pk).update(next_poll_at=None)
    passes.poll_pass(case_ids=[case.id])
    case.refresh_from_db()
    return case


@pytest.mark.parametrize(
    "how,worker",
    [("revoked", "the worker that kept its client"), ("expired", "a new worker process")],
)
def test_a_revoked_or_expired_access_key_makes_polls_wait_and_a_new_key_resumes_them(
    user_pool, double, ada, make_case, api, how, worker
):
    """Polls keep the case as it is (no failure counted) and say the owner must reconnect, met
    either when the kept client's token is refused and a new one is refused too, or when a new
    worker's first token is refused; the refusals echo the key's secret, which never shows.
    Once the user saves a working key, the next poll goes on and the case ends done."""
    save_key(ada, user_pool, ADA_ID, ADA_SECRET)
    double.hold = {"Running"}
    try:
        case = launched(owned_case(make_case, ada, user_pool, "cat in.txt > out.txt", double, "ada-subject"))
        assert case.status == CaseStatus.PENDING, case.last_error
        double.wait_phase(case.remote_id, {"Running"})
        assert poll_once(case).status == CaseStatus.RUNNING
        if how == "revoked":
            double.revoke_client(ADA_ID)  # deleted in Run:AI's user settings
        else:
            double.expire_client(ADA_ID)
            double.expire_tokens()  # and the last token ran out
        if worker == "a new worker process":
            rb._clients.clear()
        double.echo_credentials = 10
        for _ in range(2):
            poll_once(case)
        assert case.status == CaseStatus.RUNNING and case.poll_failures == 0, case.last_error
        assert case.status_message.startswith("waiting for its owner to reconnect")
        assert "reconnect at /connections/" in case.status_message
        connection = RemoteConnection.objects.get(user=ada)
        assert connection.state == ConnectionState.FAILED
        assert double.echo_credentials < 10  # a refusal echoed the secret
        texts = [case.status_message, case.last_error, connection.failure]
        texts += [event.message for event in case.events.all()]
        texts += [api(ada).get(f"/api/v1/cases/{case.id}/").content.decode()]
        assert not [text for text in texts if ADA_SECRET in text]
        double.echo_credentials = 0

        double.add_client(ADA_NEW_ID, ADA_NEW_SECRET, "ada-subject", "ada@example.org")
        answer = save_key(ada, user_pool, ADA_NEW_ID, ADA_NEW_SECRET)
        assert "Access key saved" in answer.content.decode()
        assert RemoteConnection.objects.get(user=ada).state == ConnectionState.CONNECTED
    finally:
        double.hold = set()
    case = wait_for_terminal(case)
    assert case.status == CaseStatus.DONE and case.status_message == "", case.last_error
    assert (workspace.case_dir(case.id) / "results" / "out.txt").read_text() == "input\n"
    assert [w.id for w in double.workloads.values()] == [case.remote_id]  # the same workload, not a new one


def test_the_access_key_never_appears_in_responses_logs_or_the_admin_and_is_stored_sealed(
    user_pool, double, ada, make_case, api, admin_client, caplog
):
    caplog.set_level(logging.DEBUG)
    saved = save_key(ada, user_pool, ADA_ID, ADA_SECRET)
    connection = RemoteConnection.objects.get(user=ada)
    case = wait_for_terminal(launched(owned_case(make_case, ada, user_pool, "exit 2", double, "ada-subject")))
    sealed = raw_sealed(connection.pk)
    assert ADA_SECRET not in sealed
    assert json.loads(Fernet(KEY).decrypt(sealed.encode())) == {"client_id": ADA_ID, "client_secret": ADA_SECRET}
    pages = [
        saved,
        browser(ada).get("/connections/"),
        api(ada).get("/api/v1/connections/"),
        api(ada).get(f"/api/v1/cases/{case.id}/"),
        api(ada).get(f"/api/v1/cases/{case.id}/events/"),
        admin_client.get("/admin/credentials/remoteconnection/"),
        admin_client.get(f"/admin/credentials/remoteconnection/{connection.pk}/change/"),
    ]
    for text in [page.content.decode() for page in pages] + [caplog.text, case.last_error]:
        assert ADA_SECRET not in text and sealed not in text


def test_service_account_runai_pools_run_under_the_service_key(user_pool, double, ada, make_case):
    user_pool.remote = {**user_pool.remote, "credentials": "service"}
    user_pool.save()
    case = launched(make_case(user=ada, resource_class=user_pool.classes.get(), command="true"))
    assert case.status == CaseStatus.PENDING, case.last_error
    assert case.remote_identity == "service account (GRIDGATE_CRED_RUNAI_CLIENT_ID)"
    assert double.workloads[case.remote_id].owner == "svc-gridgate"
    assert credential_services.identity_for(ada, user_pool).mode == "service"


def test_a_connected_user_chooses_among_the_node_pools_their_own_key_sees(user_pool, double, ada, bob, api):
    url = f"/api/v1/resource-classes/{user_pool.classes.get().pk}/launch-options/"

    def node_pools(user):
        (option,) = [o for o in api(user).get(url).json()["options"] if o["key"] == "node_pool"]
        return [choice["value"] for choice in option["choices"]]

    assert node_pools(ada) == []  # not connected yet: the pool names none
    save_key(ada, user_pool, ADA_ID, ADA_SECRET)
    assert node_pools(ada) == ["default", "a100"]  # team-a's, asked with ada's own key
    assert node_pools(bob) == []
