"""Login throttling with django-axes: the web login, the admin login and the token endpoint all go
through ``authenticate()``, where axes' backend refuses a locked-out client.

Attempts are counted per **username and client address together** (``AXES_LOCKOUT_PARAMETERS``
in config/settings.py): by username alone, anyone could lock a user out from everywhere by
mistyping their password ten times; by address alone, one person's typos would lock out everybody
behind the same NAT, proxy or cluster login node, which at a research site is often a whole
group. The combination stops one client guessing one account's password; a distributed guess at
one account is left to the password validators.

A lockout per username and address never stops a client that tries a new username each time, and
each attempt costs a password hash (Django hashes even for unknown users, so that timing tells
nothing): a handful of such clients took the web processes' CPU. :class:`LoginRateBackend`, first
of the authentication backends, therefore counts every login attempt per client address, whatever
the username and whether it succeeds, and refuses past ``GRIDGATE_LOGIN_RATE`` a minute before any
password is hashed (429 with Retry-After, as a lockout). The reverse proxy's ``limit_req``
(docs/deployment.md) does the same in front, cheaper still.
"""

import ipaddress
from datetime import timedelta

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.db.models import F
from django.http import HttpResponse, JsonResponse
from django.http.response import HttpResponseBase
from django.utils import timezone


def cool_off_seconds() -> int:
    return int(settings.AXES_COOLOFF_TIME.total_seconds())


#: the window GRIDGATE_LOGIN_RATE counts attempts in
RATE_WINDOW = timedelta(minutes=1)


def lockout_message(request=None) -> str:
    if rate_limited(request):
        return (
            f"Too many logins from your address (more than {settings.GRIDGATE_LOGIN_RATE} a minute, "
            "whatever the account): try again in a minute."
        )
    minutes = max(1, cool_off_seconds() // 60)
    return (
        f"Too many failed logins for this account from your address: try again in {minutes} minutes, "
        "or ask an administrator to unlock it."
    )


def retry_after(request=None) -> int:
    return int(RATE_WINDOW.total_seconds()) if rate_limited(request) else cool_off_seconds()


def is_locked_out(request) -> bool:
    """Whether axes (or the rate per address) refused or locked out this request's login attempt
    (set on the request object ``authenticate`` was given: the DRF request on the token endpoint)."""
    return bool(getattr(request, "axes_locked_out", False))


def rate_limited(request) -> bool:
    return bool(getattr(request, "login_rate_limited", False))


def count_attempt(address: str) -> int:
    """Count one login attempt from ``address`` and return the attempts of its current window.
    An UPDATE when the address has a row in this window (the common case under attack: one
    statement), else the row (re)started at 1."""
    from apps.accounts.models import LoginRate

    now = timezone.now()
    since = now - RATE_WINDOW
    if LoginRate.objects.filter(address=address, window_start__gt=since).update(attempts=F("attempts") + 1):
        return LoginRate.objects.filter(address=address).values_list("attempts", flat=True).first() or 1
    try:
        with transaction.atomic():
            restarted = LoginRate.objects.filter(address=address).update(window_start=now, attempts=1)
            if not restarted:
                LoginRate.objects.create(address=address, window_start=now, attempts=1)
    except IntegrityError:  # another request from the address created it first: count on it
        LoginRate.objects.filter(address=address).update(attempts=F("attempts") + 1)
    return 1


class LoginRateBackend:
    """First of AUTHENTICATION_BACKENDS: every login path (the user pages', the admin's, the token
    endpoint, a provider's callback) authenticates with a request, and each attempt from one
    client address counts here, whatever the username. Past the rate, PermissionDenied stops
    ``authenticate`` before any other backend (and before any password is hashed); the request is
    flagged as axes flags a lockout, so every path answers 429 the way it answers a lockout. No
    ``get_user``: it signs nobody in, so no session names it as its backend."""

    def authenticate(self, request, **credentials):
        if request is None or not settings.AXES_ENABLED:
            return None
        address = client_ip(request)
        if address is None:
            return None
        if count_attempt(address) > settings.GRIDGATE_LOGIN_RATE:
            request.axes_locked_out = True
            request.login_rate_limited = True
            raise PermissionDenied("too many logins from this address")
        return None


def forget_failures(request, username: str) -> None:
    """After a successful token login, what axes does after a session login (``AXES_RESET_ON_SUCCESS``):
    this username's failures from this address are forgotten. The token endpoint does not send
    ``user_logged_in`` (that would also create a session row per token)."""
    address = getattr(request, "axes_ip_address", None)
    if settings.AXES_ENABLED and settings.AXES_RESET_ON_SUCCESS and address:
        from axes.utils import reset

        reset(ip=address, username=username)


def _trusted(address, networks) -> bool:
    return any(address.version == network.version and address in network for network in networks)


def client_ip(request) -> str | None:
    """The client's address (``AXES_CLIENT_IP_CALLABLE``, and the login rate's).

    ``X-Forwarded-For`` is believed only from a peer in ``GRIDGATE_TRUSTED_PROXIES`` (the reverse
    proxies' networks): anyone else who reaches the web process directly wrote it themselves.
    From such a peer, the header is read from the right, where each proxy appended the address it
    received from (nginx's ``$proxy_add_x_forwarded_for``), past every entry that is a trusted
    proxy itself: the first that is not is the client; anything further left was written by the
    client and proves nothing. A malformed entry on the way ends the walk at the proxy that
    wrote the last good one (never a 500: axes stores the address in an inet column)."""
    remote = request.META.get("REMOTE_ADDR")
    networks = settings.GRIDGATE_TRUSTED_PROXIES
    try:
        peer = ipaddress.ip_address(remote)
    except ValueError:
        return remote
    if not networks or not _trusted(peer, networks):
        return str(peer)
    forwarded = [part.strip() for part in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if part.strip()]
    client = peer
    for entry in reversed(forwarded):
        try:
            address = ipaddress.ip_address(entry)
        except ValueError:
            break
        client = address
        if not _trusted(address, networks):
            break
    return str(client)


def lockout_response(request, original_response=None, credentials=None) -> HttpResponseBase:
    """What axes' middleware answers once it flagged a request as locked out
    (``AXES_LOCKOUT_CALLABLE``): 429 everywhere. A login page keeps the page its form rendered,
    which says why (``forms.LockoutMessageMixin``); an API path gets the API's JSON error."""
    from apps.core.middleware import is_api  # here: the services import this module, and nothing of DRF

    headers = {"Retry-After": str(retry_after(request))}
    if is_api(request):
        return JsonResponse({"detail": lockout_message(request)}, status=429, headers=headers)
    if isinstance(original_response, HttpResponseBase):
        original_response.status_code = 429
        original_response.reason_phrase = None  # recomputed from the new status
        original_response["Retry-After"] = headers["Retry-After"]
        return original_response
    return HttpResponse(lockout_message(request), status=429, headers=headers, content_type="text/plain; charset=utf-8")
