"""Sign-in from a terminal with the OAuth 2.0 device authorization grant (RFC 8628).

Gridgate names the centre's provider and its public CLI client (``GET /api/v1/auth/methods/``);
the provider's discovery document says whether it offers the grant
(``device_authorization_endpoint``). The user opens the verification address in any browser and
types the code; the terminal polls the token endpoint at the provider's interval, five seconds
more after each ``slow_down`` (RFC 8628 §3.5). The access token is a JWT that Gridgate accepts as a
bearer token (docs/identity.md); the refresh token renews it (:func:`refresh`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from gridgate_client.api import GridgateError

DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"


def _post(http: httpx.Client, url: str, data: dict) -> httpx.Response:
    """A POST to the provider; its failing on the way is a :class:`GridgateError` naming it."""
    try:
        return http.post(url, data=data)
    except httpx.HTTPError as exc:
        raise GridgateError(f"Cannot reach the identity provider at {url}: {exc or type(exc).__name__}") from None


def _json(response: httpx.Response) -> dict:
    """The provider's JSON object; anything else (a proxy's page) is a :class:`GridgateError`."""
    try:
        body = response.json()
    except (ValueError, RecursionError):
        body = None
    if not isinstance(body, dict):
        raise GridgateError(
            f"The identity provider at {response.url.host} answered HTTP {response.status_code} with something "
            "that is not its JSON: try again later, or ask the centre"
        )
    return body


def discover(http: httpx.Client, issuer: str) -> dict:
    try:
        document = http.get(issuer.rstrip("/") + "/.well-known/openid-configuration").raise_for_status().json()
    except (httpx.HTTPError, ValueError, RecursionError) as exc:
        raise GridgateError(f"Cannot read the identity provider's discovery document at {issuer}: {exc}") from None
    if not isinstance(document, dict) or not document.get("device_authorization_endpoint"):
        raise GridgateError(
            "The centre's identity provider does not offer sign-in from a terminal (the device authorization "
            "grant): log in with your username and password (gridgate login --username …) or create a token "
            "on the web pages (API tokens)."
        )
    return document


def _token_error(response: httpx.Response) -> tuple[str, str]:
    try:
        body = response.json()
    except (ValueError, RecursionError):
        body = None
    if not isinstance(body, dict):
        return "invalid_response", f"HTTP {response.status_code}"
    return str(body.get("error", "invalid_response")), str(body.get("error_description", ""))


def device_login(
    device: dict,
    *,
    http: httpx.Client,
    show: Callable[[str, str, str | None], None],
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> dict:
    """Run the grant for ``device`` (``{"issuer", "client_id", "scopes"}`` from Gridgate);
    ``show(verification_uri, user_code, verification_uri_complete)`` tells the user what to do.
    Returns the token answer with ``token_endpoint``, ``client_id`` (for :func:`refresh`) and the
    provider's ``revocation_endpoint`` if it names one (for :func:`revoke`)."""
    document = discover(http, device["issuer"])
    asked = _post(
        http,
        document["device_authorization_endpoint"],
        {"client_id": device["client_id"], "scope": device.get("scopes") or "openid"},
    )
    if asked.status_code >= 400:
        error, description = _token_error(asked)
        raise GridgateError(f"The identity provider refused to start the sign-in: {error} {description}".strip())
    grant = _json(asked)
    show(grant["verification_uri"], grant["user_code"], grant.get("verification_uri_complete"))
    interval = float(grant.get("interval") or 5)
    deadline = clock() + float(grant.get("expires_in") or 600)
    while clock() < deadline:
        sleep(interval)
        try:
            answer = http.post(
                document["token_endpoint"],
                data={
                    "grant_type": DEVICE_GRANT,
                    "device_code": grant["device_code"],
                    "client_id": device["client_id"],
                },
            )
        except httpx.TransportError:
            continue  # a poll lost on the way: the next one asks again, until the code expires
        if answer.status_code == 200:
            tokens = _json(answer)
            tokens.update(
                token_endpoint=document["token_endpoint"],
                client_id=device["client_id"],
                revocation_endpoint=document.get("revocation_endpoint"),
            )
            return tokens
        error, description = _token_error(answer)
        if error == "authorization_pending":
            continue
        if error == "slow_down":
            interval += 5
            continue
        if error == "access_denied":
            raise GridgateError("The sign-in was refused at the identity provider.")
        if error == "expired_token":
            break
        raise GridgateError(f"The identity provider refused the sign-in: {error} {description}".strip())
    raise GridgateError("The code expired before the sign-in was completed: run gridgate login again.")


def refresh(entry: dict, *, http: httpx.Client) -> dict:
    """New tokens for a stored device login (``refresh_token``, ``token_endpoint``, ``client_id``)."""
    answer = _post(
        http,
        entry["token_endpoint"],
        {"grant_type": "refresh_token", "refresh_token": entry["refresh_token"], "client_id": entry["client_id"]},
    )
    if answer.status_code != 200:
        error, description = _token_error(answer)
        if answer.status_code >= 500:
            raise GridgateError(f"The identity provider cannot renew your sign-in now ({error}): try again later.")
        # status 401: the CLI's "not logged in" exit status (4), not "cannot be reached" (5)
        raise GridgateError(f"Your sign-in has ended ({error}): run gridgate login again.", status=401)
    tokens = _json(answer)
    if not isinstance(tokens.get("access_token"), str):
        raise GridgateError("The identity provider renewed your sign-in without a token: run gridgate login again.")
    return tokens


def revoke(entry: dict, *, http: httpx.Client) -> bool:
    """End a stored device login at the provider: revoke its refresh token (RFC 7009), so no new
    access token comes from it. False when the login recorded no revocation endpoint (a provider
    that names none, or a login from an older client) or the provider refused."""
    if not entry.get("revocation_endpoint") or not entry.get("refresh_token"):
        return False
    answer = _post(
        http,
        entry["revocation_endpoint"],
        {"token": entry["refresh_token"], "token_type_hint": "refresh_token", "client_id": entry["client_id"]},
    )
    return answer.status_code == 200
