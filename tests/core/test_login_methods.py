"""``GET /api/v1/auth/methods/``: how ``gridgate login`` signs in here, without credentials."""

import pytest

pytestmark = pytest.mark.django_db


def test_passwords_only_when_no_cli_client_is_configured(api, settings):
    settings.GRIDGATE_OIDC_ISSUER = "https://idp.example.org/realms/centre"
    settings.GRIDGATE_OIDC_CLI_CLIENT_ID = ""
    assert api(None).get("/api/v1/auth/methods/").json() == {"password": True, "device": None}


def test_the_device_grant_names_the_issuer_and_public_client(api, settings):
    settings.GRIDGATE_OIDC_ISSUER = "https://idp.example.org/realms/centre"
    settings.GRIDGATE_OIDC_CLI_CLIENT_ID = "gridgate-cli"
    settings.GRIDGATE_PASSWORD_LOGIN = "off"

    body = api(None).get("/api/v1/auth/methods/", HTTP_AUTHORIZATION="Token stale").json()

    assert body["password"] is False
    assert body["device"]["issuer"] == "https://idp.example.org/realms/centre"
    assert body["device"]["client_id"] == "gridgate-cli"
    assert "secret" not in str(body).lower()
