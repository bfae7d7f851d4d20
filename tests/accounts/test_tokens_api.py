"""GET, POST /api/v1/auth/tokens/ and DELETE /api/v1/auth/tokens/{id}/: a user's own API tokens,
the key shown once, an expiry within the operators' maximum, revocation of one's own only."""

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from apps.accounts.models import ApiToken
from apps.accounts.services import issue_token
from apps.core.exceptions import InvalidFields

pytestmark = pytest.mark.django_db

TOKENS = "/api/v1/auth/tokens/"
LOGIN = "/api/v1/auth/token/"
CHEAP = "/api/v1/backends/"  # authenticated, reads nothing: the answer says whether the key works
LISTED = {"id", "name", "prefix", "created_at", "expires_at", "last_used_at", "expired"}


def with_token(key: str) -> APIClient:
    return APIClient(HTTP_AUTHORIZATION=f"Token {key}")


def close_to(when: str, expected) -> bool:
    from django.utils.dateparse import parse_datetime

    return abs(parse_datetime(when) - expected) < timedelta(minutes=1)


def test_a_token_created_through_the_api_is_shown_once_and_works_as_a_token_header(member, api):
    response = api(member).post(TOKENS, {"name": "laptop"}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert set(body) == {"id", "name", "prefix", "created_at", "expires_at", "token"}
    key = body["token"]
    token = ApiToken.objects.get(pk=body["id"])
    assert (token.user, token.name, token.prefix) == (member, "laptop", key[:8]) and body["prefix"] == key[:8]
    assert with_token(key).get(CHEAP).status_code == 200
    # Shown once: no later answer holds it, nor does the database.
    listed = with_token(key).get(TOKENS)
    assert listed.status_code == 200 and key not in listed.content.decode()
    assert not any(key in str(value) for value in ApiToken.objects.filter(pk=token.pk).values().get().values())


def test_the_list_holds_only_the_callers_tokens_and_never_a_key_or_digest(member, owner, api):
    mine = [issue_token(member, name=name) for name in ("ci", "laptop")]
    theirs, their_key = issue_token(owner, name="theirs")
    response = api(member).get(TOKENS)
    assert response.status_code == 200
    page = response.json()
    assert page["count"] == 2  # paginated like every list
    assert [row["id"] for row in page["results"]] == [mine[1][0].pk, mine[0][0].pk]  # newest first
    for row in page["results"]:
        assert set(row) == LISTED
        assert row["expired"] is False and row["last_used_at"] is None
    text = response.content.decode()
    for token, key in [*mine, (theirs, their_key)]:
        assert key not in text and token.digest not in text
    assert theirs.prefix not in text


def test_staff_see_only_their_own_tokens_here(staff, member, api):
    issue_token(member, name="members")
    own, _ = issue_token(staff, name="operators")
    assert [row["id"] for row in api(staff).get(TOKENS).json()["results"]] == [own.pk]


def test_the_list_says_which_tokens_have_expired_and_when_each_was_last_used(member, settings):
    settings.GRIDGATE_TOKEN_DAYS = 1
    _, old_key = issue_token(member, name="old")
    client = with_token(old_key)
    assert client.get(CHEAP).status_code == 200  # its first use: recorded
    _, key = issue_token(member, name="new")
    with_token(key).get(CHEAP)
    rows = {row["name"]: row for row in with_token(key).get(TOKENS).json()["results"]}
    assert close_to(rows["old"]["last_used_at"], timezone.now()) and rows["old"]["expired"] is False
    ApiToken.objects.filter(name="old").update(expires_at=timezone.now() - timedelta(seconds=1))
    rows = {row["name"]: row for row in with_token(key).get(TOKENS).json()["results"]}
    assert rows["old"]["expired"] is True and rows["new"]["expired"] is False


def test_a_new_token_expires_after_the_default_90_days(member, api):
    body = api(member).post(TOKENS, {"name": "default"}, format="json").json()
    assert close_to(body["expires_at"], timezone.now() + timedelta(days=90))


def test_expires_in_days_sets_the_term_up_to_the_operators_maximum(member, api, settings):
    settings.GRIDGATE_TOKEN_MAX_DAYS = 30
    body = api(member).post(TOKENS, {"name": "month", "expires_in_days": 30}, format="json").json()
    assert close_to(body["expires_at"], timezone.now() + timedelta(days=30))
    body = api(member).post(TOKENS, {"name": "week", "expires_in_days": 7}, format="json").json()
    assert close_to(body["expires_at"], timezone.now() + timedelta(days=7))


@pytest.mark.parametrize("days", [366, 0, -1, 10**30])
def test_a_term_above_the_maximum_or_below_a_day_is_a_400_naming_expires_in_days(member, api, days):
    response = api(member).post(TOKENS, {"name": "x", "expires_in_days": days}, format="json")
    assert response.status_code == 400
    assert list(response.json()) == ["expires_in_days"]
    assert not ApiToken.objects.exists()


def test_the_maximum_is_named_in_the_refusal(member, api, settings):
    settings.GRIDGATE_TOKEN_MAX_DAYS = 30
    response = api(member).post(TOKENS, {"name": "x", "expires_in_days": 31}, format="json")
    assert response.json() == {"expires_in_days": ["A token may last at most 30 days on this site."]}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "name"),
        ({"name": ""}, "name"),
        ({"name": "x" * 101}, "name"),
        ({"name": "x", "expires_in_days": "a"}, "expires_in_days"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(member, api, body, field):
    response = api(member).post(TOKENS, body, format="json")
    assert response.status_code == 400 and field in response.json()
    assert not ApiToken.objects.exists()


def test_revoking_ones_own_token_stops_its_key_at_once(member, api):
    token, key = issue_token(member)
    assert with_token(key).get(CHEAP).status_code == 200
    assert api(member).delete(f"{TOKENS}{token.pk}/").status_code == 204
    assert with_token(key).get(CHEAP).status_code == 401
    assert not ApiToken.objects.filter(pk=token.pk).exists()


def test_a_token_can_revoke_itself(member):
    token, key = issue_token(member)
    assert with_token(key).delete(f"{TOKENS}{token.pk}/").status_code == 204
    assert with_token(key).get(CHEAP).status_code == 401


def test_revoking_another_users_token_is_404_and_theirs_still_works(member, owner, staff, api):
    theirs, their_key = issue_token(owner)
    for caller in (member, staff):  # staff too: operators revoke in the admin
        response = api(caller).delete(f"{TOKENS}{theirs.pk}/")
        assert response.status_code == 404 and response.json() == {"detail": "No such token."}
    assert with_token(their_key).get(CHEAP).status_code == 200


@pytest.mark.parametrize("token_id", ["999999", "9" * 30, "abc"])
def test_revoking_an_unknown_token_is_404(member, api, token_id):
    issue_token(member)
    assert api(member).delete(f"{TOKENS}{token_id}/").status_code == 404
    assert ApiToken.objects.count() == 1


def test_the_token_endpoints_need_authentication(member):
    token, _ = issue_token(member)
    anonymous = APIClient()
    assert anonymous.get(TOKENS).status_code == 401
    assert anonymous.post(TOKENS, {"name": "x"}, format="json").status_code == 401
    assert anonymous.delete(f"{TOKENS}{token.pk}/").status_code == 401
    assert ApiToken.objects.count() == 1


def test_the_token_login_accepts_expires_in_days_within_the_maximum(member, settings):
    settings.GRIDGATE_TOKEN_MAX_DAYS = 30
    login = {"username": "member", "password": "pw", "expires_in_days": 7}
    response = APIClient().post(LOGIN, login, format="json")
    assert response.status_code == 200
    assert close_to(response.json()["expires_at"], timezone.now() + timedelta(days=7))
    response = APIClient().post(LOGIN, {**login, "expires_in_days": 31}, format="json")
    assert response.status_code == 400 and list(response.json()) == ["expires_in_days"]
    assert ApiToken.objects.count() == 1


def test_the_default_term_never_exceeds_the_maximum(member, settings):
    """An operator who lowers the maximum below GRIDGATE_TOKEN_DAYS does not break the login."""
    settings.GRIDGATE_TOKEN_DAYS, settings.GRIDGATE_TOKEN_MAX_DAYS = 90, 10
    response = APIClient().post(LOGIN, {"username": "member", "password": "pw"}, format="json")
    assert response.status_code == 200
    assert close_to(response.json()["expires_at"], timezone.now() + timedelta(days=10))


def test_issue_token_refuses_a_term_outside_one_day_to_the_maximum(member, settings):
    settings.GRIDGATE_TOKEN_MAX_DAYS = 5
    for days in (0, 6):
        with pytest.raises(InvalidFields) as refused:
            issue_token(member, days=days)
        assert list(refused.value.errors) == ["expires_in_days"]
    token, _ = issue_token(member, days=5)
    assert abs(token.expires_at - (token.created_at + timedelta(days=5))) < timedelta(seconds=1)
