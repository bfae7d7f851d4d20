"""One pool's view of a remote provider for one credential (R-BACK-1, R-CRED-1).

A provider's session subclasses :class:`RemoteSession` and fills its hooks (docs/backends.md,
"Adding a remote provider", says which, and what ``apps.credentials`` reads to connect a user).
The rest is written once here: R-CRED-1's refusal, the process-wide client cache,
:meth:`RemoteSession.call` with the 401 rule, and the scrubbing of every form of a secret from
every message.
"""

from __future__ import annotations

import hashlib
import threading
from contextlib import contextmanager
from dataclasses import dataclass

from apps.backends.base import BackendError, CredentialsRequired, RemoteIdentity
from apps.backends.remote_common import provider_words, scrub
from apps.resources.remote import USER, credential_mode, with_defaults

#: (provider kind, URL, credential digest) → SDK client, shared by every session of this process
_clients: dict[tuple, object] = {}
_clients_lock = threading.Lock()


def clear_clients() -> None:
    """Forget every cached client (a new worker process; tests)."""
    with _clients_lock:
        _clients.clear()


def digest(*parts: str) -> str:
    """A cache key for a credential: its values never sit in memory as a key."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


class ProviderError(BackendError):
    """A provider call failed. The facts a caller decides on are attributes set where the SDK's
    exception is caught (never read back from the message, STYLE example 6):

    - ``status``: the HTTP status, or None when no answer came;
    - ``timeout``: no answer in time: the request may have been carried out;
    - ``dropped``: the connection was lost after the request was sent: it may have been carried out;
    - ``permanent``: retrying the same call will not help (a refusal);
    - ``transient``: retrying later may work (R-CASE-1).
    """

    def __init__(
        self,
        message: str,
        status: int | None = None,
        *,
        timeout: bool = False,
        dropped: bool = False,
        permanent: bool = False,
        transient: bool | None = None,
    ):
        super().__init__(message, timeout=timeout, transient=(not permanent) if transient is None else transient)
        self.status = status
        self.dropped = dropped
        self.permanent = permanent

    @property
    def maybe_done(self) -> bool:
        """The request may have reached the server and been carried out (R-CASE-1)."""
        return self.timeout or self.dropped or self.status in (502, 503, 504)


@dataclass
class Failure:
    """What a provider's ``classify`` says of an exception. ``detail`` follows "<Provider> <what>
    failed: "; ``provider_words`` marks it as the provider's own words (shown to a per-user pool's
    users, only logged under a reference on a service pool: ``remote_common.provider_words``)."""

    detail: str
    status: int | None = None
    provider_words: bool = False
    transient: bool | None = None
    timeout: bool = False
    dropped: bool = False
    permanent: bool = False
    #: the provider refused the credential itself (a user must reconnect)
    refused: bool = False
    #: this 401 may be answered with a fresh token and one more try
    renewable: bool = False
    #: said after the provider's words ("check the client id and secret")
    advice: str = ""


@dataclass(frozen=True)
class Paste:
    """A credential a user pastes once (the connections page, ``PUT /api/v1/connections/{pool}/``):
    its fields as (name, what it is, secret: shown as dots), what it is called in messages ("API
    token"), the longest value taken, and what the user is told when a value cannot be one or
    the provider refuses it."""

    fields: tuple[tuple[str, str, bool], ...]
    words: str
    limit: int
    malformed: str
    refused: str


def provider(kind: str) -> type[RemoteSession] | None:
    """The session class of the remote provider that serves pools of ``kind`` (its backend is
    registered under the kind's name), or None for kinds with no remote provider."""
    from apps.backends import registry

    if kind not in registry.BACKENDS:
        return None
    return getattr(registry.backend_class(kind), "session_class", None)


class RemoteSession:
    #: pool kind (``with_defaults``, ``credential_mode``) and the provider's name in messages
    kind = ""
    label = ""
    #: R-CRED-1's refusal: "this pool runs <runs> under each user's own <user_credential> …"
    runs = "jobs"
    user_credential_words = "credentials"
    #: what building a client is called in its error ("sign-in", "connection")
    sign_in = "sign-in"
    #: the pool's keys naming the environment variables of the service credential
    service_env: tuple[str, ...] = ()
    #: connecting a per-user pool (``apps.credentials``): the pool's keys naming where a user's
    #: credential is sent (a connection is never used once they change), what a user pastes
    #: (None: the provider's OAuth sign-in), and what the identity connected is called
    url_keys: tuple[str, ...] = ()
    paste: Paste | None = None
    account_word = "subject"

    def __init__(self, remote: dict, identity: RemoteIdentity | None = None):
        self.remote = with_defaults(self.kind, remote or {})
        self.per_user = credential_mode(self.kind, self.remote) == USER
        self.identity = identity
        self.secrets: list[str] = []
        self._client = None

    # -- hooks ------------------------------------------------------------------------------
    def service_credential(self) -> tuple:  # pragma: no cover - every provider fills it
        raise NotImplementedError

    def user_credential(self, identity: RemoteIdentity) -> tuple:  # pragma: no cover
        raise NotImplementedError

    def open_client(self, credential: tuple):  # pragma: no cover
        raise NotImplementedError

    def classify(self, exc: Exception) -> Failure:
        return Failure(f"{type(exc).__name__}: {exc}")

    def renew(self, client) -> None:
        """Make ``client`` ask for a fresh token before its next request (after a 401)."""

    def service_env_names(self) -> list[str]:
        """The environment variables holding the service credential (doctor names them, a
        service-account job records the first as its identity): the pool's ``service_env``."""
        return [self.remote.get(key) for key in self.service_env]

    @classmethod
    def account_of(cls, remote: dict, *values: str) -> tuple[str, str]:  # pragma: no cover - pasting providers
        """A pasted credential's account at the provider, asked with it: (subject, name shown).
        Raises ``CredentialsRequired`` when the provider refuses it."""
        raise NotImplementedError

    @staticmethod
    def pasted_secret(values: list[str]) -> str:
        """What is kept sealed of the pasted ``values`` (``user_credential`` reads it back)."""
        return values[0]

    # -- written once -------------------------------------------------------------------------
    def credential(self) -> tuple:
        """The case owner's own credential on a per-user pool, the pool's service credential
        otherwise. R-CRED-1: a per-user pool never acts under the service account: without a user
        identity nothing is sent at all."""
        if not self.per_user:
            return self.service_credential()
        if self.identity is None or self.identity.mode != RemoteIdentity.USER:
            raise BackendError(
                f"this pool runs {self.runs} under each user's own {self.user_credential_words} and no user "
                "credential was given: refusing to act under the service account (R-CRED-1)"
            )
        return self.user_credential(self.identity)

    @property
    def client(self):
        if self._client is None:
            credential = self.credential()
            # what tells this client from another: where the credential goes, and a digest of it
            key = (self.kind, *(self.remote.get(name) for name in self.url_keys), digest(*credential))
            with _clients_lock:
                client = _clients.get(key)
            if client is None:
                client = self.guarded(self.sign_in, lambda: self.open_client(credential))
                with _clients_lock:
                    client = _clients.setdefault(key, client)
            self.adopt(client)
            self._client = client
        return self._client

    def adopt(self, client) -> None:
        """Called with the cached client this session will use (a per-user client takes the
        latest identity object for the same credential)."""

    def secret_values(self) -> list[str]:
        """What no message may show: the credential, plus whatever token the client holds now."""
        return list(self.secrets)

    def scrub(self, text) -> str:
        return scrub(str(text), self.secret_values())

    def call(self, what: str, fn):
        """``fn(client)``'s answer; every failure becomes a :class:`ProviderError` safe to show.

        A 401 from the API (not from the token endpoint) gets a fresh token and one more try: the
        request was refused before anything was done, so the retry is safe, a submission too."""
        client = self.client
        try:
            return fn(client)
        except BackendError:
            raise
        except Exception as exc:
            failure = self.classify(exc)
            if not (failure.status == 401 and failure.renewable):
                raise self.error(what, exc, failure) from None
        with self.guard(what):
            self.renew(client)
            return fn(client)

    def guarded(self, what: str, fn):
        """``fn()``'s answer, every failure a :class:`ProviderError` (no 401 retry)."""
        with self.guard(what):
            return fn()

    @contextmanager
    def guard(self, what: str):
        """Every SDK, storage or transport failure in the block becomes an error safe to show."""
        try:
            yield
        except BackendError:
            raise
        except Exception as exc:
            raise self.error(what, exc) from None

    def error(self, what: str, exc: Exception, failure: Failure | None = None) -> BackendError:
        """The error users may read for ``exc``, raised by ``<what>``. A credential the provider
        refused on a per-user pool marks the user's connection failed (they must reconnect)."""
        failure = failure or self.classify(exc)
        if failure.refused and self.per_user and self.identity is not None and self.identity.refused:
            return CredentialsRequired(self.identity.refused())
        detail = self.scrub(failure.detail)
        if failure.provider_words:
            detail = provider_words(detail, service=not self.per_user, status=failure.status)
        detail += failure.advice
        return ProviderError(
            self.scrub(f"{self.label} {what} failed: {detail}"),
            failure.status,
            timeout=failure.timeout,
            dropped=failure.dropped,
            permanent=failure.permanent,
            transient=failure.transient,
        )

    def said(self, what: str, exc: Exception) -> str:
        """``<Provider> <what> failed: …`` as users of this session's pool may read it."""
        failure = self.classify(exc)
        failure.refused = False
        return str(self.error(what, exc, failure))
