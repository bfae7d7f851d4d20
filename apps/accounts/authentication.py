"""``Authorization: Token <key>`` against hashed, expiring tokens."""

from django.utils import timezone
from rest_framework.authentication import SessionAuthentication, TokenAuthentication
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


class FreshSessionAuthentication(SessionAuthentication):
    """The browser's session on the API, as DRF's, except a session signed in with the identity
    provider whose renewal is due (GRIDGATE_OIDC_RENEW_SECONDS after the sign-in): pages send it back
    to the provider (``prompt=none``), which signs out a user it no longer knows; the API cannot
    redirect, so it answers 401 until a page has renewed it. Otherwise a cookie of a user the
    provider had signed out went on answering the API, and minting API tokens."""

    def authenticate(self, request):
        from apps.accounts.oidc import session_past_renewal

        if session_past_renewal(request._request):
            raise AuthenticationFailed(
                "Your sign-in with the identity provider needs renewing: open a page of the site, or use an API token."
            )
        return super().authenticate(request)
