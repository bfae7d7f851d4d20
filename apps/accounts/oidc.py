"""Sign-in with the centre's OpenID Connect provider, and its JWTs as API bearer tokens
(docs/identity.md). Everything here is inert while ``GRIDGATE_OIDC_ISSUER`` is empty.

Browser sign-in is mozilla-django-oidc's authorization code flow with PKCE; this module decides
who the user is. A user is found by their :class:`~apps.accounts.models.Identity` (issuer and
subject), never by a username or e-mail a provider could hand to someone else; a first sign-in
creates the user, refused when a local account already has the username (an operator links the
two in the admin). At every sign-in the user's groups become the existing Django groups the
groups claim names (Keycloak's full paths ``/a/b`` as ``a/b``): pool grants to groups follow the
provider.

Every JWT (the ID token at sign-in, a bearer token on the API) is checked by :func:`decode`:
signature against the provider's published keys (kept in memory, fetched again when a token
names a key not seen yet, at most every GRIDGATE_OIDC_JWKS_REFRESH_SECONDS, and hourly so
that a withdrawn key stops working), issuer, audience, expiry. A bearer request costs no call to
the provider and one SQL statement (the identity's user).
"""

import logging
import threading
import time

import jwt
import requests
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.models import Group
from django.core.exceptions import SuspiciousOperation
from django.db import transaction
from django.http import Http404
from django.utils import timezone
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed

from apps.accounts import statements
from apps.accounts.models import Identity

log = logging.getLogger(__name__)

USERNAME_LENGTH = 150
GROUP_NAME_LENGTH = Group._meta.get_field("name").max_length
MAX_GROUPS = 500  # a claim's first entries considered; more is a misconfigured mapper
KEYS_LIFETIME = 3600  # seconds before the keys are fetched again even without an unknown one


def enabled() -> bool:
    return bool(settings.GRIDGATE_OIDC_ISSUER)


class InvalidToken(Exception):
    """Why a JWT is refused, in words safe to show its sender."""


class Keys:
    """The provider's signing keys by key id, shared by the process's threads."""

    def __init__(self):
        self._lock = threading.Lock()
        self._keys: dict[str, jwt.PyJWK] = {}
        self._url = ""
        self._fetched_at = float("-inf")

    def get(self, kid: str | None) -> jwt.PyJWK | None:
        url = settings.OIDC_OP_JWKS_ENDPOINT
        key = self._find(kid) if url == self._url and time.monotonic() - self._fetched_at < KEYS_LIFETIME else None
        if key is not None:
            return key
        with self._lock:
            age = time.monotonic() - self._fetched_at
            if (
                url != self._url
                or age >= KEYS_LIFETIME
                or (self._find(kid) is None and age >= settings.GRIDGATE_OIDC_JWKS_REFRESH_SECONDS)
            ):
                self._fetch(url)
            return self._find(kid)

    def _find(self, kid: str | None) -> jwt.PyJWK | None:
        if kid is None and len(self._keys) == 1:  # a provider with one key may leave kid out
            return next(iter(self._keys.values()))
        return self._keys.get(kid) if isinstance(kid, str) else None

    def _fetch(self, url: str) -> None:
        try:
            response = requests.get(url, timeout=settings.OIDC_TIMEOUT)
            response.raise_for_status()
            found = jwt.PyJWKSet.from_dict(response.json()).keys
        except (requests.RequestException, ValueError, jwt.PyJWKSetError) as exc:
            log.warning("the identity provider's keys could not be read from %s: %s", url, exc)
            if url != self._url:
                self._keys = {}
        else:
            self._keys = {key.key_id or "": key for key in found}
        self._url, self._fetched_at = url, time.monotonic()  # not again before the interval


KEYS = Keys()


def decode(token: str, *, audience: str) -> dict:
    """The claims of a JWT the provider signed for ``audience``; InvalidToken otherwise."""
    try:
        header = jwt.get_unverified_header(token)
    except jwt.InvalidTokenError:
        raise InvalidToken("not a JWT") from None
    key = KEYS.get(header.get("kid"))
    if key is None:
        raise InvalidToken("signed with a key the identity provider does not publish")
    try:
        return jwt.decode(
            token,
            key.key,
            algorithms=[settings.OIDC_RP_SIGN_ALGO],
            audience=audience,
            issuer=settings.GRIDGATE_OIDC_ISSUER,
            options={"require": ["exp", "iat", "iss", "sub"]},
            leeway=30,
        )
    except jwt.ExpiredSignatureError:
        raise InvalidToken("expired") from None
    except jwt.InvalidAudienceError:
        raise InvalidToken("issued for another audience") from None
    except jwt.InvalidIssuerError:
        raise InvalidToken("issued by another provider") from None
    except jwt.InvalidTokenError as exc:
        raise InvalidToken(f"invalid ({type(exc).__name__})") from None


def group_names(claims: dict) -> set[str]:
    """The group names the groups claim carries: strings, Keycloak's full paths without their
    leading slash; anything else is ignored."""
    raw = claims.get(settings.GRIDGATE_OIDC_GROUPS_CLAIM) or []
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list):
        return set()
    names = {entry.strip().lstrip("/") for entry in raw[:MAX_GROUPS] if isinstance(entry, str)}
    return {name for name in names if name and len(name) <= GROUP_NAME_LENGTH}


def identity_user(subject: str):
    """The user whose identity at the configured issuer is ``subject`` (one statement)."""
    return statements.identity_user(settings.GRIDGATE_OIDC_ISSUER, subject)


class OidcBackend(OIDCAuthenticationBackend):
    """Users from the provider's claims (the user info, whose ``sub`` must be the ID token's)."""

    def authenticate(self, request, **kwargs):
        if not enabled():
            return None
        return super().authenticate(request, **kwargs)

    def get_user(self, user_id):
        """The user of a session signed in here: none once deactivated, or once the provider is
        no longer configured."""
        user = super().get_user(user_id) if enabled() else None
        return user if user is not None and user.is_active else None

    def verify_token(self, token, **kwargs):
        try:
            claims = decode(token, audience=settings.OIDC_RP_CLIENT_ID)
        except InvalidToken as exc:
            raise SuspiciousOperation(f"ID token refused: {exc}") from None
        if claims.get("nonce") != kwargs.get("nonce"):
            raise SuspiciousOperation("ID token refused: its nonce is not this sign-in's")
        return claims

    def get_userinfo(self, access_token, id_token, payload):
        info = super().get_userinfo(access_token, id_token, payload)
        if info.get("sub") != payload.get("sub"):
            raise SuspiciousOperation("the user info is not the ID token's subject")
        return info

    def verify_claims(self, claims):
        return isinstance(claims.get("sub"), str) and bool(self.get_username(claims))

    def get_username(self, claims) -> str:
        username = claims.get(settings.GRIDGATE_OIDC_USERNAME_CLAIM)
        return username.strip() if isinstance(username, str) and len(username.strip()) <= USERNAME_LENGTH else ""

    def filter_users_by_claims(self, claims):
        return self.UserModel.objects.filter(
            identities__issuer=settings.GRIDGATE_OIDC_ISSUER, identities__subject=claims["sub"]
        )

    def create_user(self, claims):
        username = self.get_username(claims)
        with transaction.atomic():
            if self.UserModel.objects.filter(username__iexact=username).exists():
                messages.error(
                    self.request,
                    f"An account named '{username}' already exists here and is not linked to your sign-in: "
                    "ask an operator to link it.",
                )
                raise SuspiciousOperation(f"first sign-in of {claims['sub']!r}: username {username!r} is taken")
            user = self.UserModel.objects.create_user(username)
            Identity.objects.create(user=user, issuer=settings.GRIDGATE_OIDC_ISSUER, subject=claims["sub"])
        log.info("user %s created at their first sign-in (subject %s)", username, claims["sub"])
        return self.update_user(user, claims)

    def update_user(self, user, claims):
        """The profile and groups the claims give, at each sign-in."""
        fields = {
            "email": claims.get("email"),
            "first_name": claims.get("given_name"),
            "last_name": claims.get("family_name"),
        }
        changed = []
        for field, value in fields.items():
            limit = self.UserModel._meta.get_field(field).max_length
            if isinstance(value, str) and len(value) <= limit and getattr(user, field) != value:
                setattr(user, field, value)
                changed.append(field)
        with transaction.atomic():
            if changed:
                user.save(update_fields=changed)
            user.groups.set(Group.objects.filter(name__in=group_names(claims)))
            Identity.objects.filter(user=user, issuer=settings.GRIDGATE_OIDC_ISSUER, subject=claims["sub"]).update(
                last_login_at=timezone.now()
            )
        return user


class AuthenticateView(OIDCAuthenticationRequestView):
    """``/oidc/authenticate/``: off (404) without a provider."""

    def get(self, request):
        if not enabled():
            raise Http404("Sign-in with an identity provider is not configured.")
        return super().get(request)


class CallbackView(OIDCAuthenticationCallbackView):
    """``/oidc/callback/``: off (404) without a provider."""

    def get(self, request):
        if not enabled():
            raise Http404("Sign-in with an identity provider is not configured.")
        return super().get(request)


class BearerAuthentication(BaseAuthentication):
    """``Authorization: Bearer <jwt>`` from the provider, for users who signed in once (their
    identity is known) or whom an operator linked."""

    def authenticate(self, request):
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != b"bearer" or not enabled():
            return None
        if len(parts) != 2:
            raise AuthenticationFailed("Invalid bearer header: send 'Authorization: Bearer <token>'.")
        try:
            claims = decode(parts[1].decode("ascii"), audience=settings.GRIDGATE_OIDC_AUDIENCE)
        except UnicodeError:
            raise AuthenticationFailed("Invalid bearer token: not a JWT.") from None
        except InvalidToken as exc:
            raise AuthenticationFailed(f"Invalid bearer token: {exc}.") from None
        user = identity_user(claims["sub"])
        if user is None:
            raise AuthenticationFailed("No account for this identity yet: sign in once on the web pages.")
        if not user.is_active:
            raise AuthenticationFailed("User inactive or deleted.")
        return user, claims

    def authenticate_header(self, request):
        return 'Bearer realm="api"'
