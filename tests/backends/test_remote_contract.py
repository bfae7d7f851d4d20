"""The remote-provider contract (``apps.backends.remote``), proved once for every provider against
its loopback double with the real SDK: R-CRED-1, the 401 renewal, error facts as attributes,
scrubbing of every form of a secret, the doctor skeleton, each user's own credentials, and what a
service-account pool owes (R-POOL-7, R-BACK-1, R-BACK-2, R-CASE-1 … 6, the cleanup). Each provider's
own module tests only what is its own."""

import base64
import json
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from io import StringIO
from urllib.parse import quote, quote_plus

import pytest
from cryptography.fernet import Fernet
from django.contrib.admin.models import LogEntry
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.db import connection as db_connection
from django.utils import timezone

from apps.backends.base import AlreadyFinished, BackendError, CredentialsRequired, JobRef, RemoteIdentity
from apps.backends.remote import ProviderError, clear_clients
from apps.backends.remote_common import scrub, secret_forms
from apps.backends.services import check_launch_options
from apps.cases import passes, services, workspace
from apps.cases.models import Case, CaseEvent, CaseStatus
from apps.core.exceptions import Invalid
from apps.credentials import services as credential_services
from apps.credentials.models import ConnectionState, RemoteConnection
from apps.resources.models import ResourcePool
from tests import factories
from tests.backends.conftest import (
    DRIVERS,
    PASTED,
    SEALING_KEY,
    Listener,
    browser,
    driving,
    launch,
    poll_once,
    raw_sealed,
    wait_for_terminal,
    wait_until,
)
from tests.backends.test_doctor import doctor
from tests.cases.conftest import launched
from tests.resources.test_admin import inline_data, pool_form

pytestmark = pytest.mark.django_db


@pytest.fixture(params=list(DRIVERS))
def driver(request, tmp_path, monkeypatch, settings, db):
    """Each provider's driver in turn (tests/backends/conftest.py's ``Driver``)."""
    yield from driving(request.param, tmp_path, monkeypatch, settings)


# -- R-CRED-1 ------------------------------------------------------------------------------------
def test_r_cred_1_a_per_user_pool_never_acts_under_the_service_account(driver, tmp_path):
    """Without the case owner's identity (none, or the service's) nothing is sent at all, though
    the service credential is right there in the environment."""
    calls = len(driver.double.calls)
    service = RemoteIdentity(RemoteIdentity.SERVICE, "service account", key="service")
    for identity in (None, service):
        job = JobRef("c1", driver.remote_id, tmp_path, driver.pool.remote, identity=identity)
        with pytest.raises(BackendError, match="R-CRED-1"):
            driver.backend.poll(job)
        with pytest.raises(BackendError, match="R-CRED-1"):
            driver.backend.cancel(job)
    assert len(driver.double.calls) == calls


# -- the 401 rule --------------------------------------------------------------------------------
# Qarnot's API tokens are long-lived: a 401 means the token is gone, nothing to renew.
@pytest.mark.parametrize("driver", [name for name, made in DRIVERS.items() if made.renews], indirect=True)
def test_a_401_gets_a_fresh_token_and_exactly_one_more_try(driver):
    session = driver.session(driver.service_pool())
    assert driver.listing(session)
    tokens = driver.token_requests()
    driver.double.fault(driver.listing_path, status=401, times=1, method="GET")
    assert driver.listing(session)  # refused, renewed, repeated
    assert driver.token_requests() == tokens + 1
    driver.double.fault(driver.listing_path, status=401, times=2, method="GET")
    with pytest.raises(ProviderError) as refused:
        driver.listing(session)
    assert refused.value.status == 401


# FirecREST's per-user tokens come from the identity provider, which refuses the refresh grant
# itself (an invalid_grant, not the API's refusal): test_a_lost_credential_… below.
@pytest.mark.parametrize("driver", PASTED, indirect=True)
def test_a_credential_the_provider_refuses_asks_its_user_to_reconnect(driver, tmp_path):
    """The identity's ``refused`` marks the connection failed; the call raises its message."""
    marked = []
    token = driver.module.Session.pasted_secret(["nobody"] * len(driver.fields))
    identity = RemoteIdentity(
        RemoteIdentity.USER, "user ada", key="ada", token=lambda fresh=False: token,
        refused=lambda: marked.append(1) or "reconnect at /connections/",
    )  # fmt: skip
    with pytest.raises(CredentialsRequired, match="reconnect at /connections/"):
        driver.listing(driver.session(driver.pool, identity))
    assert marked == [1]


# -- error facts and scrubbing ---------------------------------------------------------------------
def test_a_provider_error_carries_its_facts_as_attributes_and_names_the_call(driver):
    session = driver.session(driver.service_pool())
    driver.listing(session)  # signed in
    driver.double.fault(driver.listing_path, status=404, times=5, method="GET")
    with pytest.raises(ProviderError) as failed:
        driver.listing(session)
    label = driver.module.Session.label
    assert str(failed.value).startswith(f"{label} ") and " listing failed: " in str(failed.value)
    assert failed.value.status == 404 or not driver.get_status
    assert not failed.value.timeout


#: the client's timeout in the tests that make the double answer late, and how late: a loaded machine
#: (a CI runner, parallel suites) took more than 2 s for an answer that was not made late
SHORT_TIMEOUT, LATE = 5, 7.0


def test_no_answer_in_time_is_a_transient_timeout(driver, monkeypatch):
    monkeypatch.setattr(driver.module, "TIMEOUT", SHORT_TIMEOUT)
    session = driver.session(driver.service_pool())
    driver.listing(session)
    driver.double.fault(driver.listing_path, delay=LATE, times=5, method="GET")
    with pytest.raises(ProviderError) as late:
        driver.listing(session)
    assert late.value.timeout and late.value.transient


def test_every_form_of_a_secret_is_scrubbed_from_every_message_and_log(driver, caplog):
    session = driver.session(driver.service_pool())
    session.credential()
    secret = driver.secret
    echoed = RuntimeError(
        f"as is {secret}, encoded {quote(secret, safe='')}, json {json.dumps(secret)}, "
        f"basic {base64.b64encode(f'id:{secret}'.encode()).decode()} {base64.b64encode(secret.encode()).decode()}"
    )
    message = str(session.error("job lookup", echoed))
    assert message.startswith(f"{session.label} job lookup failed: ")
    for form in secret_forms([secret]):
        assert form not in message and form not in caplog.text
    assert "***" in message or "(reference " in message  # a service pool's users never read its words


# -- doctor ----------------------------------------------------------------------------------------
def test_doctor_without_a_pool_checks_the_sdk_only(driver):
    checks = driver.backend.doctor(None)
    assert [(c.name, c.ok) for c in checks] == [("sdk", True), ("pool", True)]


def test_doctor_of_a_service_pool_passes_and_never_prints_the_secret(driver):
    """R-BACK-5: ``manage.py doctor --pool`` prints each of the provider's checks, all passing (R-BACK-1)."""
    pool = driver.service_pool()
    checks = driver.backend.doctor(pool)
    assert [c.name for c in checks if not c.ok] == []
    assert ("credentials", True) in [(c.name, c.ok) for c in checks]
    assert not any(driver.secret in c.message for c in checks)
    code, out = doctor("--pool", str(pool.id))
    for name in driver.doctor_checks:
        assert f"OK    [{driver.name} pool={pool.name}] {name}:" in out, name
    assert code == 0 and driver.secret not in out and "FAIL" not in out


def test_doctor_stops_at_a_missing_service_credential_naming_its_variable(driver, monkeypatch):
    monkeypatch.delenv(driver.secret_env)
    calls = len(driver.double.calls)
    pool = driver.service_pool()
    checks = driver.backend.doctor(pool)
    assert checks[-1].name == "credentials" and not checks[-1].ok
    assert driver.secret_env in checks[-1].message
    assert len(driver.double.calls) == calls
    code, out = doctor("--pool", str(pool.id))
    assert code == 1 and driver.secret_env in out


def test_doctor_of_a_per_user_pool_needs_the_sealing_key(driver, settings):
    settings.GRIDGATE_CREDENTIALS_KEY = []
    credentials = next(c for c in driver.backend.doctor(driver.pool) if c.name == "credentials")
    assert not credentials.ok and "GRIDGATE_CREDENTIALS_KEY" in credentials.message


def test_f18_scrub_covers_every_form_a_provider_echoes_a_secret_in():
    """F18: percent-encoded (either case), form-encoded, JSON-escaped and Basic-base64 forms."""
    secret, client = 'p@ss/w+rd=&"x"', "client-7"
    echoes = [
        secret,
        quote(secret, safe=""),
        quote(secret, safe="").lower(),
        quote_plus(secret),
        json.dumps(secret)[1:-1],
        base64.b64encode(f"{client}:{secret}".encode()).decode(),
        base64.b64encode(secret.encode()).decode(),
    ]
    for echo in echoes:
        scrubbed = scrub(f"body: {echo} end", [client, secret])
        assert echo.rstrip("=") not in scrubbed and "***" in scrubbed, (echo, scrubbed)


# -- per-user credentials ------------------------------------------------------------------------
def test_each_connected_users_case_runs_under_their_own_credential(driver, ada, bob, make_case, api):
    answer = driver.connect(ada)[-1]
    assert driver.saved(ada) in answer.content.decode()
    connection = RemoteConnection.objects.get(user=ada, pool=driver.pool)
    assert connection.subject == driver.subject(ada) and connection.state == ConnectionState.CONNECTED
    driver.connect(bob)
    mine = launched(driver.case(make_case, ada, "cat in.txt > out.txt; echo hello; echo ada > who.txt"))
    theirs = launched(driver.case(make_case, bob, "echo bob > who.txt"))
    assert mine.status == theirs.status == CaseStatus.PENDING, mine.last_error or theirs.last_error
    if driver.poll_listing:  # R-BACK-4 per credential: one listing per user (each shows only their jobs)
        before = len(driver.double.status_calls())
        passes.poll_pass(case_ids=[mine.id, theirs.id])
        assert driver.double.status_calls()[before:] == [driver.poll_listing] * 2
    mine, theirs = wait_for_terminal(mine, timeout=90), wait_for_terminal(theirs, timeout=90)
    assert mine.status == theirs.status == CaseStatus.DONE, mine.last_error or theirs.last_error
    assert (workspace.case_dir(mine.id) / "results" / "out.txt").read_text() == "input\n"
    assert "hello" in (workspace.case_dir(mine.id) / "stdout.log").read_text()
    assert driver.jobs() == 2
    for case, user in ((mine, ada), (theirs, bob)):
        assert driver.owner_of(case) == driver.subject(user) and case.remote_identity == driver.label(user)
        assert (workspace.case_dir(case.id) / "results" / "who.txt").read_text() == f"{user.username}\n"
    # The identity it ran under, on the case (API, page) and in its history.
    label = driver.label(ada)
    assert api(ada).get(f"/api/v1/cases/{mine.id}/").json()["remote_identity"] == label
    assert f"under {label}" in browser(ada).get(f"/cases/{mine.id}/").content.decode()
    submitted = mine.events.get(to_status=CaseStatus.PENDING)
    assert submitted.message == f"submitted as {mine.remote_id} under {label}"
    events = api(ada).get(f"/api/v1/cases/{mine.id}/events/").json()["results"]
    assert any(label in event["message"] for event in events)


def test_a_credential_the_provider_refuses_is_not_kept(driver, ada):
    answer = driver.refuse(ada).content.decode()
    assert all(words in answer for words in driver.refused_words), answer
    assert not RemoteConnection.objects.exists()


@pytest.mark.parametrize("driver", PASTED, indirect=True)
def test_a_script_keeps_its_pasted_credential_through_the_api_and_never_gets_it_back(driver, ada, api):
    """``PUT /api/v1/connections/{pool}/`` refuses other fields than ``paste``'s, naming them."""
    client, url = api(ada), f"/api/v1/connections/{driver.pool.pk}/"
    refused = client.put(url, dict.fromkeys(driver.fields, "not-a-credential-of-anyone"), format="json")
    assert refused.status_code == 400 and driver.refused_words[0] in refused.json()["detail"]
    assert not RemoteConnection.objects.exists()
    wrong = client.put(url, {"other": "x"}, format="json")
    assert wrong.status_code == 400 and f"'{driver.fields[-1]}'" in wrong.json()["detail"]
    values = driver.credentials["ada"]
    answer = client.put(url, dict(zip(driver.fields, values, strict=True)), format="json")
    assert answer.status_code == 200, answer.content
    assert (answer.json()["state"], answer.json()["subject"]) == ("connected", driver.subject(ada))
    assert RemoteConnection.objects.get(user=ada, pool=driver.pool).subject == driver.subject(ada)
    assert values[-1] not in answer.content.decode()  # DELETE: test_a_user_lists_and_disconnects_only_their_own_…


@pytest.mark.parametrize("driver", PASTED, indirect=True)
@pytest.mark.parametrize("value", ["tök€n-abc", "\ufeffabc", "a\x7fb"])
def test_a_pasted_value_no_request_header_carries_is_malformed_and_the_provider_never_asked(driver, ada, api, value):
    """Sent as it is, such a value failed inside the SDK: a 503 "provider unavailable" that quoted
    a character of the secret and its position."""
    answer = api(ada).put(f"/api/v1/connections/{driver.pool.pk}/", dict.fromkeys(driver.fields, value), format="json")
    assert answer.status_code == 400, answer.content
    assert answer.json()["detail"] == driver.module.Session.paste.malformed
    assert not RemoteConnection.objects.exists()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("driver", PASTED, indirect=True)
def test_two_first_pastes_at_once_keep_one_connection_and_neither_answers_500(driver, ada, monkeypatch):
    """A double click or a script's retry: both checks pass at the provider, then both store. The
    second used to find no row to lock, insert too and hit the unique constraint (a 500)."""
    session = driver.module.Session
    checked = session.account_of
    both = threading.Barrier(2)

    def account_of(cls, remote, *values):  # both requests leave the provider check together
        answer = checked(remote, *values)
        both.wait(timeout=30)
        return answer

    monkeypatch.setattr(session, "account_of", classmethod(account_of))
    form = dict(zip(driver.fields, driver.credentials["ada"], strict=True))
    clients = [browser(ada, raise_request_exception=False) for _ in range(2)]

    def paste(client):
        try:
            return client.post(f"/connections/{driver.pool.pk}/credential/", form).status_code
        finally:
            db_connection.close()

    with ThreadPoolExecutor(max_workers=2) as pool:
        statuses = list(pool.map(paste, clients))
    assert statuses == [302, 302]
    connection = RemoteConnection.objects.get(user=ada, pool=driver.pool)
    assert (connection.state, connection.generation) == (ConnectionState.CONNECTED, 2)


def test_launch_without_a_connection_is_refused_naming_the_connections_page(driver, ada, make_case, api):
    case = driver.case(make_case, ada, "true")
    response = api(ada).post(f"/api/v1/cases/{case.id}/launch/", {}, format="json")
    assert response.status_code == 403
    assert "connect it first at /connections/" in response.json()["detail"]
    case.refresh_from_db()
    assert case.status == CaseStatus.PREPARED and case.launch_requested_at is None
    assert driver.jobs() == 0


def test_service_account_pools_run_under_the_service_credential_as_before(driver, ada, make_case):
    pool = driver.service_pool()
    case = launched(make_case(user=ada, resource_class=pool.classes.get(), command="true"))
    assert case.status == CaseStatus.PENDING, case.last_error
    assert case.remote_identity == driver.service_label
    assert driver.owner_of(case) == driver.service_owner
    assert credential_services.identity_for(ada, pool).mode == "service"
    assert wait_for_terminal(case, timeout=90).status == CaseStatus.DONE
    assert not RemoteConnection.objects.exists()
    assert "authorization_code" not in getattr(driver.double, "grants", [])  # no user signed in


def test_a_users_credential_never_appears_in_responses_logs_or_the_admin_and_is_stored_sealed(
    driver, ada, make_case, api, admin_client, caplog
):
    caplog.set_level(logging.DEBUG)
    connected = driver.connect(ada)
    connection = RemoteConnection.objects.get(user=ada)
    credential_services.forget_access_tokens()  # a worker without an access token: it refreshes
    case = wait_for_terminal(launched(driver.case(make_case, ada, "echo out")), timeout=90)
    assert case.status == CaseStatus.DONE, case.last_error
    ended = wait_for_terminal(launched(driver.case(make_case, ada, "echo out; exit 2")), timeout=90)
    assert ended.status == CaseStatus.FAILED and ended.last_error
    sealed = raw_sealed(connection.pk)
    assert sealed.startswith("gAAAAA")
    assert Fernet(SEALING_KEY).decrypt(sealed.encode()).decode() == driver.sealed_opens_to(ada)
    # Once the provider no longer takes it, a launch fails saying where to reconnect.
    driver.lose(ada, "revoked")
    credential_services.forget_access_tokens()
    failed = launched(driver.case(make_case, ada, "true"))
    assert failed.status == CaseStatus.FAILED, failed.last_error
    assert driver.lost_words in failed.last_error and "reconnect at /connections/" in failed.last_error
    assert RemoteConnection.objects.get(user=ada).state == ConnectionState.FAILED

    pages = [
        *connected,
        browser(ada).get("/connections/"),
        api(ada).get("/api/v1/connections/"),
        api(ada).get(f"/api/v1/connections/{driver.pool.pk}/"),
        api(ada).get(f"/api/v1/cases/{case.id}/"),
        api(ada).get(f"/api/v1/cases/{case.id}/events/"),
        api(ada).get(f"/api/v1/cases/{failed.id}/"),
        api(ada).get(f"/api/v1/cases/{failed.id}/events/"),
        api(ada).get("/api/schema/"),
        admin_client.get("/admin/credentials/remoteconnection/"),
        admin_client.get(f"/admin/credentials/remoteconnection/{connection.pk}/change/"),
        admin_client.get(f"/admin/cases/case/{case.id}/change/"),
    ]
    assert all(page.status_code in (200, 302) for page in pages)
    assert "sealed_secret" not in pages[-4].content.decode()  # not in the OpenAPI schema either
    texts = [page.content.decode() + str(dict(page.items())) for page in pages]
    texts += [caplog.text, ended.last_error, failed.last_error]
    secrets = driver.secrets(ada)
    assert len(secrets) >= driver.secrets_known
    for text in texts:
        for secret in [*secrets, sealed, SEALING_KEY]:
            assert secret not in text


def test_a_connected_user_chooses_among_the_options_their_own_account_sees(driver, ada, bob, api):
    url = f"/api/v1/resource-classes/{driver.pool.classes.get().pk}/launch-options/"

    def choices(user):
        (option,) = [o for o in api(user).get(url).json()["options"] if o["key"] == driver.option]
        return [choice["value"] for choice in option["choices"]]

    unconnected, connected = driver.choices
    assert choices(ada) == unconnected
    driver.connect(ada)
    asked = len(driver.double.calls)
    assert choices(ada) == connected  # asked under ada's own credential
    assert driver.options_call in driver.double.calls[asked:]
    assert choices(bob) == unconnected  # ada's answer (cached for her) is not bob's
    resource_class, chosen = driver.pool.classes.get(), {driver.option: connected[-1]}
    assert check_launch_options(resource_class, chosen, ada) == chosen
    with pytest.raises(Invalid, match=f"one of {unconnected[0]}" if unconnected else "none can be offered right now"):
        check_launch_options(resource_class, chosen, bob)
    RemoteConnection.objects.filter(user=ada).update(state=ConnectionState.FAILED)
    assert choices(ada) == unconnected  # a failed connection asks nothing


@pytest.mark.parametrize(
    "driver,how",
    [(name, how) for name, made in DRIVERS.items() for how in made.losses],
    indirect=["driver"],
)
def test_a_lost_credential_makes_polls_wait_and_reconnecting_resumes_them(driver, how, ada, make_case, api):
    """Polls keep the case as it is (no failure counted) and say once that the owner must reconnect;
    launches are refused up front, cancels wait, and the credential never shows (though a refusal
    may echo it). Reconnecting makes the case due at once, and it ends done: the same job."""
    driver.connect(ada)
    case = launched(driver.case(make_case, ada, driver.held("cat in.txt > out.txt; echo done")))
    assert case.status == CaseStatus.PENDING, case.last_error
    driver.running(case)
    assert poll_once(case).status == CaseStatus.RUNNING
    driver.lose(ada, how)
    for _ in range(2):  # refused, then known failed
        poll_once(case)
    notes = case.events.filter(kind=CaseEvent.Kind.NOTE, message__startswith="waiting for its owner")
    said = notes.count()
    poll_once(case)
    assert case.status == CaseStatus.RUNNING and case.poll_failures == 0, case.last_error
    assert case.status_message.startswith("waiting for its owner to reconnect")
    assert "reconnect at /connections/" in case.status_message
    assert notes.count() == said and notes.filter(message=case.status_message).count() == 1  # not at every poll
    assert api(ada).get(f"/api/v1/cases/{case.id}/").json()["status_message"] == case.status_message
    connection = RemoteConnection.objects.get(user=ada)
    assert connection.state == ConnectionState.FAILED
    assert not driver.echoes or driver.double.echo_credentials < 10  # a refusal echoed the secret
    texts = [case.status_message, case.last_error, connection.failure]
    texts += [event.message for event in case.events.all()]
    texts += [api(ada).get(f"/api/v1/cases/{case.id}/").content.decode()]
    assert not [text for text in texts for secret in driver.secrets(ada) if secret in text]
    # Now that the failure is known, a launch is refused up front with the same advice (403).
    third = driver.case(make_case, ada, "true")
    refused = api(ada).post(f"/api/v1/cases/{third.id}/launch/", {}, format="json")
    assert refused.status_code == 403 and refused.json()["connect_url"] == "/connections/"
    assert "reconnect at /connections/" in refused.json()["detail"]
    # Only the owner's own credential may act on their job: a cancel waits for the reconnect too.
    cancel = api(ada).post(f"/api/v1/cases/{case.id}/cancel/")
    assert cancel.status_code == 409 and "until its owner reconnects" in cancel.json()["detail"]
    case.refresh_from_db()
    assert case.status == CaseStatus.RUNNING
    waiting_until = case.next_poll_at

    assert driver.saved(ada) in driver.reconnect(ada)[-1].content.decode()
    assert RemoteConnection.objects.get(user=ada).state == ConnectionState.CONNECTED
    case.refresh_from_db()
    assert case.next_poll_at < waiting_until  # made due at once, not at the end of the back-off
    driver.release(case)
    case = wait_for_terminal(case, timeout=90)
    assert case.status == CaseStatus.DONE and case.status_message == "", case.last_error
    assert (workspace.case_dir(case.id) / "results" / "out.txt").read_text() == "input\n"
    assert "done" in (workspace.case_dir(case.id) / "stdout.log").read_text()
    assert driver.jobs() == 1  # the same job, not a new one


def test_without_the_sealing_key_connecting_is_refused_with_a_clear_message_and_the_app_still_starts(
    driver, ada, api, settings
):
    settings.GRIDGATE_CREDENTIALS_KEY = []
    call_command("check")  # the site starts without it
    page = browser(ada).get("/connections/")
    assert page.status_code == 200 and "GRIDGATE_CREDENTIALS_KEY" in page.content.decode()
    calls = len(driver.double.calls)
    answer = driver.offer(ada).content.decode()
    assert "the operators have not set GRIDGATE_CREDENTIALS_KEY" in answer
    assert len(driver.double.calls) == calls and getattr(driver.double, "grants", []) == []  # nothing asked
    assert not RemoteConnection.objects.exists()
    assert browser(ada).get("/").status_code == 200
    assert api(ada).get("/api/v1/connections/").status_code == 200


def test_a_user_lists_and_disconnects_only_their_own_connection(driver, ada, bob, api):
    """Disconnecting forgets the credential; a FirecREST grant is revoked at the identity provider
    (RFC 7009), a pasted one stays valid there until its owner deletes it, as the answer says."""
    driver.connect(ada)
    driver.connect(bob)
    (row,) = api(ada).get("/api/v1/connections/").json()
    assert row["pool"] == driver.pool.pk and row["state"] == "connected"
    assert row["subject"] == driver.subject(ada) and row["connect_url"] == "/connections/"
    assert set(row) == {
        "pool", "pool_name", "kind", "state", "subject", "connected_at", "last_refreshed_at", "failed_at",
        "failure", "connect_url",
    }  # fmt: skip
    answer = api(ada).delete(f"/api/v1/connections/{driver.pool.pk}/")
    assert answer.status_code == 200 and answer.json() == driver.disconnected
    revoked = driver.disconnected["revoked"]
    assert driver.alive(ada) is not revoked  # the provider's session is over, or left to its owner
    assert getattr(driver.double, "revocations", []) == (["refresh_token"] if revoked else [])
    assert api(ada).delete(f"/api/v1/connections/{driver.pool.pk}/").status_code == 404
    assert api(ada).get("/api/v1/connections/").json()[0]["state"] == "not_connected"
    assert driver.alive(bob) and RemoteConnection.objects.filter(user=bob).exists()  # bob's is untouched


# -- a moved pool ----------------------------------------------------------------------------------
def test_f3_a_connection_never_follows_its_pool_to_another_host(driver, ada, staff, api, settings):
    """F3: a per-user pool's provider URLs moved after ada connected; her next launch-options call
    sent her credential to the new host. A connection now remembers the URLs it was made against:
    after a change ada is asked to reconnect, and the change is in the pool's admin history."""
    settings.GRIDGATE_LAUNCH_OPTIONS_CACHE_SECONDS = 0
    pool, before = driver.pool, dict(driver.pool.remote)
    assert driver.saved(ada) in driver.connect(ada)[-1].content.decode()
    with Listener() as elsewhere:
        remote = {**before, **dict.fromkeys(driver.url_keys, elsewhere.url)}
        moved = api(staff).patch(f"/api/v1/resource-pools/{pool.pk}/", {"remote": remote}, format="json")
        assert moved.status_code == 200, moved.content
        clear_clients()
        answer = api(ada).get(f"/api/v1/resource-classes/{pool.classes.get().pk}/launch-options/")
        assert answer.status_code == 200 and elsewhere.reached(driver.secrets(ada)) == []  # her credential went nowhere
        state = api(ada).get(f"/api/v1/connections/{pool.pk}/").json()
        assert state["state"] == "failed" and "provider URLs changed" in state["failure"]
    connection = RemoteConnection.objects.get(user=ada, pool=pool)
    assert connection.state == ConnectionState.FAILED
    assert all(key in connection.failure for key in driver.url_keys), connection.failure
    entry = LogEntry.objects.get(object_id=str(pool.pk))
    assert entry.user == staff
    for key in driver.url_keys:
        assert f"{key} {before[key]} → {elsewhere.url}" in entry.change_message, entry.change_message
    assert "1 user connection(s) must reconnect" in entry.change_message

    back = api(staff).patch(f"/api/v1/resource-pools/{pool.pk}/", {"remote": before}, format="json")
    assert back.status_code == 200, back.content
    assert driver.saved(ada) in driver.connect(ada)[-1].content.decode()  # she reconnects, knowingly
    stored = RemoteConnection.objects.get(user=ada, pool=pool).provider_urls
    assert stored == {key: before.get(key) for key in driver.module.Session.url_keys}


def test_f3_a_pool_moved_in_the_admin_ends_its_connections_and_says_so(driver, ada, admin_client):
    """F3 through the admin's pool form, a save path of its own: the connections made against the
    old provider URLs end, and the page tells the administrator how many users must reconnect."""
    driver.connect(ada)
    pool, klass = driver.pool, driver.pool.classes.get()
    remote = {**pool.remote, **dict.fromkeys(driver.url_keys, "https://elsewhere.example.org")}
    fields = ("name", "cpu", "memory", "gpu", "max_storage", "default_storage", "max_tasks", "wall_time")
    row = {field: "" if getattr(klass, field) is None else str(getattr(klass, field)) for field in fields}
    row |= {"id": str(klass.pk), "default": "on", "max_wall_time": str(klass.max_wall_time)}
    form = pool_form(name=pool.name, kind=pool.kind, remote=json.dumps(remote), public="on")
    page = admin_client.post(
        f"/admin/resources/resourcepool/{pool.pk}/change/", form | inline_data([row], initial=1), follow=True
    )
    assert page.status_code == 200 and "1 user connection(s) were ended" in page.content.decode()
    connection = RemoteConnection.objects.get(user=ada, pool=pool)
    assert connection.state == ConnectionState.FAILED
    assert all(key in connection.failure for key in driver.url_keys), connection.failure


def test_f3_a_pool_moved_behind_the_services_back_still_gets_no_credential(driver, ada):
    """F3: the check is made where the credential is used, whoever changed the pool (a shell, a
    migration). FirecREST's refresh grant reads the connection and the pool again under the row lock:
    a worker holding ada's identity from before the move sends no refresh token to the new token_uri."""
    driver.connect(ada)
    stale = credential_services.identity_for(ada, driver.pool)  # a worker's, from before the move
    with Listener() as elsewhere:
        remote = {**driver.pool.remote, **dict.fromkeys(driver.url_keys, elsewhere.url)}
        ResourcePool.objects.filter(pk=driver.pool.pk).update(remote=remote)
        pool = ResourcePool.objects.get(pk=driver.pool.pk)
        with pytest.raises(CredentialsRequired, match="other provider URLs"):
            credential_services.identity_for(ada, pool).token()
        if driver.refreshes:
            credential_services.forget_access_tokens()  # its access token ran out: a refresh grant
            with pytest.raises(CredentialsRequired, match="other provider URLs"):
                stale.token(fresh=True)
    assert elsewhere.seen == []  # nothing at all, the refresh token least of all


# -- service-account pools -------------------------------------------------------------------------
# A pool whose remote says ``"credentials": "service"`` runs every user's jobs under the one
# credential its ``*_env`` keys name.
def test_a_secret_in_a_pool_remote_is_refused_and_the_session_reads_the_environment_only(driver):
    """R-POOL-7 at the backend's door: the refusal names the ``*_env`` key to use instead."""
    pool = driver.service_pool()
    key = driver.secret_key
    pool.remote = {**pool.remote, key: driver.secret}
    with pytest.raises(ValidationError) as refused:
        pool.full_clean()
    assert f"set '{key}_env'" in str(refused.value) and "(R-POOL-7)" in str(refused.value)
    assert driver.secret not in str(refused.value)
    remote = {**pool.remote, f"{key}_env": "GRIDGATE_CRED_UNSET"}  # the secret is right there in remote
    with pytest.raises(BackendError, match="GRIDGATE_CRED_UNSET"):
        driver.module.Session(remote).credential()


@pytest.mark.credential_binding  # tests/conftest.py reads every variable as bound without it
def test_f8_a_pool_cannot_use_a_credential_variable_bound_to_another(driver, staff, api, monkeypatch, settings):
    """F8: whoever may change one pool could point it at another's GRIDGATE_CRED_ variable, then at a
    host of theirs. A variable is now read only for the pools <NAME>_POOLS (in the environment, not
    the pool) binds it to. Each of the service's variables is checked: the one left unbound is named."""
    settings.GRIDGATE_LAUNCH_OPTIONS_CACHE_SECONDS = 0
    owned = driver.service_pool()
    with Listener() as elsewhere:
        remote = {**owned.remote, **dict.fromkeys(driver.url_keys, elsewhere.url), **driver.service_env}
        theirs = factories.pool("mine", kind=driver.kind, remote=remote, class_name="c", **driver.resources)
        for unbound in driver.service_env.values():
            for variable in driver.service_env.values():
                bound = [owned.pk] if variable == unbound else [owned.pk, theirs.pk]
                monkeypatch.setenv(f"{variable}_POOLS", ",".join(map(str, bound)))
            clear_clients()
            refused = api(staff).get(f"/api/v1/resource-classes/{theirs.classes.get().pk}/launch-options/").json()
            assert refused["degraded"] and f"{unbound}_POOLS={theirs.pk}" in refused["message"], refused
    service = [os.environ[name] for name in driver.service_env.values()]
    assert elsewhere.reached(service) == []  # the service's credential went nowhere
    allowed = api(staff).get(f"/api/v1/resource-classes/{owned.classes.get().pk}/launch-options/").json()
    assert not allowed["degraded"], allowed


def test_the_service_secret_never_appears_in_logs_responses_the_admin_or_errors(
    driver, ada, make_case, api, admin_client, caplog, monkeypatch
):
    """R-BACK-1, for every token it gave too, also once the provider refuses it quoting it back."""
    caplog.set_level(logging.DEBUG)
    pool = driver.service_pool()
    case = wait_for_terminal(launch(make_case, pool, user=ada, command="echo hi; exit 1"), timeout=90)
    assert case.status == CaseStatus.FAILED and case.last_error
    sent = "wrong-" + driver.secret  # a credential the provider refuses, any echo of which shows the secret
    monkeypatch.setenv(driver.secret_env, sent)
    driver.quote_refusals(sent)
    clear_clients()
    with pytest.raises(BackendError) as refused:
        driver.backend.poll(passes.job_ref(case))
    bad = launch(make_case, pool, user=ada, command="true")
    assert bad.status == CaseStatus.FAILED and driver.refused_service_words in bad.last_error, bad.last_error
    pages = [
        api(ada).get(f"/api/v1/cases/{case.id}/"),
        api(ada).get(f"/api/v1/cases/{bad.id}/events/"),
        admin_client.get(f"/admin/resources/resourcepool/{pool.id}/change/"),
        admin_client.get(f"/admin/cases/case/{bad.id}/change/"),
    ]
    assert all(page.status_code == 200 for page in pages)
    texts = [str(refused.value), case.last_error, bad.last_error, caplog.text]
    texts += [event.message for each in (case, bad) for event in each.events.all()]
    texts += [page.content.decode() for page in pages]
    tokens = driver.access_tokens()
    assert tokens or not driver.renews
    for text in texts:
        for secret in [driver.secret, *tokens]:
            assert secret not in text


def test_cancel_of_a_running_case_cancels_its_job_at_the_provider(driver, ada, make_case):
    """R-CASE-6: Stop on a running case ends it cancelled, and its job with it (FirecREST's scancel,
    Qarnot's abort, Run:AI's deletion)."""
    case = launch(make_case, driver.service_pool(), user=ada, command=driver.held("sleep 30"))
    assert case.status == CaseStatus.PENDING, case.last_error
    driver.running(case)
    case = services.cancel_case(case)
    assert case.status == CaseStatus.CANCELLED
    driver.cancelled(case)


def test_cancel_of_a_case_that_already_finished_answers_409_with_the_real_state_and_keeps_its_output(
    driver, ada, make_case, api
):
    """R-CASE-6 + R-CASE-5: the job ended between the user's last look and Stop, its output unread
    (the real FirecREST answers the cancel 500, scancel's "already completing or complete"; Qarnot
    'Invalid operation on non-running task'): never a 500, and every byte of its output, once."""
    case = launch(make_case, driver.service_pool(), user=ada, command="echo first; echo last")
    assert case.status == CaseStatus.PENDING, case.last_error
    driver.ended(case)
    response = api(ada).post(f"/api/v1/cases/{case.id}/cancel/")
    assert response.status_code == 409, response.content
    # The 409 carries the real final state (one status call); the enqueued poll (here: the next
    # pass) fetches the results and records it (R-CASE-2/4).
    assert response.json()["status"] == "done" and "being brought back" in response.json()["detail"]
    case = wait_for_terminal(case)
    assert case.status == CaseStatus.DONE
    assert (workspace.case_dir(case.id) / "stdout.log").read_text() == "first\nlast\n"
    with pytest.raises(AlreadyFinished):
        driver.backend.cancel(passes.job_ref(case))


@pytest.mark.parametrize(
    "answer", [{"delay": LATE}, {"status": 500}, {"status": 502}, {"status": 503}], ids=["late", "500", "502", "503"]
)
def test_a_submission_answered_late_or_5xx_is_never_resent_and_the_job_is_adopted(
    driver, ada, make_case, monkeypatch, answer
):
    """R-CASE-1: the provider created the job but answered after the client's timeout, or 5xx:
    the submission is not sent again (nor retried by the SDK); the job is found by its name,
    adopted, and runs to the end: one job."""
    monkeypatch.setattr(driver.module, "TIMEOUT", SHORT_TIMEOUT)
    method, path = driver.submit_call
    driver.double.fault(f"{path}$", method=method, times=1, after=True, **answer)
    case = launch(make_case, driver.service_pool(), user=ada, command="true")
    if answer.get("status") in driver.refusing_statuses:  # the provider says it was not carried out:
        assert case.status == CaseStatus.PREPARED, case.last_error  # the case waits, and the retry finds the job
        Case.objects.filter(pk=case.pk).update(lease_until=None)  # by its name before any submission
        passes.submit_pass(case_ids=[case.id])
        case.refresh_from_db()
    assert case.status == CaseStatus.PENDING, case.last_error
    calls = list(driver.double.calls)
    assert calls.count(driver.submit_call) == 1
    assert driver.lookup_call in calls[calls.index(driver.submit_call) :]
    assert driver.jobs() == 1 and case.remote_id == driver.named(case)
    assert wait_for_terminal(case, timeout=90).status == CaseStatus.DONE


def test_the_backends_state_in_the_workspace_is_the_services_alone(driver, ada, make_case):
    """The backend's directory (the inputs' hashes, what was synced, Qarnot's output spool) was 0755,
    its files 0644, in a case directory every account may traverse (0711): it is 0700, its files 0600."""
    case = launch(make_case, driver.service_pool(), user=ada, command="echo spooled-output")
    case = wait_for_terminal(case, timeout=90)
    assert case.status == CaseStatus.DONE, case.last_error
    state = workspace.case_dir(case.id) / driver.state_dir
    assert state.stat().st_mode & 0o777 == 0o700
    modes = {path.name: path.stat().st_mode & 0o777 for path in state.iterdir()}
    assert driver.state_files <= set(modes) and set(modes.values()) == {0o600}, modes


def test_cleanup_purges_the_remote_side_of_cases_past_the_retention_once(driver, ada, make_case):
    """SPEC §8: what the provider holds (FirecREST's run directory, Qarnot's buckets and task, Run:AI's
    run directory and workload); ``--dry-run`` only counts; a second purge finds nothing, raises nothing."""
    pool = driver.service_pool()
    old = wait_for_terminal(launch(make_case, pool, user=ada, command="echo x > out.txt"), timeout=90)
    recent = wait_for_terminal(launch(make_case, pool, user=ada, command="true"), timeout=90)
    assert old.status == recent.status == CaseStatus.DONE, old.last_error or recent.last_error
    Case.objects.filter(pk=old.pk).update(finished_at=timezone.now() - timedelta(days=40))
    out = StringIO()
    call_command("cleanup", "--days", "30", "--dry-run", stdout=out)
    assert "would purge the remote side of 1 finished case(s)" in out.getvalue()
    assert all(driver.remote_side(old))
    call_command("cleanup", "--days", "30", stdout=out)
    assert "purged the remote side of 1 finished case(s)" in out.getvalue()
    assert not any(driver.remote_side(old)) and all(driver.remote_side(recent))
    assert Case.objects.get(pk=old.pk).remote_purged_at is not None
    out, before = StringIO(), len(driver.double.calls)
    call_command("cleanup", "--days", "30", stdout=out)
    assert "purged the remote side of 0 finished case(s)" in out.getvalue()
    assert driver.double.calls[before:] == []  # purged once
    driver.backend.purge(passes.job_ref(old))  # already gone: no error


# -- a case's life on a service-account pool -------------------------------------------------------
def test_a_case_runs_shows_live_files_and_progress_and_ends_done_with_its_results(driver, ada, make_case):
    """R-CASE-2 … 5: launch → pending → running, its output and live files (and progress) brought
    back while it runs, → done with what it made in results/ (not its unchanged inputs) and its
    output in stdout.log/stderr.log, each part once. ``submitted`` checks the provider's own facts."""
    inputs = {"in.txt": b"input\n", **driver.inputs}
    case = launch(
        make_case, driver.service_pool(), user=ada, command=
        "cat in.txt > out.txt; echo started; mkdir -p out; echo 0.5 > .gridgate/progress; echo partial > out/p.txt; "
        "while [ ! -e go ]; do sleep 0.1; done; echo final > out/p.txt; echo done; echo warn >&2",
        inputs=inputs, observability_globs=["out/*.txt"],
    )  # fmt: skip
    assert case.status == CaseStatus.PENDING, case.last_error
    driver.submitted(case)
    work, root = driver.workdir(case), workspace.case_dir(case.id)
    log = root / "stdout.log"
    wait_until(lambda: poll_once(case).status == CaseStatus.RUNNING, what="running")
    wait_until(lambda: poll_once(case) and log.exists() and "started" in log.read_text(), what="output while it runs")
    live = root / "live" / "out" / "p.txt"
    wait_until(lambda: passes.sync_pass(case_ids=[case.id]) and live.exists(), what="a live file")
    case.refresh_from_db()
    assert live.read_text() == "partial\n" and case.progress == 0.5
    (work / "go").write_text("")  # the job waited for it
    case = wait_for_terminal(case, timeout=90)
    assert case.status == CaseStatus.DONE, case.last_error
    assert (root / "results" / "out.txt").read_text() == "input\n"
    assert (root / "results" / "out" / "p.txt").read_text() == "final\n"
    assert not [name for name in inputs if (root / "results" / name).exists()]
    assert log.read_text().count("started") == 1 and "done" in log.read_text()  # what it read running: once
    assert "warn" in (root / "stderr.log").read_text()


def test_a_submission_answered_503_before_any_job_exists_keeps_the_case_prepared_and_the_retry_submits(
    driver, ada, make_case
):
    """R-CASE-1: a 5xx with no job created is uncertain, not a failure: the retry submits, once."""
    method, path = driver.submit_call
    driver.double.fault(f"{path}$", method=method, status=503, times=1)
    case = launch(make_case, driver.service_pool(), user=ada, command="true")
    assert case.status == CaseStatus.PREPARED and "uncertain" in case.last_error, case.last_error
    assert "not listed (yet)" in case.last_error
    assert driver.double.calls.count(driver.submit_call) == 1 and driver.jobs() == 0
    Case.objects.filter(pk=case.pk).update(lease_until=None)  # the back-off has passed
    passes.submit_pass(case_ids=[case.id])
    case.refresh_from_db()
    assert case.status == CaseStatus.PENDING and driver.jobs() == 1, case.last_error


def test_a_failing_command_ends_failed_with_the_providers_words_its_partial_results_and_stderr(driver, ada, make_case):
    command = "echo half > half.txt; echo oops >&2; exit 3"
    case = wait_for_terminal(launch(make_case, driver.service_pool(), user=ada, command=command), timeout=90)
    assert case.status == CaseStatus.FAILED and driver.exit_words in case.last_error, case.last_error
    root = workspace.case_dir(case.id)
    assert (root / "results" / "half.txt").read_text() == "half\n" and "oops" in (root / "stderr.log").read_text()


@pytest.mark.parametrize("status", [500, 502, 503, 429])
def test_a_poll_answered_5xx_or_429_is_a_failed_poll_that_changes_nothing_and_the_next_resumes(
    driver, ada, make_case, status
):
    """R-CASE-3: a failed poll only counts (and backs off); the next good poll goes on."""
    case = launch(make_case, driver.service_pool(), user=ada, command="true")
    assert case.status == CaseStatus.PENDING, case.last_error
    driver.double.fault(driver.poll_path(case), status=status, times=10)
    case = poll_once(case)
    assert case.status == CaseStatus.PENDING and case.poll_failures == 1, case.last_error
    assert str(status) in case.last_error or not driver.get_status, case.last_error
    driver.double.faults.clear()
    assert wait_for_terminal(case, timeout=90).status == CaseStatus.DONE


def test_launch_options_degrade_while_the_provider_is_unreachable_and_that_answer_is_not_kept(
    driver, ada, api, settings
):
    """R-BACK-2: unreachable, the options are degraded (a launch stays possible) and not cached;
    reachable again, they list what the service account sees."""
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    url = f"/api/v1/resource-classes/{driver.service_pool().classes.get().pk}/launch-options/"

    def options():
        body = api(ada).get(url).json()
        (option,) = [o for o in body["options"] if o["key"] == driver.option]
        return body["degraded"], option["default"], [choice["value"] for choice in option["choices"]]

    method, path = driver.options_call
    driver.double.fault(path, status=503, times=10, method=method)
    assert options() == (True, *driver.degraded)
    driver.double.faults.clear()
    assert options()[::2] == (False, driver.choices[1])
