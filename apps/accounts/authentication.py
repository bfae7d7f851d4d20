"""``Authorization: Token <key>`` against hashed, expiring tokens."""

from django.utils import timezone
from rest_framework.authentication import TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed

from apps.accounts.models import ApiToken
from apps.accounts.services import digest_of, note_use
from apps.accounts.statements import token_with_user


class ApiTokenAuthentication(TokenAuthentication):
    """DRF's header parsing and 401s, the key looked up by its digest.

    On every API request's path: one statement (the token with its user), and no write but the
    once-a-minute ``last_used_at`` (``services.note_use``, decided on the fetched row). Expiry and an
    inactive user are checked on the fetched row so the client is told which it is.
    """

    keyword = "Token"
    model = ApiToken

    def authenticate_credentials(self, key):
        token = token_with_user(digest_of(key))
        if token is None:
            raise AuthenticationFailed("Invalid token.")
        now = timezone.now()
        if token.expires_at <= now:
            raise AuthenticationFailed("Token expired: log in again at /api/v1/auth/token/ for a new one.")
        if not token.user.is_active:
            raise AuthenticationFailed("User inactive or deleted.")
        note_use(token, now=now)
        return token.user, token
