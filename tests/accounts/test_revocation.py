"""A changed password revokes every API token of the user, whichever path changed it."""

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from apps.accounts.models import ApiToken
from apps.accounts.services import issue_token

pytestmark = pytest.mark.django_db

NEW_PASSWORD = "quartz-lantern-meadow-71"


@pytest.fixture
def tokens(member, owner):
    """Two tokens of the member, one of someone else, which no change of the member's touches."""
    issue_token(member)
    issue_token(member)
    return issue_token(owner)[0]


def assert_revoked_only_members(member, others_token):
    assert not ApiToken.objects.filter(user=member).exists()
    assert ApiToken.objects.filter(pk=others_token.pk).exists()


def test_set_password_then_save_revokes_every_token_of_that_user_only(member, tokens):
    member.set_password(NEW_PASSWORD)
    member.save()
    assert_revoked_only_members(member, tokens)


def test_the_admins_password_form_revokes_the_users_tokens(admin_client, member, tokens):
    response = admin_client.post(
        f"/admin/auth/user/{member.pk}/password/",
        {"usable_password": "true", "password1": NEW_PASSWORD, "password2": NEW_PASSWORD},
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    member.refresh_from_db()
    assert member.check_password(NEW_PASSWORD)
    assert_revoked_only_members(member, tokens)


def test_disabling_password_login_in_the_admin_revokes_the_users_tokens(admin_client, member, tokens):
    response = admin_client.post(
        f"/admin/auth/user/{member.pk}/password/", {"usable_password": "false", "unset-password": "1"}
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    member.refresh_from_db()
    assert not member.has_usable_password()
    assert_revoked_only_members(member, tokens)


def test_changing_ones_own_password_in_the_admin_revokes_ones_tokens(admin_client, staff, tokens):
    issue_token(staff)
    response = admin_client.post(
        "/admin/password_change/",
        {"old_password": "pw", "new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD},
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    assert not ApiToken.objects.filter(user=staff).exists()
    assert ApiToken.objects.filter(pk=tokens.pk).exists()


def test_the_changepassword_command_revokes_the_users_tokens(member, tokens, monkeypatch):
    monkeypatch.setattr("getpass.getpass", lambda prompt="Password: ", stream=None: NEW_PASSWORD)
    call_command("changepassword", "member")
    assert_revoked_only_members(member, tokens)


def test_a_password_hash_upgrade_at_login_keeps_the_tokens(member, tokens, settings):
    """check_password re-hashes a password stored with an older hasher: the same password."""
    settings.PASSWORD_HASHERS = [
        "django.contrib.auth.hashers.PBKDF2PasswordHasher",
        "django.contrib.auth.hashers.MD5PasswordHasher",
    ]
    from django.contrib.auth.hashers import make_password

    get_user_model().objects.filter(pk=member.pk).update(password=make_password("pw", hasher="md5"))
    member = get_user_model().objects.get(pk=member.pk)
    assert member.check_password("pw")
    member.refresh_from_db()
    assert member.password.startswith("pbkdf2_sha256$")  # upgraded and saved
    assert ApiToken.objects.filter(user=member).count() == 2


def test_other_changes_to_a_user_keep_the_tokens(member, tokens, client):
    member.first_name = "Mem"
    member.save()
    assert client.post("/login/", {"username": "member", "password": "pw"}).status_code == 302  # last_login saved
    assert ApiToken.objects.filter(user=member).count() == 2
