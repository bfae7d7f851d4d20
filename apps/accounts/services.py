"""API tokens and the token login. Views, the admin, commands and tests call these."""

import hashlib
import secrets
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import authenticate, get_user_model
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from apps.accounts import lockout
from apps.accounts.models import ApiToken
from apps.core.exceptions import NON_FIELD_KEY, InvalidFields, NotFound, TooManyRequests

#: 32 random bytes: 43 URL-safe characters, 256 bits.
KEY_BYTES = 32
PREFIX_LENGTH = ApiToken._meta.get_field("prefix").max_length
NAME_LENGTH = ApiToken._meta.get_field("name").max_length
#: The words DRF's ObtainAuthToken answered with: clients may match on them.
BAD_CREDENTIALS = "Unable to log in with provided credentials."
#: A token asked for by a request authenticated before the user's password changed.
CREDENTIALS_CHANGED = "Your password changed while this request ran: sign in again."
#: How stale ``last_used_at`` may be: it is written at most once per token in this time.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def digest_of(key: str) -> str:
    """What is stored for ``key`` and looked up for a presented one."""
    return hashlib.sha256(key.encode()).hexdigest()


def default_token_days() -> int:
    """The term of a token whose holder chose none: GRIDGATE_TOKEN_DAYS, within the maximum (an
    operator who lowers GRIDGATE_TOKEN_MAX_DAYS below it does not break the login)."""
    return min(settings.GRIDGATE_TOKEN_DAYS, settings.GRIDGATE_TOKEN_MAX_DAYS)


def issue_token(user, *, name: str = "", days: int | None = None) -> tuple[ApiToken, str]:
    """A new token for ``user`` and its key, which exists nowhere else after this call returns:
    the caller shows it once. Expires ``days`` from now (:func:`default_token_days` when None);
    more than GRIDGATE_TOKEN_MAX_DAYS or less than one day is refused (``expires_in_days``)."""
    if days is None:
        days = default_token_days()
    elif days < 1:
        raise InvalidFields({"expires_in_days": ["A token must last at least 1 day."]})
    elif days > settings.GRIDGATE_TOKEN_MAX_DAYS:
        raise InvalidFields(
            {"expires_in_days": [f"A token may last at most {settings.GRIDGATE_TOKEN_MAX_DAYS} days on this site."]}
        )
    key = secrets.token_urlsafe(KEY_BYTES)
    now = timezone.now()
    expires_at = now + timedelta(days=days)
    from apps.accounts.oidc import token_term_limit

    # A user of the identity provider whose sign-in nothing can confirm later (no refresh token
    # held): the token lasts no longer than their browser session would.
    limit = token_term_limit(user)
    if limit is not None:
        expires_at = min(expires_at, limit)
    with transaction.atomic():
        # A password change revokes every token of the user (``receivers``): one minted by a
        # request that authenticated before the change (the old password, a revoked token, a
        # session) must not outlive it. The user's row serializes the two: the change's UPDATE
        # waits for this insert to commit and then deletes it, or committed first and is seen here.
        current = get_user_model().objects.select_for_update().filter(pk=user.pk).values_list("password", flat=True)
        if current.first() != user.password:
            raise InvalidFields({NON_FIELD_KEY: [CREDENTIALS_CHANGED]})
        token = ApiToken.objects.create(
            user=user,
            digest=digest_of(key),
            prefix=key[:PREFIX_LENGTH],
            name=name[:NAME_LENGTH],
            created_at=now,
            expires_at=expires_at,
        )
    return token, key


class NoSuchToken(NotFound):
    """404: no token of the caller's with that id (someone else's is not told apart from none)."""

    default_detail = "No such token."


def revoke_token(user, token_id: int) -> ApiToken:
    """Delete ``user``'s token ``token_id`` and return it (to name it): its key stops working at
    its next request. The owner's alone, whoever the caller is (staff revoke others' in the admin)."""
    token = ApiToken.objects.filter(pk=token_id, user_id=user.pk).first()
    if token is None:
        raise NoSuchToken()
    token.delete()  # a concurrent revocation of the same token deletes nothing here: same outcome
    return token


def note_use(token: ApiToken, *, now=None) -> None:
    """Record that ``token`` (as fetched by the authentication) authenticated a request now.

    Most requests write nothing: only when the fetched ``last_used_at`` is empty or older than
    :data:`LAST_USED_RESOLUTION`, so a busy token costs one UPDATE a minute, not one per request.
    Concurrent requests with the same token may all see it due; the UPDATE's own condition is
    the compare-and-set, so the first to commit writes and the others match no row.
    """
    now = now or timezone.now()
    stale = now - LAST_USED_RESOLUTION
    if token.last_used_at is not None and token.last_used_at >= stale:
        return
    ApiToken.objects.filter(pk=token.pk).filter(Q(last_used_at__isnull=True) | Q(last_used_at__lt=stale)).update(
        last_used_at=now
    )
    token.last_used_at = now


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
            raise LoginLockedOut(lockout.lockout_message(request), retry_after=lockout.retry_after(request))
        raise InvalidFields({NON_FIELD_KEY: [BAD_CREDENTIALS]})
    lockout.forget_failures(request, username)
    return user
