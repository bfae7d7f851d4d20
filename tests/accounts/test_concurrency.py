"""Token revocation under concurrency (PostgreSQL, threads): a password change revokes every
token of the user, including one a request authenticated with the old password is minting at that
very moment."""

import threading

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from rest_framework.test import APIClient

from apps.accounts import services
from apps.accounts.models import ApiToken

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

NEW_PASSWORD = "quartz-lantern-meadow-71"


def test_a_token_minted_with_the_old_password_while_it_changes_does_not_survive_the_change(member, monkeypatch):
    """Someone who knows the leaked password signs in (``POST /auth/token/``) while its owner
    changes it: the sign-in checked the old password, the change committed and revoked every
    token, then the sign-in stored its new token, which went on working with the password
    changed."""
    checked, changed = threading.Event(), threading.Event()
    original = services.log_in

    def log_in(**kwargs):
        user = original(**kwargs)
        checked.set()  # the old password was right a moment ago
        changed.wait(30)
        return user

    monkeypatch.setattr(services, "log_in", log_in)
    answers = {}

    def sign_in():
        try:
            answers["sign_in"] = APIClient().post(
                "/api/v1/auth/token/", {"username": member.username, "password": "pw"}, format="json"
            )
        finally:
            connection.close()

    def change_password():
        try:
            assert checked.wait(30)
            user = get_user_model().objects.get(pk=member.pk)
            user.set_password(NEW_PASSWORD)
            user.save()  # revokes every token of the user
        finally:
            changed.set()
            connection.close()

    threads = [threading.Thread(target=sign_in), threading.Thread(target=change_password)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    response = answers["sign_in"]
    if response.status_code == 200:  # the defect: show that the key minted with the old password works
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {response.json()['token']}")
        assert client.get("/api/v1/sessions/").status_code == 401, "a token minted with the old password works"
    assert response.status_code == 400, response.content
    assert not ApiToken.objects.filter(user=member).exists()
