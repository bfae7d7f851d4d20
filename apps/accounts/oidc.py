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
import re
import threading
import time
import unicodedata
from datetime import timedelta
from urllib.parse import urlencode

import jwt
import requests
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import BACKEND_SESSION_KEY
from django.contrib.auth import logout as django_logout
from django.contrib.auth.models import Group
from django.core.exceptions import SuspiciousOperation
from django.db import IntegrityError, transaction
from django.http import Http404, HttpResponseRedirect
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed

from apps.accounts import statements
from apps.accounts.models import ApiToken, Identity
from apps.credentials import sealing

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


def decode(token: str, *, audience: str, access_token: bool = False) -> dict:
    """The claims of a JWT the provider signed for ``audience``; InvalidToken otherwise.

    ``access_token``: an API bearer token must be an access token in RFC 9068's profile (header
    ``typ`` one of GRIDGATE_OIDC_ACCESS_TOKEN_TYPES, ``at+jwt`` by default), and never an ID
    token, whatever its header says (a ``nonce``, or Keycloak's ``typ: ID`` claim): the web client's
    ID token names the client as its audience and travels through browsers, so accepted as a
    bearer token it would be a key to the API that was never issued as one."""
    try:
        header = jwt.get_unverified_header(token)
    except jwt.InvalidTokenError:
        raise InvalidToken("not a JWT") from None
    if access_token:
        kind = str(header.get("typ") or "").lower()
        if kind not in settings.GRIDGATE_OIDC_ACCESS_TOKEN_TYPES:
            raise InvalidToken(
                f"not an access token (its type is {kind or 'missing'!r}, not at+jwt: RFC 9068; an ID token is "
                "never accepted)"
            )
    key = KEYS.get(header.get("kid"))
    if key is None:
        raise InvalidToken("signed with a key the identity provider does not publish")
    try:
        claims = jwt.decode(
            token,
            key.key,
            algorithms=[settings.OIDC_RP_SIGN_ALGO],
            audience=audience,
            issuer=settings.GRIDGATE_OIDC_ISSUER,
            options={"require": ["exp", "iat", "iss", "sub"]},
            leeway=30,
        )
        if access_token and ("nonce" in claims or str(claims.get("typ", "")).upper() == "ID"):
            raise InvalidToken("an ID token, not an access token (RFC 9068)")
        return claims
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


#: what a username may hold after NFKC: letters, digits and ``.@+-_`` (Django's own rule), never
#: starting with a dot or a dash (a path, an option), at most USERNAME_LENGTH characters
USERNAME = re.compile(r"[^\W.-][\w.@+-]*", re.UNICODE)


class BadUsername(ValueError):
    """Why a provider's username cannot name an account here, in words for the refused user."""


#: Latin characters that pass for one another (``l``, ``I``, ``1``; ``0`` and ``o``), folded together
LATIN_FOLD = str.maketrans({"i": "l", "1": "l", "|": "l", "0": "o"})


def skeleton(name: str) -> str:
    """``name`` with every character that looks like a Latin one replaced by it, casefolded, the
    Latin look-alikes folded together (the idea of UTS #39's skeleton, with confusable-homoglyphs'
    data): ``аӏісе`` in Cyrillic and ``alice`` have the same skeleton."""
    from confusable_homoglyphs import confusables

    found = {
        entry["character"]: entry["homoglyphs"][0]["c"]
        for entry in confusables.is_confusable(name, greedy=True, preferred_aliases=["latin"]) or []
        if entry.get("homoglyphs")
    }
    return "".join(found.get(character, character) for character in name).casefold().translate(LATIN_FOLD)


def checked_username(raw) -> str:
    """The username a provider's claim names, NFKC-normalised, or :class:`BadUsername`: invisible
    or control characters (``alice\u200b``), a path (``../admin``), a name mixing scripts with
    look-alikes (``аlice`` with a Cyrillic ``а``), or one that looks like another account's name
    (by :func:`skeleton`) are refused: each would be an account people take for another."""
    from confusable_homoglyphs import confusables

    if not isinstance(raw, str):
        raise BadUsername("the provider sent no username")
    name = unicodedata.normalize("NFKC", raw).strip()
    if not name or len(name) > USERNAME_LENGTH:
        raise BadUsername(f"a username has 1 to {USERNAME_LENGTH} characters")
    if not USERNAME.fullmatch(name):
        raise BadUsername(
            f"{name!r} holds characters a username here may not (letters, digits and . @ + - _ only, "
            "not first a dot or a dash)"
        )
    if confusables.is_dangerous(name):
        raise BadUsername(f"{name!r} mixes scripts with characters that look alike")
    from django.contrib.auth import get_user_model
    from django.db.models.functions import Length

    User = get_user_model()  # noqa: N806
    look_alike = skeleton(name)
    # Accounts of the same length whose skeleton is this one's (a first sign-in only: a few
    # hundred names at most on a large site).
    others = (
        User.objects.annotate(length=Length("username"))
        .filter(length=len(name))
        .exclude(username__iexact=name)
        .values_list("username", flat=True)
    )
    for other in others:
        if skeleton(other) == look_alike:
            raise BadUsername(f"{name!r} looks like the existing account {other!r}")
    return name


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

    def get_token(self, payload):
        """The token endpoint's answer, kept for the sign-in's refresh token (:meth:`update_user`)."""
        self.token_info = super().get_token(payload)
        return self.token_info

    def verify_claims(self, claims):
        return isinstance(claims.get("sub"), str)

    def get_username(self, claims) -> str:
        try:
            return checked_username(claims.get(settings.GRIDGATE_OIDC_USERNAME_CLAIM))
        except BadUsername as exc:
            messages.error(
                self.request,
                f"Your sign-in's username cannot be used here: {exc}. Ask an operator to link your sign-in "
                "to an account (manage.py link_identity).",
            )
            raise SuspiciousOperation(f"first sign-in of {claims.get('sub')!r}: {exc}") from None

    def filter_users_by_claims(self, claims):
        return self.UserModel.objects.filter(
            identities__issuer=settings.GRIDGATE_OIDC_ISSUER, identities__subject=claims["sub"]
        )

    def create_user(self, claims):
        """The account of a first sign-in. Two first sign-ins of one subject at once (two tabs, a
        double click) end in one account: the one that finds the name taken, or loses the insert,
        signs in as the account the other made; a name anyone else holds is refused."""
        username = self.get_username(claims)
        if not self.UserModel.objects.filter(username__iexact=username).exists():
            try:
                with transaction.atomic():
                    user = self.UserModel.objects.create_user(username)
                    Identity.objects.create(user=user, issuer=settings.GRIDGATE_OIDC_ISSUER, subject=claims["sub"])
            except IntegrityError:
                pass  # made meanwhile: by this subject's other sign-in, or under someone else's name
            else:
                log.info("user %s created at their first sign-in (subject %s)", username, claims["sub"])
                return self.update_user(user, claims)
        user = self.filter_users_by_claims(claims).first()
        if user is None:
            messages.error(
                self.request,
                f"An account named '{username}' already exists here and is not linked to your sign-in: "
                "ask an operator to link it.",
            )
            raise SuspiciousOperation(f"first sign-in of {claims['sub']!r}: username {username!r} is taken")
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
        identity = {"last_login_at": timezone.now()}
        refresh = (getattr(self, "token_info", None) or {}).get("refresh_token")
        if isinstance(refresh, str) and refresh and sealing.available():
            identity |= {"sealed_refresh_token": sealing.seal(refresh), "checked_at": timezone.now()}
        with transaction.atomic():
            if changed:
                user.save(update_fields=changed)
            claim = settings.GRIDGATE_OIDC_GROUPS_CLAIM
            if claim in claims:
                user.groups.set(Group.objects.filter(name__in=group_names(claims)))
            else:
                # An absent claim is not "no groups": providers that release it per scope
                # (oidc-provider, Dex, Okta, Authentik) leave it out when the scope was not asked
                # for or not granted, and a mapper removed by mistake would strip every pool.
                log.warning(
                    "sign-in of %s: the provider sent no %r claim; their groups are kept as they were "
                    "(ask for the scope that releases it: GRIDGATE_OIDC_SCOPES, docs/identity.md)",
                    user.username,
                    claim,
                )
            Identity.objects.filter(user=user, issuer=settings.GRIDGATE_OIDC_ISSUER, subject=claims["sub"]).update(
                **identity
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
            claims = decode(parts[1].decode("ascii"), audience=settings.GRIDGATE_OIDC_AUDIENCE, access_token=True)
        except UnicodeError:
            raise AuthenticationFailed("Invalid bearer token: not a JWT.") from None
        except InvalidToken as exc:
            raise AuthenticationFailed(f"Invalid bearer token: {exc}.") from None
        user = identity_user(claims["sub"])
        if user is None:
            if is_service_account(claims):
                raise AuthenticationFailed(
                    f"No account for the service account {claims['sub']!r} (a client credentials token): an "
                    "operator maps it to a user (manage.py link_identity, or admin → Identities)."
                )
            raise AuthenticationFailed(
                "No account for this identity yet: sign in once on the web pages, or ask an operator to link it."
            )
        if not user.is_active:
            raise AuthenticationFailed("User inactive or deleted.")
        return user, claims

    def authenticate_header(self, request):
        return 'Bearer realm="api"'


def is_service_account(claims: dict) -> bool:
    """A token a client got for itself (the client credentials grant): RFC 9068 names the client
    as its subject; Keycloak's service accounts have no personal username."""
    client = claims.get("client_id") or claims.get("azp")
    return (client is not None and claims.get("sub") == client) or str(claims.get("preferred_username", "")).startswith(
        "service-account-"
    )


def signed_in_with_provider(request) -> bool:
    session = getattr(request, "session", None)
    return session is not None and session.get(BACKEND_SESSION_KEY) == "apps.accounts.oidc.OidcBackend"


def session_past_renewal(request) -> bool:
    """A browser session signed in with the provider whose renewal is due: pages send it back to
    the provider (``prompt=none``); everything else refuses it until then."""
    if not signed_in_with_provider(request):
        return False
    due = request.session.get("oidc_id_token_expiration")
    return due is None or time.time() > float(due)


# -- personal tokens end when the provider says the user is gone -------------------------------------
class ProviderRefused(Exception):
    """The provider refused the sign-in's refresh grant: the user is gone there."""


def refresh_grant(refresh_token: str) -> str:
    """The provider's rotated refresh token; ProviderRefused when it refuses the grant
    (``invalid_grant``: signed out, disabled, deleted), requests' errors when it cannot be asked."""
    response = requests.post(
        settings.OIDC_OP_TOKEN_ENDPOINT,
        data={"grant_type": "refresh_token", "refresh_token": refresh_token},
        auth=(settings.OIDC_RP_CLIENT_ID, settings.OIDC_RP_CLIENT_SECRET),
        timeout=settings.OIDC_TIMEOUT,
    )
    if response.status_code in (400, 401):
        try:
            error = response.json().get("error")
        except ValueError:
            error = None
        if error == "invalid_grant":
            raise ProviderRefused(error)
    response.raise_for_status()
    return response.json().get("refresh_token") or refresh_token


def recheck_identities(*, limit: int = 200) -> dict:
    """The worker's pass (every minute): each identity whose user holds API tokens and whose
    sign-in was last confirmed GRIDGATE_OIDC_RECHECK_SECONDS ago is confirmed again with a refresh
    grant. A refusal deletes the user's API tokens (and forgets the refresh token); a provider that
    cannot be reached changes nothing (tried again next time). The rotated refresh token is stored
    under the identity's row lock, with the grant inside it: a refresh token used twice makes
    Keycloak end the session, so two workers never trade the same one."""
    if not enabled() or not sealing.available():
        return {"checked": 0, "ended": 0}
    due = timezone.now() - timedelta(seconds=settings.GRIDGATE_OIDC_RECHECK_SECONDS)
    candidates = list(
        Identity.objects.filter(issuer=settings.GRIDGATE_OIDC_ISSUER)
        .exclude(sealed_refresh_token="")
        .filter(user__api_tokens__expires_at__gt=timezone.now())
        .filter(checked_at__lt=due)
        .values_list("pk", flat=True)
        .distinct()[:limit]
    )
    checked = ended = 0
    for pk in candidates:
        with transaction.atomic():
            identity = Identity.objects.select_for_update(skip_locked=True).filter(pk=pk, checked_at__lt=due).first()
            if identity is None:
                continue  # another worker has it, or confirmed it meanwhile
            try:
                rotated = refresh_grant(sealing.unseal(identity.sealed_refresh_token))
            except ProviderRefused:
                count, _ = ApiToken.objects.filter(user_id=identity.user_id).delete()
                identity.sealed_refresh_token, identity.checked_at = "", timezone.now()
                identity.save(update_fields=["sealed_refresh_token", "checked_at"])
                log.warning(
                    "the identity provider refused %s's sign-in (signed out or disabled there): %d API token(s) ended",
                    identity.user_id,
                    count,
                )
                ended += 1
                continue
            except (requests.RequestException, ValueError, sealing.Unreadable) as exc:
                log.warning("the sign-in of identity %s could not be confirmed: %s", identity.pk, type(exc).__name__)
                continue
            identity.sealed_refresh_token, identity.checked_at = sealing.seal(rotated), timezone.now()
            identity.save(update_fields=["sealed_refresh_token", "checked_at"])
            checked += 1
    return {"checked": checked, "ended": ended}


def token_term_limit(user):
    """The latest expiry an API token of ``user`` may have: None (the usual terms) unless the user
    signs in with the provider and no refresh token of theirs is held to confirm, later, that the
    provider still knows them; then the renewal period, as their browser session has."""
    if not enabled():
        return None
    identities = Identity.objects.filter(user=user, issuer=settings.GRIDGATE_OIDC_ISSUER)
    if not identities.exists() or identities.exclude(sealed_refresh_token="").exists():
        return None
    return timezone.now() + timedelta(seconds=settings.OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS)


# -- RP-initiated logout ---------------------------------------------------------------------------
@require_POST
def logout_view(request):
    """``/logout/``: signs out here and, for a session signed in with the provider, at the provider
    too (OpenID Connect RP-Initiated Logout: its end-session endpoint with the ID token as a hint),
    so "Sign in" right after on a shared terminal asks for the password again."""
    hint = request.session.get("oidc_id_token") if signed_in_with_provider(request) else None
    django_logout(request)
    login = request.build_absolute_uri(reverse(settings.LOGOUT_REDIRECT_URL))
    endpoint = settings.GRIDGATE_OIDC_END_SESSION_ENDPOINT
    if not (enabled() and endpoint and hint):
        return HttpResponseRedirect(reverse(settings.LOGOUT_REDIRECT_URL))
    query = urlencode(
        {"id_token_hint": hint, "post_logout_redirect_uri": login, "client_id": settings.OIDC_RP_CLIENT_ID}
    )
    return HttpResponseRedirect(f"{endpoint}?{query}")
