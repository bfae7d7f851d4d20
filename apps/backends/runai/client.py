"""Run:AI's SDK calls (runapy): the client for one access key and what its errors mean.

runapy runs as it is but for three things, each changed where it is marked (docs/backends.md,
"runai"): the token endpoint, the retries and the timeouts. Its constructor asks for a token
(network I/O): the shared session builds clients lazily and keeps one per (base URL, key).
"""

from __future__ import annotations

import json
import logging
import math
import time

import urllib3

from apps.backends.base import BackendError, CredentialsRequired, RemoteIdentity
from apps.backends.remote import Failure, Paste, ProviderError, RemoteSession
from apps.backends.remote_common import env_secret
from apps.credentials import oauth

sdk_logger = logging.getLogger("apps.backends.runai.sdk")

TIMEOUT = 30  # seconds per request: runapy sets none
RETRIES = 2  # GET/DELETE on 429/5xx, and the token request: keep a pass bounded
BACKOFF = 0.5  # urllib3's backoff factor: 0.5 s, 1 s
RETRY_AFTER_MAX = 10  # a Retry-After longer than this is not waited for: the next pass retries
RETRY_STATUSES = (429, 500, 502, 503, 504)
IDEMPOTENT = ("GET", "DELETE")


class TokenRefused(Exception):
    """The token endpoint refused the credential (400/401: wrong or revoked access key)."""

    def __init__(self, status: int, text: str):
        super().__init__(f"the token endpoint answered {status}: {text}")
        self.status = status


def _sdk():
    try:
        from runai import api, models
        from runai.api_client import ApiClient
        from runai.configuration import Configuration
        from runai.exceptions import ApiException
    except ImportError as exc:  # pragma: no cover - pinned in requirements.txt
        raise BackendError(f"runapy is not installed ({exc}): pip install -r requirements.txt") from None
    return {
        "api": api,
        "models": models,
        "ApiClient": ApiClient,
        "Configuration": Configuration,
        "ApiException": ApiException,
    }


_classes: dict[str, type] = {}


def _configuration(sdk) -> type:
    """runapy's ``Configuration`` with bounded retries."""

    class Retry(urllib3.Retry):
        def increment(self, method=None, url=None, response=None, error=None, _pool=None, _stacktrace=None):
            # urllib3 cuts a longer Retry-After down to retry_after_max and still waits that
            # long, retries included: a pass would sleep 2 × RETRY_AFTER_MAX per call. Give up
            # instead (the last answer is returned, as when retries run out); the next pass asks.
            header = response.headers.get("Retry-After") if response is not None else None
            if header:
                try:
                    wait = self.new(retry_after_max=math.inf).parse_retry_after(header)
                except urllib3.exceptions.InvalidHeader:
                    wait = 0
                if wait > RETRY_AFTER_MAX:
                    cause = urllib3.exceptions.ResponseError(f"Retry-After {header} is over {RETRY_AFTER_MAX} s")
                    raise urllib3.exceptions.MaxRetryError(_pool, url, cause)
            return super().increment(method, url, response, error, _pool, _stacktrace)

    class Configuration(sdk["Configuration"]):
        def get_retry_object(self):
            # runapy retries 401, 429 and 5xx on every method: a create answered 502 after Run:AI
            # accepted it would be sent again. Only idempotent methods, only 429/5xx; the last
            # answer is returned (not raised) so its status reaches the error; Retry-After is
            # honoured but never for long.
            return Retry(
                total=RETRIES,
                connect=0,
                backoff_factor=BACKOFF,
                status_forcelist=RETRY_STATUSES,
                allowed_methods=IDEMPOTENT,
                raise_on_status=False,
                retry_after_max=RETRY_AFTER_MAX,
            )

    return Configuration


def _client_class():
    """runapy's ``ApiClient`` with the three changes (token endpoint, retries, timeouts), built
    once, on first use (runapy is imported only when a Run:AI pool is used)."""
    if "client" in _classes:
        return _classes["client"]
    sdk = _sdk()

    class Client(sdk["ApiClient"]):
        def call_api(self, *args, _request_timeout=None, **kwargs):
            # runapy's API methods set no timeout: every request is bounded here.
            return super().call_api(*args, _request_timeout=_request_timeout or TIMEOUT, **kwargs)

        def _make_token_request(self) -> str:
            # runapy asks the deprecated POST /api/v1/token (JSON grantType: app_token); current
            # control planes document /api/v2/token, form-encoded.
            config = self.configuration
            url = f"{config.runai_base_url}/api/v2/token"
            form = {
                "grant_type": "client_credentials",
                "client_id": config.client_id,
                "client_secret": config.client_secret,
            }
            headers = {"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"}
            for attempt in range(RETRIES + 1):
                response = self.rest_client.request(
                    "POST", url, headers=dict(headers), post_params=form, _request_timeout=TIMEOUT
                )
                data = response.read()
                if response.status not in RETRY_STATUSES or attempt == RETRIES:
                    break
                time.sleep(BACKOFF * (2**attempt))  # no side effect: safe to ask again
            if response.status in (400, 401, 403):
                raise TokenRefused(response.status, _message(data))
            if response.status != 200:
                raise sdk["ApiException"](status=response.status, reason=_message(data))
            try:
                return json.loads(data)["access_token"]
            except (ValueError, KeyError, TypeError):
                raise sdk["ApiException"](status=response.status, reason="no access_token in the answer") from None

    Client.Configuration = _configuration(sdk)
    _classes["client"] = Client
    return Client


def _message(data) -> str:
    """The provider's message from an error body (``{"code":…, "message":…}``), bounded."""
    if isinstance(data, bytes):
        data = data.decode("utf-8", "replace")
    try:
        parsed = json.loads(data) if isinstance(data, str) else data
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        text = parsed.get("message") or parsed.get("error_description") or parsed.get("error") or ""
        return str(text)[:500]
    return str(data or "")[:200]


class Session(RemoteSession):
    """One pool's view of Run:AI for one credential: the lazily built client and the secrets to scrub."""

    kind = "runai"
    label = "Run:AI"
    runs = "workloads"
    user_credential_words = "Run:AI access key"
    url_keys = ("base_url",)
    service_env = ("client_id_env", "client_secret_env")
    paste = Paste(
        (("client_id", "Client ID", False), ("client_secret", "Client secret", True)),
        "access key",
        1024,
        malformed="Paste the access key's client ID and client secret exactly as Run:AI showed them (one line each).",
        refused="Run:AI refused this access key: check the client ID and secret (User settings → Access keys).",
    )

    def service_credential(self) -> tuple[str, str]:
        client_id = env_secret(self.remote.get("client_id_env"), "Run:AI client id", self.remote)
        secret = env_secret(self.remote.get("client_secret_env"), "Run:AI client secret", self.remote)
        self.secrets = [secret]
        return client_id, secret

    def user_credential(self, identity: RemoteIdentity) -> tuple[str, str]:
        try:
            key = json.loads(identity.token())
            client_id, secret = str(key["client_id"]), str(key["client_secret"])
        except (ValueError, KeyError, TypeError):
            raise BackendError("the stored Run:AI access key cannot be read: reconnect at /connections/") from None
        self.secrets = [secret]
        return client_id, secret

    @classmethod
    def account_of(cls, remote: dict, client_id: str, secret: str) -> tuple[str, str]:
        """(subject, e-mail or name) of the account an access key belongs to, from the claims of a
        token asked for with it (a client of its own, not cached). :class:`CredentialsRequired`
        when Run:AI refuses the key."""
        session = cls({**(remote or {}), "credentials": "service"})
        session.secrets = [secret]
        try:
            client = session.guarded("access-key check", lambda: session.open_client((client_id, secret)))
        except ProviderError as exc:
            if exc.status in (400, 401, 403):
                raise CredentialsRequired("Run:AI refused the access key") from None
            raise
        claims = oauth.claims(client._token)  # as it came from the token endpoint: a label, not a proof
        client.close()
        subject = str(claims.get("sub") or client_id)
        return subject, str(claims.get("email") or claims.get("preferred_username") or "")

    @staticmethod
    def pasted_secret(values: list[str]) -> str:
        """The access key as JSON: an access key rather than a pasted bearer token, because
        Run:AI's tokens live about an hour, cases far longer, and a key mints new ones."""
        client_id, client_secret = values
        return json.dumps({"client_id": client_id, "client_secret": client_secret}, sort_keys=True)

    def open_client(self, credential: tuple):
        return build_client(self.remote.get("base_url", "").rstrip("/"), *credential)

    def secret_values(self) -> list[str]:
        """The access key's secret and the bearer token the client holds now (a provider, a
        gateway in debug mode, may echo either in an error body)."""
        token = getattr(self._client, "_token", None)
        return [*self.secrets, token] if token else list(self.secrets)

    def call(self, what: str, fn):
        """``fn(client)``'s answer (the JSON body), through the shared rules (401: renewed once)."""
        return super().call(what, lambda client: fn(client).data)

    def renew(self, client) -> None:
        """A new token now (the old one was refused before its exp: revoked, or the clocks
        differ), and runapy's refresher made usable again: after a failed refresh it leaves its
        "refreshing" flag set and never tries again."""
        client._token = client._make_token_request()
        client.set_default_header("authorization", f"Bearer {client._token}")
        client.token_refresher._set_token_expiry()
        client.token_refresher._token_refresh_thread_is_locked = False

    def classify(self, exc: Exception) -> Failure:
        if isinstance(exc, TokenRefused):
            advice = " (check the client id and secret)"
            return Failure(str(exc), exc.status, provider_words=True, transient=False, refused=True, advice=advice)
        if isinstance(exc, _sdk()["ApiException"]):
            status = exc.status or None
            text = _message(exc.data if exc.data is not None else exc.body) or str(exc.reason or "")
            transient = status is None or status in RETRY_STATUSES
            detail = f"{status or 'no answer'} {text}".strip()
            return Failure(detail, status, provider_words=True, transient=transient, renewable=status == 401)
        if isinstance(exc, (urllib3.exceptions.TimeoutError, urllib3.exceptions.MaxRetryError)):
            timeout = isinstance(exc, urllib3.exceptions.TimeoutError) or isinstance(
                getattr(exc, "reason", None), urllib3.exceptions.TimeoutError
            )
            why = f"no answer within {TIMEOUT} s (timeout)" if timeout else "cannot connect to the Run:AI API"
            return Failure(why, timeout=timeout, transient=True)
        if isinstance(exc, (urllib3.exceptions.HTTPError, OSError)):
            return Failure(f"connection lost ({type(exc).__name__})", transient=True)
        return Failure(f"{type(exc).__name__}: {exc}")


def build_client(base_url: str, client_id: str, secret: str):
    """A runapy client for one credential (asks for its first token now)."""
    client_class = _client_class()
    config = client_class.Configuration(
        client_id=client_id, client_secret=secret, runai_base_url=base_url, logger=sdk_logger
    )
    return client_class(config)


def _api():
    return _sdk()["api"]


def projects(session: Session, name: str | None = None) -> list[dict]:
    """The projects the session's credential sees (only ``name``'s when given)."""
    filters = [f"name=={name}"] if name else None
    body = session.call("project listing", lambda c: _api().ProjectsApi(c).get_projects(filter_by=filters))
    found = (body or {}).get("projects") or []
    return [p for p in found if isinstance(p, dict) and (name is None or p.get("name") == name)]
