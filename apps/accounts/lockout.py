"""Login throttling with django-axes: the web login, the admin login and the token endpoint all go
through ``authenticate()``, where axes' backend refuses a locked-out client.

Attempts are counted per **username and client address together** (``AXES_LOCKOUT_PARAMETERS``
in config/settings.py): by username alone, anyone could lock a user out from everywhere by
mistyping their password ten times; by address alone, one person's typos would lock out everybody
behind the same NAT, proxy or cluster login node, which at a research site is often a whole
group. The combination stops one client guessing one account's password; a distributed guess at
one account is left to the password validators.
"""

import ipaddress

from django.conf import settings
from django.http import HttpResponse, JsonResponse
from django.http.response import HttpResponseBase


def cool_off_seconds() -> int:
    return int(settings.AXES_COOLOFF_TIME.total_seconds())


def lockout_message() -> str:
    minutes = max(1, cool_off_seconds() // 60)
    return (
        f"Too many failed logins for this account from your address: try again in {minutes} minutes, "
        "or ask an administrator to unlock it."
    )


def is_locked_out(request) -> bool:
    """Whether axes refused or locked out this request's login attempt (it sets the flag on the
    request object ``authenticate`` was given: the DRF request on the token endpoint)."""
    return bool(getattr(request, "axes_locked_out", False))


def forget_failures(request, username: str) -> None:
    """After a successful token login, what axes does after a session login (``AXES_RESET_ON_SUCCESS``):
    this username's failures from this address are forgotten. The token endpoint does not send
    ``user_logged_in`` (that would also create a session row per token)."""
    address = getattr(request, "axes_ip_address", None)
    if settings.AXES_ENABLED and settings.AXES_RESET_ON_SUCCESS and address:
        from axes.utils import reset

        reset(ip=address, username=username)


def client_ip(request) -> str | None:
    """The client's address (``AXES_CLIENT_IP_CALLABLE``). Behind GRIDGATE_TRUSTED_PROXIES reverse
    proxies, each of which appends the address it received from to ``X-Forwarded-For`` (nginx's
    ``$proxy_add_x_forwarded_for``), the client is that many entries from the right; anything
    further left was written by the client and proves nothing. Without proxies, or when the header
    does not have that many entries (a request that did not come through them), ``REMOTE_ADDR``:
    behind a proxy that would be the proxy's address for everyone, and the lockout per username
    and address would become a lockout per username."""
    remote = request.META.get("REMOTE_ADDR")
    proxies = settings.GRIDGATE_TRUSTED_PROXIES
    if not proxies:
        return remote
    forwarded = [part.strip() for part in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if part.strip()]
    if len(forwarded) < proxies:
        return remote
    candidate = forwarded[-proxies]
    try:
        return str(ipaddress.ip_address(candidate))
    except ValueError:  # axes stores it in an inet column on PostgreSQL: never a 500 for a bad header
        return remote


def lockout_response(request, original_response=None, credentials=None) -> HttpResponseBase:
    """What axes' middleware answers once it flagged a request as locked out
    (``AXES_LOCKOUT_CALLABLE``): 429 everywhere. A login page keeps the page its form rendered,
    which says why (``forms.LockoutMessageMixin``); an API path gets the API's JSON error."""
    from apps.core.middleware import is_api  # here: the services import this module, and nothing of DRF

    headers = {"Retry-After": str(cool_off_seconds())}
    if is_api(request):
        return JsonResponse({"detail": lockout_message()}, status=429, headers=headers)
    if isinstance(original_response, HttpResponseBase):
        original_response.status_code = 429
        original_response.reason_phrase = None  # recomputed from the new status
        original_response["Retry-After"] = headers["Retry-After"]
        return original_response
    return HttpResponse(lockout_message(), status=429, headers=headers, content_type="text/plain; charset=utf-8")
