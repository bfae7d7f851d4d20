"""Failed logins are throttled by django-axes, per username and client address, on the token
endpoint (429 JSON), the user pages' login and the admin login (a page that says why)."""

from datetime import timedelta

import pytest
import time_machine
from django.core.management import call_command
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from apps.accounts.lockout import client_ip

pytestmark = pytest.mark.django_db

LOGIN = "/api/v1/auth/token/"
LIMIT = 3


@pytest.fixture(autouse=True)
def small_limit(settings):
    """The configured limit is 10 (GRIDGATE_LOGIN_FAILURE_LIMIT); 3 makes the same path quicker."""
    settings.AXES_FAILURE_LIMIT = LIMIT
    assert settings.AXES_ENABLED


def token_login(username, password, address="10.1.1.1"):
    return APIClient().post(LOGIN, {"username": username, "password": password}, format="json", REMOTE_ADDR=address)


def lock_out(username, address="10.1.1.1"):
    responses = [token_login(username, "wrong", address) for _ in range(LIMIT)]
    assert [r.status_code for r in responses[:-1]] == [400] * (LIMIT - 1)
    return responses[-1]


def test_the_token_endpoint_answers_429_json_once_the_failure_limit_is_reached(member, settings):
    response = lock_out("member")
    assert response.status_code == 429
    assert response["Content-Type"] == "application/json"
    assert "Too many failed logins" in response.json()["detail"]
    assert response["Retry-After"] == str(int(settings.AXES_COOLOFF_TIME.total_seconds()))
    # Locked out means locked out: the right password does not get through either.
    again = token_login("member", "pw")
    assert again.status_code == 429 and "token" not in again.json()


def test_another_username_from_the_same_address_is_not_locked(member, owner):
    assert lock_out("member").status_code == 429
    assert token_login("owner", "pw").status_code == 200


def test_the_same_username_from_another_address_is_not_locked(member):
    """Whoever guesses at a user's password does not lock the user out from everywhere."""
    assert lock_out("member", "10.1.1.1").status_code == 429
    assert token_login("member", "pw", "10.2.2.2").status_code == 200


def test_the_lockout_ends_after_the_cool_off(member, settings):
    assert lock_out("member").status_code == 429
    with time_machine.travel(timezone.now() + settings.AXES_COOLOFF_TIME + timedelta(seconds=1)):
        assert token_login("member", "pw").status_code == 200


def test_a_successful_token_login_forgets_the_earlier_failures(member):
    for _ in range(LIMIT - 1):
        assert token_login("member", "wrong").status_code == 400
    assert token_login("member", "pw").status_code == 200
    for _ in range(LIMIT - 1):
        assert token_login("member", "wrong").status_code == 400
    assert token_login("member", "pw").status_code == 200


def test_an_operator_unlocks_a_user_with_axes_reset_username(member):
    assert lock_out("member").status_code == 429
    call_command("axes_reset_username", "member")
    assert token_login("member", "pw").status_code == 200


def test_the_web_login_refuses_with_a_message_once_locked_out(member, owner):
    client = Client(REMOTE_ADDR="10.1.1.1")
    for _ in range(LIMIT - 1):
        page = client.post("/login/", {"username": "member", "password": "wrong"})
        assert page.status_code == 200 and "did not match" in page.content.decode()
    locked = client.post("/login/", {"username": "member", "password": "wrong"})  # the limit-th failure
    for response in (locked, client.post("/login/", {"username": "member", "password": "pw"})):
        text = response.content.decode()
        assert response.status_code == 429
        assert "Too many failed logins for this account from your address" in text and "did not match" not in text
    assert "_auth_user_id" not in client.session
    assert client.post("/login/", {"username": "owner", "password": "pw"}).status_code == 302


def test_the_admin_login_refuses_with_a_message_once_locked_out(staff):
    client = Client(REMOTE_ADDR="10.1.1.1")
    for _ in range(LIMIT):
        response = client.post("/admin/login/", {"username": "staff", "password": "wrong"})
    response = client.post("/admin/login/", {"username": "staff", "password": "pw"})
    assert response.status_code == 429
    assert "Too many failed logins for this account from your address" in response.content.decode()
    assert "_auth_user_id" not in client.session


def test_behind_a_trusted_proxy_the_client_is_the_address_it_saw(rf, settings):
    """nginx's $proxy_add_x_forwarded_for appends the peer it saw; what a client wrote is further left."""
    request = rf.post(LOGIN, REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR="6.6.6.6, 192.0.2.7")
    assert client_ip(request) == "127.0.0.1"  # no proxy configured: the peer
    settings.GRIDGATE_TRUSTED_PROXIES = networks("127.0.0.1")
    assert client_ip(request) == "192.0.2.7"
    settings.GRIDGATE_TRUSTED_PROXIES = networks("127.0.0.1,192.0.2.0/24")  # two proxies in a row
    assert client_ip(request) == "6.6.6.6"
    settings.GRIDGATE_TRUSTED_PROXIES = networks("127.0.0.1")
    assert client_ip(rf.post(LOGIN, REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR="not-an-ip")) == "127.0.0.1"


def test_a_client_reaching_the_web_process_directly_cannot_pick_its_address(rf, member, settings):
    """F10: with a count of proxies, anyone who reached gunicorn directly wrote their own
    X-Forwarded-For and escaped the lockout with each new value. The header is now believed only
    from the proxies' networks."""
    settings.GRIDGATE_TRUSTED_PROXIES = networks("127.0.0.1")
    forged = rf.post(LOGIN, REMOTE_ADDR="203.0.113.9", HTTP_X_FORWARDED_FOR="6.6.6.6")
    assert client_ip(forged) == "203.0.113.9"

    def direct(password, claimed):
        return APIClient().post(
            LOGIN,
            {"username": "member", "password": password},
            format="json",
            REMOTE_ADDR="203.0.113.9",
            HTTP_X_FORWARDED_FOR=claimed,
        )

    assert [direct("wrong", f"192.0.2.{i}").status_code for i in range(LIMIT)][-1] == 429
    assert direct("pw", "192.0.2.200").status_code == 429  # a new claim does not make a new client


def test_a_count_of_proxies_is_refused_at_start_naming_what_to_write(monkeypatch):
    from django.core.exceptions import ImproperlyConfigured

    from config.env import env_proxy_networks

    monkeypatch.setenv("GRIDGATE_TRUSTED_PROXIES", "1")
    with pytest.raises(ImproperlyConfigured, match="GRIDGATE_TRUSTED_PROXIES=127.0.0.1"):
        env_proxy_networks("GRIDGATE_TRUSTED_PROXIES")
    monkeypatch.setenv("GRIDGATE_TRUSTED_PROXIES", "127.0.0.1, 10.0.3.0/24")
    assert [str(n) for n in env_proxy_networks("GRIDGATE_TRUSTED_PROXIES")] == ["127.0.0.1/32", "10.0.3.0/24"]


def test_behind_a_trusted_proxy_clients_are_locked_out_one_by_one(member, settings):
    settings.GRIDGATE_TRUSTED_PROXIES = networks("127.0.0.1")

    def via_proxy(password, client_address):
        return APIClient().post(
            LOGIN,
            {"username": "member", "password": password},
            format="json",
            REMOTE_ADDR="127.0.0.1",
            HTTP_X_FORWARDED_FOR=client_address,
        )

    assert [via_proxy("wrong", "192.0.2.7").status_code for _ in range(LIMIT)][-1] == 429
    assert via_proxy("pw", "192.0.2.8").status_code == 200


def networks(text):
    import ipaddress

    return tuple(ipaddress.ip_network(part.strip()) for part in text.split(","))


@pytest.fixture
def hashes(monkeypatch):
    """How many passwords were hashed or checked (what the attack spends the CPU on)."""
    from django.contrib.auth import base_user

    counted = []
    for name in ("make_password", "check_password"):
        real = getattr(base_user, name)
        monkeypatch.setattr(base_user, name, lambda *a, _real=real, **k: counted.append(1) or _real(*a, **k))
    return counted


def test_fresh_usernames_from_one_address_are_refused_past_the_rate_before_any_hash(member, settings, hashes):
    """F1: the lockout per username and address never stopped a client trying a new username each
    time, and each attempt cost a password hash: 8 such clients took the health endpoint from 10 ms
    to 1.6 s. Past GRIDGATE_LOGIN_RATE attempts a minute from one address, whatever the usernames,
    every login path answers 429 before any password is hashed."""
    settings.GRIDGATE_LOGIN_RATE = 5
    answers = [token_login(f"random-{i}", "guess", "10.9.9.9").status_code for i in range(5)]
    assert answers == [400] * 5 and len(hashes) == 5
    refused = token_login("random-6", "guess", "10.9.9.9")
    assert refused.status_code == 429 and "whatever the account" in refused.json()["detail"]
    assert refused["Retry-After"] == "60"
    assert token_login("member", "pw", "10.9.9.9").status_code == 429  # the right password too
    web = Client(REMOTE_ADDR="10.9.9.9").post("/login/", {"username": "random-7", "password": "guess"})
    assert web.status_code == 429 and "whatever the account" in web.content.decode()
    admin = Client(REMOTE_ADDR="10.9.9.9").post("/admin/login/", {"username": "random-8", "password": "guess"})
    assert admin.status_code == 429
    assert len(hashes) == 5  # nothing hashed past the rate
    assert token_login("member", "pw", "10.8.8.8").status_code == 200  # another address is not held
    with time_machine.travel(timezone.now() + timedelta(seconds=61)):
        assert token_login("member", "pw", "10.9.9.9").status_code == 200  # the next minute
