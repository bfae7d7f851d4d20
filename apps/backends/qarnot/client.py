"""Qarnot's SDK calls: the connection for one token and what the SDK's and S3's errors mean.

The token is the case owner's own on a per-user pool (pasted once on the connections page; never
the service's, R-CRED-1), else the one in the environment variable the pool's ``token_env`` names
(R-BACK-1).
"""

from __future__ import annotations

import logging

from apps.backends.base import BackendError, CredentialsRequired, RemoteIdentity
from apps.backends.remote import Failure, Paste, RemoteSession
from apps.backends.remote_common import env_secret, scrub

sdk_logger = logging.getLogger("apps.backends.qarnot.sdk")  # the SDK prints to stdout otherwise

TIMEOUT = 30  # seconds per API request
RETRY_COUNT = 2  # the SDK retries 429/5xx with (2 ** try) * RETRY_WAIT sleeps: keep passes bounded
RETRY_WAIT = 0.5
MB = 1024 * 1024


def _sdk():
    try:
        import qarnot
        import qarnot.exceptions
        import qarnot.hardware_constraint
        import qarnot.scheduling_type
    except ImportError as exc:  # pragma: no cover - pinned in requirements.txt
        raise BackendError(f"the qarnot SDK is not installed ({exc}): pip install -r requirements.txt") from None
    return qarnot


class Session(RemoteSession):
    """One pool's view of Qarnot for one credential: the lazily built connection and the secret to scrub."""

    kind = "qarnot"
    label = "Qarnot"
    runs = "tasks"
    user_credential_words = "Qarnot token"
    sign_in = "connection"
    url_keys = ("cluster_url",)
    service_env = ("token_env",)
    paste = Paste(
        (("token", "API token", True),),
        "API token",
        4096,
        malformed="Paste the API token exactly as Qarnot's console shows it (one line, no spaces).",
        refused="Qarnot refused this token: copy it again from your Qarnot account's settings.",
    )
    account_word = "Qarnot account"

    def service_credential(self) -> tuple[str]:
        token = env_secret(self.remote.get("token_env"), "Qarnot token", self.remote)
        self.secrets = [token]
        return (token,)

    def user_credential(self, identity: RemoteIdentity) -> tuple[str]:
        token = identity.token()
        self.secrets = [token]
        return (token,)

    @classmethod
    def account_of(cls, remote: dict, token: str) -> tuple[str, str]:
        """The account (e-mail) a pasted API token belongs to, asked of ``/info`` with that token
        (a connection of its own, not cached). :class:`CredentialsRequired` when Qarnot refuses it."""
        session = cls(remote)
        try:
            return str(session.open_client((token,)).user_info.email or ""), ""
        except Exception as exc:
            failure = session.classify(exc)
            if failure.refused:
                raise CredentialsRequired("Qarnot refused the token") from None
            raise BackendError(scrub(f"Qarnot account check failed: {failure.detail}", [token])) from None

    def open_client(self, credential: tuple):
        """A new connection: it asks ``/settings`` and ``/info`` and sets up S3 in its constructor,
        so the shared session builds it on first use and keeps it per (cluster, token)."""
        return _sdk().connection.Connection(
            client_token=credential[0],
            cluster_url=self.remote.get("cluster_url") or None,
            cluster_timeout=TIMEOUT,
            retry_count=RETRY_COUNT,
            retry_wait=RETRY_WAIT,
            logger=sdk_logger,
        )

    @property
    def conn(self):
        return self.client

    @property
    def s3(self):
        client = self.conn.s3client
        if client is None:
            raise BackendError("this Qarnot cluster announces no storage service: buckets are unavailable")
        return client

    def classify(self, exc: Exception) -> Failure:
        """What an SDK, storage or transport exception says; the HTTP status when it carries one.
        No answer (timeout, connection, storage transport): retrying later may work (R-CASE-1)."""
        import botocore.exceptions
        import requests

        response = getattr(exc, "response", None)
        status = getattr(response, "status_code", None)
        if status is None and isinstance(response, dict):
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        status = status if isinstance(status, int) else None
        if isinstance(exc, botocore.exceptions.ClientError):
            error = exc.response.get("Error", {})
            code = error.get("Code", "")
            if code in ("QuotaExceeded", "TooManyBuckets", "EntityTooLarge") or "quota" in str(error).lower():
                detail = f"storage quota reached ({code}): free buckets or storage on the account"
            else:
                detail = f"storage error {code}: {error.get('Message', '')}".strip()
            return Failure(detail, status, provider_words=True, transient=False)
        if isinstance(exc, botocore.exceptions.BotoCoreError):
            return Failure(f"storage unreachable ({type(exc).__name__})", status, provider_words=True, transient=True)
        if isinstance(exc, requests.Timeout):
            detail = f"no answer within {TIMEOUT} s (timeout)"
            return Failure(detail, status, provider_words=True, transient=True, timeout=True)
        if isinstance(exc, requests.ConnectionError):
            return Failure("cannot connect to the Qarnot API", status, provider_words=True, transient=True)
        if isinstance(exc, _sdk().exceptions.UnauthorizedException):
            # A 401 is the token itself refused: the SDK's retry wrapper raises
            # UnauthorizedException() without arguments for a 401 only; its 403s (raise_on_error)
            # carry the API's message. No text is read, only whether there is any.
            detail = f"unauthorized: {exc}" if str(exc) else "the token was refused (unauthorized)"
            return Failure(detail, status, provider_words=True, transient=False, refused=not exc.args)
        return Failure(f"{type(exc).__name__}: {exc}", status, provider_words=True, transient=False)
