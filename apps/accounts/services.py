"""API tokens and the token login. Views, the admin, commands and tests call these."""

import hashlib
import secrets
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import authenticate
from django.utils import timezone

from apps.accounts import lockout
from apps.accounts.models import ApiToken
from apps.core.exceptions import NON_FIELD_KEY, InvalidFields, TooManyRequests

#: 32 random bytes: 43 URL-safe characters, 256 bits.
KEY_BYTES = 32
PREFIX_LENGTH = ApiToken._meta.get_field("prefix").max_length
NAME_LENGTH = ApiToken._meta.get_field("name").max_length
#: The words DRF's ObtainAuthToken answered with: clients may match on them.
BAD_CREDENTIALS = "Unable to log in with provided credentials."


def digest_of(key: str) -> str:
    """What is stored for ``key`` and looked up for a presented one."""
    return hashlib.sha256(key.encode()).hexdigest()


def issue_token(user, *, name: str = "") -> tuple[ApiToken, str]:
    """A new token for ``user`` and its key, which exists nowhere else after this call returns:
    the caller shows it once. Expires GRIDGATE_TOKEN_DAYS from now."""
    key = secrets.token_urlsafe(KEY_BYTES)
    now = timezone.now()
    token = ApiToken.objects.create(
        user=user,
        digest=digest_of(key),
        prefix=key[:PREFIX_LENGTH],
        name=name[:NAME_LENGTH],
        created_at=now,
        expires_at=now + timedelta(days=settings.GRIDGATE_TOKEN_DAYS),
    )
    return token, key


def revoke_tokens(user) -> int:
    """Delete every token of ``user`` (their password changed, or an operator says so)."""
    deleted, _ = ApiToken.objects.filter(user_id=user.pk).delete()
    return deleted


class LoginLockedOut(TooManyRequests):
    """429: too many failed logins for this username from this address (django-axes)."""


def log_in(*, request, username: str, password: str):
    """The user ``username`` / ``password`` names, for the token endpoint.

    ``authenticate`` goes through django-axes' backend first, which refuses a username and client
    address that failed too often, before any password is checked (so a locked-out client cannot
    go on guessing, not even the right password gets through), and records each failure. Axes
    flags the request when it locks out, on this failure or an earlier one: that is a 429 with the
    cool-off, every other refusal the 400 DRF's token view gave.
    """
    user = authenticate(request=request, username=username, password=password)
    if user is None:
        if lockout.is_locked_out(request):
            raise LoginLockedOut(lockout.lockout_message(), retry_after=lockout.cool_off_seconds())
        raise InvalidFields({NON_FIELD_KEY: [BAD_CREDENTIALS]})
    lockout.forget_failures(request, username)
    return user
