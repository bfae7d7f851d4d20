"""The OAuth2 client of the per-user connect flow (docs/backends.md, "Per-user credentials"): a
**public** client (no secret: the browser could read it) with PKCE (RFC 7636, S256) against the
identity provider of a FirecREST pool, the one whose ``token_uri`` the pool already names.

The identity (``sub``, ``preferred_username``, ``iss``) is read from the ID token, else the access
token, **without** checking a signature: the token came straight from ``token_uri`` over TLS in
answer to our own request (OpenID Connect Core 3.1.3.7 allows TLS to stand in for the signature
then), and it is only recorded and compared, never trusted to sign anyone in.

No token, code or verifier ever reaches a message or a log line: errors carry the provider's
``error`` code as an attribute (``invalid_grant``: the grant is expired or revoked, reconnect).
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from dataclasses import dataclass, field, replace
from urllib.parse import urlencode

import jwt

from apps.resources.remote import authorization_endpoint, revocation_endpoint

TIMEOUT = 15.0  # seconds: a connect or a refresh waits this long for the token endpoint
#: an access token is used until this many seconds before it expires: FirecREST refuses one with
#: less than 30 s left (401 "expires too soon"), and pyfirecrest's default of 10 s made a call fail
#: in every token cycle; 60 s leaves room for the request itself
MIN_TOKEN_VALIDITY = 60


@dataclass(frozen=True)
class TokenAnswer:
    """A token endpoint's answer. Its tokens never appear in its repr."""

    access_token: str = field(repr=False)
    refresh_token: str = field(repr=False)
    expires_in: float
    subject: str
    username: str
    issuer: str


class OAuthError(Exception):
    """The token endpoint refused (``error``: the OAuth error code; the HTTP status is in the message) or
    could not be reached (``unreachable``). The message is safe to show: no token, code or verifier."""

    def __init__(self, message: str, *, error: str = "", unreachable: bool = False):
        super().__init__(message)
        self.error = error
        self.unreachable = unreachable

    @property
    def invalid_grant(self) -> bool:
        """The grant (code, refresh token) is expired, revoked or used up: only a new connect helps."""
        return self.error == "invalid_grant"


def pkce_pair() -> tuple[str, str]:
    """(verifier, S256 challenge): 64 url-safe characters, RFC 7636 §4.1-4.2."""
    verifier = secrets.token_urlsafe(48)
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return verifier, base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def authorization_url(remote: dict, *, state: str, challenge: str, redirect_uri: str) -> str:
    endpoint = authorization_endpoint(remote)
    if not endpoint:
        raise OAuthError("this pool names no authorization endpoint: ask an administrator to set authorization_uri")
    query = urlencode(
        {
            "response_type": "code",
            "client_id": remote["public_client_id"],
            "redirect_uri": redirect_uri,
            "scope": remote["scope"],
            "state": state,
            "code_challenge": challenge,
            "code_challenge_method": "S256",
        }
    )
    return f"{endpoint}{'&' if '?' in endpoint else '?'}{query}"


def exchange_code(remote: dict, *, code: str, verifier: str, redirect_uri: str) -> TokenAnswer:
    data = {
        "grant_type": "authorization_code",
        "client_id": remote["public_client_id"],
        "code": code,
        "code_verifier": verifier,
        "redirect_uri": redirect_uri,
    }
    return _token_request(remote, data, sent=[code, verifier])


def refresh(remote: dict, refresh_token: str) -> TokenAnswer:
    """The refresh grant. The provider may rotate the refresh token (Keycloak does with "Revoke
    Refresh Token"): the answer's new one then replaces the old."""
    data = {"grant_type": "refresh_token", "client_id": remote["public_client_id"], "refresh_token": refresh_token}
    answer = _token_request(remote, data, sent=[refresh_token])
    if not answer.refresh_token:  # a provider that does not rotate keeps the one it accepted
        answer = replace(answer, refresh_token=refresh_token)
    return answer


def revoke(remote: dict, refresh_token: str) -> None:
    """RFC 7009: revoke a refresh token at the pool's revocation endpoint (Keycloak ends the
    session it belongs to). The provider answers 200 for a token it no longer knows as well, so a
    grant already expired or revoked is not an error. Raises :class:`OAuthError` when there is no
    endpoint, the provider refuses, or it cannot be reached."""
    endpoint = revocation_endpoint(remote)
    if not endpoint:
        raise OAuthError("this pool names no revocation endpoint (revocation_uri)")
    data = {"token": refresh_token, "token_type_hint": "refresh_token", "client_id": remote["public_client_id"]}
    response, body = _post(endpoint, data)
    if response.status_code != 200:
        raise _refusal(response, body, sent=[refresh_token], empty="no reason given")


def _token_request(remote: dict, data: dict, *, sent: list[str]) -> TokenAnswer:
    response, body = _post(remote.get("token_uri") or "", data)
    if response.status_code != 200 or not body.get("access_token"):
        raise _refusal(response, body, sent=sent, empty="no token in the answer")
    access = str(body["access_token"])
    identity = claims(str(body.get("id_token") or "")) or claims(access)
    try:
        expires_in = float(body.get("expires_in") or 300)
    except (TypeError, ValueError):
        expires_in = 300.0
    return TokenAnswer(
        access_token=access,
        refresh_token=str(body.get("refresh_token") or ""),
        expires_in=expires_in,
        subject=str(identity.get("sub") or "")[:255],
        username=str(identity.get("preferred_username") or "")[:255],
        issuer=str(identity.get("iss") or "")[:255],
    )


def _post(uri: str, data: dict):
    """POST a form to one of the provider's endpoints: (response, its JSON object or {})."""
    import httpx

    try:
        response = httpx.post(uri, data=data, timeout=TIMEOUT, headers={"Accept": "application/json"})
    except httpx.TimeoutException:
        raise OAuthError(f"the identity provider did not answer within {TIMEOUT:g} s", unreachable=True) from None
    except httpx.HTTPError as exc:
        raise OAuthError(f"the identity provider cannot be reached ({type(exc).__name__})", unreachable=True) from None
    try:
        body = response.json()
    except ValueError:
        body = {}
    return response, body if isinstance(body, dict) else {}


def _refusal(response, body: dict, *, sent: list[str], empty: str) -> OAuthError:
    error = str(body.get("error") or "")[:64]
    description = str(body.get("error_description") or "")[:200]
    for value in sent:  # a provider echoing what it refused must not put it on a page
        if value:
            description = description.replace(value, "***")
    words = f"{error}: {description}" if description else (error or empty)
    return OAuthError(
        f"the identity provider refused (HTTP {response.status_code}, {words})",
        error=error,
        unreachable=response.status_code >= 500,
    )


def claims(token: str) -> dict:
    """The payload of a JWT, unverified (see the module's docstring: a label, never a proof); {}
    for anything that is not a JWT."""
    try:
        return jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError:
        return {}


def probe_client(remote: dict) -> tuple[bool, str]:
    """``manage.py doctor``: does the token endpoint know the pool's public client? A refresh
    grant with a token that cannot exist is refused with ``invalid_grant`` (400) when the client
    is right, ``invalid_client``/``unauthorized_client`` (401) when it is unknown or confidential."""
    client = remote.get("public_client_id")
    try:
        refresh(remote, "gridgate-doctor-probe")
    except OAuthError as exc:
        if exc.invalid_grant or exc.error == "invalid_request":
            return True, f"the identity provider at {remote.get('token_uri')} knows the public client {client}"
        if exc.unreachable:
            return False, f"{exc}: check token_uri"
        return False, (
            f"{exc}: create the public client {client} there (Keycloak: Client authentication off, Standard flow "
            "on, PKCE S256, the redirect URI …/connections/callback/) or fix public_client_id"
        )
    return False, f"the identity provider accepted a made-up refresh token for {client}: check token_uri"
