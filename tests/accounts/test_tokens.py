"""API tokens are stored hashed, expire, and cost one statement per request."""

import hashlib
from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone
from rest_framework.test import APIClient

from apps.accounts.models import ApiToken
from apps.accounts.services import digest_of, issue_token

pytestmark = pytest.mark.django_db

LOGIN = "/api/v1/auth/token/"
#: Cheap and authenticated: it reads nothing from the database, so a request costs only its auth.
CHEAP = "/api/v1/backends/"


def with_token(key: str) -> APIClient:
    return APIClient(HTTP_AUTHORIZATION=f"Token {key}")


def test_the_stored_row_holds_the_keys_digest_and_prefix_never_the_key(member):
    token, key = issue_token(member, name="laptop")
    assert len(key) >= 40
    row = ApiToken.objects.filter(pk=token.pk).values().get()
    assert row["digest"] == hashlib.sha256(key.encode()).hexdigest()
    assert row["prefix"] == key[:8]
    assert not any(key in str(value) for value in row.values())


def test_a_login_issues_a_working_token_and_a_second_login_another_one(member):
    first = APIClient().post(LOGIN, {"username": "member", "password": "pw"}, format="json")
    second = APIClient().post(LOGIN, {"username": "member", "password": "pw"}, format="json")
    assert first.status_code == second.status_code == 200
    assert first.json()["token"] != second.json()["token"]
    for response in (first, second):
        assert with_token(response.json()["token"]).get(CHEAP).status_code == 200
    assert ApiToken.objects.filter(user=member).count() == 2


def test_a_login_answers_when_the_token_expires_and_keeps_its_name(member, settings):
    settings.GRIDGATE_TOKEN_DAYS = 30
    response = APIClient().post(LOGIN, {"username": "member", "password": "pw", "name": "ci runner"}, format="json")
    expires_at = ApiToken.objects.get(user=member).expires_at
    assert response.json()["expires_at"] == expires_at.isoformat().replace("+00:00", "Z")
    assert abs(expires_at - (timezone.now() + timedelta(days=30))) < timedelta(minutes=1)
    assert ApiToken.objects.get(user=member).name == "ci runner"


def test_a_login_answers_its_tokens_id_with_which_the_token_revokes_itself(member):
    answer = APIClient().post(LOGIN, {"username": "member", "password": "pw"}, format="json").json()
    assert answer["id"] == ApiToken.objects.get(user=member).pk

    assert with_token(answer["token"]).delete(f"/api/v1/auth/tokens/{answer['id']}/").status_code == 204
    assert with_token(answer["token"]).get(CHEAP).status_code == 401


def test_a_token_past_its_expiry_is_refused_with_401(member, settings):
    settings.GRIDGATE_TOKEN_DAYS = 2
    _, key = issue_token(member)
    assert with_token(key).get(CHEAP).status_code == 200
    with time_machine.travel(timezone.now() + timedelta(days=2, seconds=1)):
        response = with_token(key).get(CHEAP)
    assert response.status_code == 401
    assert "expired" in response.json()["detail"]


def test_an_inactive_users_token_is_refused_with_401(member):
    _, key = issue_token(member)
    member.is_active = False
    member.save()
    response = with_token(key).get(CHEAP)
    assert response.status_code == 401
    assert response.json()["detail"] == "User inactive or deleted."


def test_an_unknown_key_is_refused_with_401(member):
    token, key = issue_token(member)
    assert with_token(key[:-1] + ("A" if key[-1] != "A" else "B")).get(CHEAP).status_code == 401
    assert with_token(token.digest).get(CHEAP).status_code == 401  # what the database holds is no key


def test_token_authentication_costs_exactly_one_statement(member, django_assert_num_queries):
    """On every API request's path: the token with its user in one SELECT, and no write (a token
    already used this minute: its first use in a minute also records it, below)."""
    _, key = issue_token(member)
    client = with_token(key)
    assert client.get(CHEAP).status_code == 200
    with django_assert_num_queries(1) as context:
        assert client.get(CHEAP).status_code == 200
    assert context.captured_queries[0]["sql"].lstrip().upper().startswith("SELECT")


def test_last_used_at_is_set_on_first_use_and_not_rewritten_within_the_minute(member, django_assert_num_queries):
    token, key = issue_token(member)
    assert token.last_used_at is None
    client = with_token(key)
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        with django_assert_num_queries(2) as first:  # the lookup, then the one UPDATE
            assert client.get(CHEAP).status_code == 200
        assert first.captured_queries[1]["sql"].lstrip().upper().startswith("UPDATE")
        token.refresh_from_db()
        assert token.last_used_at == start
    with time_machine.travel(start + timedelta(seconds=59), tick=False):
        with django_assert_num_queries(1):  # within the minute: the lookup alone, no write
            assert client.get(CHEAP).status_code == 200
        token.refresh_from_db()
        assert token.last_used_at == start
    later = start + timedelta(seconds=61)
    with time_machine.travel(later, tick=False):
        with django_assert_num_queries(2):  # a minute on: recorded again
            assert client.get(CHEAP).status_code == 200
        token.refresh_from_db()
        assert token.last_used_at == later


def test_a_refused_token_records_no_use(member, settings):
    settings.GRIDGATE_TOKEN_DAYS = 1
    token, key = issue_token(member)
    with time_machine.travel(timezone.now() + timedelta(days=1, seconds=1)):
        assert with_token(key).get(CHEAP).status_code == 401
    member.is_active = False
    member.save()
    assert with_token(key).get(CHEAP).status_code == 401
    token.refresh_from_db()
    assert token.last_used_at is None


def test_recording_a_use_never_overwrites_a_newer_time_from_a_concurrent_request(member):
    """Two requests fetched the token while its time was stale; the first recorded its use. The
    second's UPDATE is conditional on the stored time, so it matches no row."""
    from apps.accounts.services import note_use
    from apps.accounts.statements import token_with_user

    token, key = issue_token(member)
    start = timezone.now()
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=start - timedelta(minutes=5))
    fetched_by_the_second = token_with_user(digest_of(key))
    note_use(token_with_user(digest_of(key)), now=start + timedelta(seconds=2))  # the first request
    note_use(fetched_by_the_second, now=start + timedelta(seconds=1))  # stale to it, not to the row
    token.refresh_from_db()
    assert token.last_used_at == start + timedelta(seconds=2)


def test_a_login_with_a_stale_token_still_in_the_headers_gets_a_new_token(member):
    """A client re-logging in after its token expired usually still sends the old header."""
    response = with_token("expired-or-revoked-key").post(LOGIN, {"username": "member", "password": "pw"}, format="json")
    assert response.status_code == 200 and with_token(response.json()["token"]).get(CHEAP).status_code == 200


def test_wrong_credentials_stay_a_400_with_drfs_message(member):
    response = APIClient().post(LOGIN, {"username": "member", "password": "nope"}, format="json")
    assert response.status_code == 400
    assert response.json() == {"non_field_errors": ["Unable to log in with provided credentials."]}
    assert not ApiToken.objects.exists()


def test_the_token_lookup_reads_the_token_and_its_user_as_stored(member):
    """The hand-written statement of every API request (apps/accounts/statements.py)."""
    from apps.accounts.statements import token_with_user

    token, key = issue_token(member, name="ci")
    token.last_used_at = timezone.now() - timedelta(seconds=30)  # what decides whether to record a use
    token.save(update_fields=["last_used_at"])
    found = token_with_user(digest_of(key))
    assert found.pk == token.pk and found.user.pk == member.pk
    for field in type(token)._meta.concrete_fields:
        assert getattr(found, field.attname) == getattr(token, field.attname), field.name
    for field in type(member)._meta.concrete_fields:
        assert getattr(found.user, field.attname) == getattr(member, field.attname), field.name
    assert token_with_user(digest_of("not a key")) is None
