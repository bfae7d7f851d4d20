"""FirecREST's SDK calls (pyfirecrest, v2 API): the client for one credential and what its errors mean.

- **Credentials** (R-BACK-1): on a per-user pool every call carries the case owner's access
  token, obtained through the core's :class:`~apps.backends.base.RemoteIdentity` (refresh grant,
  rotated refresh token stored back); on a service pool, OIDC client credentials from the
  environment variables the pool's ``client_id_env``/``client_secret_env`` name, and
  ``ClientCredentialsAuth`` caches the token.
"""

from __future__ import annotations

import json
import posixpath

from apps.backends.base import BackendError, RemoteIdentity
from apps.backends.remote import Failure, RemoteSession
from apps.backends.remote_common import env_secret
from apps.credentials import oauth

TIMEOUT = 30.0  # seconds per HTTP request: a hung API is a failed call, not a hung worker
RATE_LIMIT_RETRIES = 2  # pyfirecrest sleeps Retry-After on 429; bounded so a pass stays bounded


def _sdk():
    try:
        import firecrest
        from firecrest.v2 import Firecrest
    except ImportError as exc:  # pragma: no cover - pinned in requirements.txt
        raise BackendError(f"pyfirecrest is not installed ({exc}): pip install -r requirements.txt") from None
    return firecrest, Firecrest


class UserTokenAuth:
    """pyfirecrest's authorization object for a per-user pool: the access token comes from the
    case owner's :class:`RemoteIdentity` (the core's; it refreshes and stores the rotated refresh
    token). ``forget()`` makes the next request ask for a fresh one (the 401 retry)."""

    def __init__(self, identity: RemoteIdentity):
        self.identity = identity
        self.last_token = ""
        self._fresh = False

    def get_access_token(self) -> str:
        fresh, self._fresh = self._fresh, False
        self.last_token = self.identity.token(fresh=fresh)
        return self.last_token

    def forget(self) -> None:
        self._fresh = True


class Session(RemoteSession):
    """One pool's view of FirecREST for one credential: the client, the system, the secrets to scrub."""

    kind = "firecrest"
    label = "FirecREST"
    url_keys = ("api_url", "token_uri", "authorization_uri", "revocation_uri")
    service_env = ("client_id_env", "client_secret_env")

    def __init__(self, remote: dict, system: str | None = None, identity: RemoteIdentity | None = None):
        super().__init__(remote, identity)
        self.api_url = self.remote.get("api_url") or ""
        self.system = system or self.remote.get("system_name") or ""

    def service_credential(self) -> tuple[str, str]:
        id_env, secret_env = self.service_env_names()
        client_id = env_secret(id_env, "FirecREST client id", self.remote)
        secret = env_secret(secret_env, "FirecREST client secret", self.remote)
        self.secrets = [client_id, secret]
        return client_id, secret

    def user_credential(self, identity: RemoteIdentity) -> tuple[str]:
        return (identity.key,)  # the token itself is asked for per request (UserTokenAuth)

    def open_client(self, credential: tuple):
        firecrest, Firecrest = _sdk()
        if self.per_user:
            auth = UserTokenAuth(self.identity)
        else:
            token_uri = self.remote.get("token_uri")
            auth = firecrest.ClientCredentialsAuth(*credential, token_uri, min_token_validity=oauth.MIN_TOKEN_VALIDITY)
            auth.timeout = TIMEOUT
            # Its own log record of a refusal quotes the token endpoint's answer, unscrubbed: an
            # identity provider or gateway that echoes the request would put the secret in the log
            # (R-BACK-1). Gridgate logs each failure itself, scrubbed, under a reference.
            auth.disable_client_logging = True
        client = Firecrest(firecrest_url=self.api_url, authorization=auth)
        client.disable_client_logging = True  # the same for the API's answers
        client.timeout = TIMEOUT
        client.num_retries_rate_limit = RATE_LIMIT_RETRIES
        return client

    def adopt(self, client) -> None:
        if self.per_user:  # the latest identity object (same credential) answers the next token requests
            client._authorization.identity = self.identity

    @property
    def group_key(self) -> tuple:
        """Cases sharing this key share one status call per pass (R-BACK-4): on a per-user pool,
        one per user (each user's listing shows only their jobs)."""
        if self.per_user:
            return (self.api_url, self.system, "user", self.identity.key if self.identity else "")
        return (self.api_url, self.system, *self.service_env_names())

    def secret_values(self) -> list[str]:
        """The service credential, or the user's current access token."""
        if self.per_user and self._client is not None:
            token = getattr(self._client._authorization, "last_token", "")
            return [token] if token else []
        return list(self.secrets)

    def call(self, what: str, method: str, *args, **kwargs):
        """``client.<method>(*args, **kwargs)`` through the shared rules (401 renewed once; an
        in-memory upload is sent again from its start)."""

        def send(client):
            for arg in args:
                if hasattr(arg, "seek"):
                    arg.seek(0)
            return getattr(client, method)(*args, **kwargs)

        return super().call(what, send)

    def renew(self, client) -> None:
        """Make pyfirecrest ask the token endpoint again at the next call."""
        auth = getattr(client, "_authorization", None)
        if isinstance(auth, UserTokenAuth):
            auth.forget()
        elif auth is not None and hasattr(auth, "_token_expiration_ts"):
            auth._access_token = None
            auth._token_expiration_ts = None

    def classify(self, exc: Exception) -> Failure:
        """The facts of an SDK or transport exception, without request headers."""
        import httpx
        import requests

        firecrest, _ = _sdk()
        if isinstance(exc, firecrest.ClientsCredentialsException):
            # the token endpoint's status is not the API's: never retried as a 401
            status = exc.responses[-1].status_code if exc.responses else None
            detail = f"the token endpoint refused the client credentials (HTTP {status}): check them"
            return Failure(detail, permanent=status is not None and 400 <= status < 500)
        if isinstance(exc, firecrest.FirecrestException):
            return _api_failure(exc)
        if isinstance(exc, httpx.ConnectTimeout | requests.ConnectTimeout):
            return Failure(f"cannot connect within {TIMEOUT:g} s (timeout)")  # nothing was sent
        if isinstance(exc, httpx.TimeoutException | requests.Timeout):
            return Failure(f"no answer within {TIMEOUT:g} s (timeout)", timeout=True)
        if isinstance(exc, httpx.ConnectError | requests.ConnectionError):
            return Failure(f"cannot connect ({type(exc).__name__})")  # refused before anything was sent
        if isinstance(exc, httpx.TransportError):
            # RemoteProtocolError/ReadError/WriteError: the connection was lost with the request
            # (partly) sent; the server may have carried it out.
            return Failure(f"the connection was lost before the answer ({type(exc).__name__})", dropped=True)
        if isinstance(exc, firecrest.NotImplementedOnAPIversion):
            return Failure(f"not supported by this FirecREST version: {exc}", permanent=True)
        return Failure(f"{type(exc).__name__}: {exc}")

    @property
    def working_root(self) -> str:
        root = self.remote.get("working_root")
        if not root:
            raise BackendError("the pool has no remote.working_root: set the remote directory for case workspaces")
        return root.rstrip("/") or "/"

    def run_dir(self, case_id: str) -> str:
        return posixpath.join(self.working_root, case_id)


def _api_failure(exc) -> Failure:
    response = exc.responses[-1] if exc.responses else None
    if response is None:
        return Failure(type(exc).__name__)
    status = response.status_code
    try:
        body = response.json()
        text = body.get("message") or body.get("description") or json.dumps(body)[:300]
    except ValueError:
        text = response.text[:300]
    permanent = 400 <= status < 500 and status not in (401, 404, 408, 429)
    return Failure(f"HTTP {status}: {text}", status, provider_words=True, permanent=permanent, renewable=True)
