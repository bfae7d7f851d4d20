"""Sealing the per-user credentials kept in the database (docs/backends.md, "Per-user credentials").

A user's refresh token (FirecREST) or API token (Qarnot) is the one credential Gridgate keeps in
its database, and only sealed: Fernet (AES-128-CBC + HMAC-SHA256, from ``cryptography``) under
the keys of ``GRIDGATE_CREDENTIALS_KEY``, which live in the environment of the web and worker
processes, never in the database. ``MultiFernet`` seals with the first key and opens with any, so
a key is rotated without a flag day: put the new key first, run ``manage.py reseal_connections``
(every sealed value re-sealed under it), then drop the old key.

Without a key the service still starts and serves; connecting is refused with
:class:`SealingUnavailable`, whose message says what an operator must set. Nothing here ever puts
a plaintext or a key into a message.
"""

from __future__ import annotations

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings

from apps.core.exceptions import Unavailable


class SealingUnavailable(Unavailable):
    """503: no usable ``GRIDGATE_CREDENTIALS_KEY``; connecting is refused until an operator sets it."""

    default_detail = (
        "Connecting your own credentials is not possible on this site yet: the operators have not set "
        "GRIDGATE_CREDENTIALS_KEY, the key that encrypts stored credentials. Ask an administrator."
    )


class Unreadable(Exception):
    """A sealed value none of the configured keys opens (its key was dropped too early, or the
    value was tampered with). The message names no value."""


def _box():
    keys = settings.GRIDGATE_CREDENTIALS_KEY  # a list: config.env.env_list split the variable
    if not keys:
        raise SealingUnavailable()
    try:
        return MultiFernet([Fernet(key) for key in keys])
    except (ValueError, TypeError):
        # Fernet's own message quotes nothing of the key; ours says what a valid one looks like.
        raise SealingUnavailable(
            "Connecting your own credentials is not possible on this site yet: GRIDGATE_CREDENTIALS_KEY is not a "
            "list of Fernet keys (32 url-safe base64 bytes each, comma-separated). Ask an administrator."
        ) from None


def available() -> bool:
    """Whether credentials can be sealed here (a usable key is configured)."""
    try:
        _box()
    except SealingUnavailable:
        return False
    return True


def require() -> None:
    """Raise :class:`SealingUnavailable` (503, in words) unless credentials can be sealed."""
    _box()


def seal(plaintext: str) -> str:
    """The Fernet token of ``plaintext`` under the first key (text: it is stored in a text column)."""
    if not plaintext:
        raise ValueError("nothing to seal")
    return _box().encrypt(plaintext.encode()).decode("ascii")


def unseal(sealed: str) -> str:
    """The plaintext of a sealed value; :class:`Unreadable` when no configured key opens it."""
    try:
        return _box().decrypt(sealed.encode("ascii")).decode()
    except (InvalidToken, UnicodeError, ValueError):
        raise Unreadable(
            "a stored credential cannot be opened with the keys of GRIDGATE_CREDENTIALS_KEY "
            "(was the key it was sealed with dropped?)"
        ) from None


def reseal(sealed: str) -> str:
    """``sealed`` under the first key (MultiFernet.rotate), for a key rotation."""
    try:
        return _box().rotate(sealed.encode("ascii")).decode("ascii")
    except (InvalidToken, UnicodeError, ValueError):
        raise Unreadable("a stored credential cannot be opened with the keys of GRIDGATE_CREDENTIALS_KEY") from None
