"""The connections page: a user's own credentials for pools that run cases under them
(docs/backends.md, "Per-user credentials"); the services of ``apps.credentials.services`` do the
work. The OAuth flow in progress (its state and PKCE verifier) is kept in the user's server-side
session between the redirect and the callback, never in a URL or a cookie. No credential is ever
rendered: not in the page, a message or a redirect.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.text import capfirst
from django.views.decorators.cache import never_cache
from django.views.decorators.debug import sensitive_post_parameters
from django.views.decorators.http import require_GET, require_POST

from apps.backends.remote import provider
from apps.credentials import sealing
from apps.credentials import services as credential_services
from apps.web.errors import REFUSALS, refuse

#: the session key of the connect flows in progress (state → flow); a few at most
FLOWS = "gridgate_connect_flows"
MAX_FLOWS = 5


def _callback_uri(request) -> str:
    return request.build_absolute_uri(reverse("web:connection-callback"))


def _refused(request, exc: Exception, what: str):
    """Back to the connections page, saying why ``what`` was refused."""
    if isinstance(exc, sealing.SealingUnavailable):
        messages.error(request, exc.detail)  # the whole reason, in words: nothing to retry
    else:
        refuse(request, exc, what)
    return redirect("web:connection-list")


@login_required
@require_GET
@never_cache
def connection_list(request):
    context = {"rows": credential_services.connection_rows(request.user), "can_seal": sealing.available()}
    return render(request, "web/connection_list.html", context)


@login_required
@require_POST
def connection_connect(request, pool):
    """FirecREST: start the provider's authorization code flow (PKCE) and send the browser there."""
    try:
        url, flow = credential_services.start_connect(
            user=request.user, pool_id=pool, redirect_uri=_callback_uri(request)
        )
    except REFUSALS as exc:
        return _refused(request, exc, "Connecting")
    flows = dict(request.session.get(FLOWS) or {})
    flows[flow["state"]] = flow
    # A user who starts several connects keeps the newest few (an abandoned one expires anyway).
    request.session[FLOWS] = dict(sorted(flows.items(), key=lambda item: item[1]["started"])[-MAX_FLOWS:])
    return redirect(url)


@login_required
@require_GET
@never_cache
def connection_callback(request):
    """The provider sends the browser back here with ``code`` and ``state`` (or ``error``)."""
    state = request.GET.get("state", "")
    flows = dict(request.session.get(FLOWS) or {})
    flow = flows.pop(state, None) if state else None
    request.session[FLOWS] = flows  # a state is used once, whatever happens next
    error, code = request.GET.get("error"), request.GET.get("code", "")
    if flow is None:
        messages.error(
            request,
            "This connection attempt is unknown here or was already used (the page may have been reloaded): "
            "connect again.",
        )
    elif error:
        reason = request.GET.get("error_description") or error
        messages.error(request, f"The identity provider did not connect you ({reason[:200]}). Connect again.")
    elif not code:
        messages.error(request, "The identity provider sent no authorization code back: connect again.")
    else:
        try:
            connection = credential_services.finish_connect(
                user=request.user,
                flow=flow,
                code=code,
                redirect_uri=_callback_uri(request),
                max_age=settings.GRIDGATE_CONNECT_FLOW_SECONDS,
            )
        except REFUSALS as exc:
            return _refused(request, exc, "Connecting")
        who = connection.provider_username or connection.subject or "your account"
        messages.success(request, f"Connected to {connection.pool.name} as {who}: your cases there run under it.")
    return redirect("web:connection-list")


@sensitive_post_parameters()
@login_required
@require_POST
def connection_paste(request, pool):
    """Qarnot, Run:AI: keep what the user pasted (the fields the pool's provider names), checked
    at the provider first."""
    try:
        connection = credential_services.store_pasted(user=request.user, pool_id=pool, values=request.POST)
    except REFUSALS as exc:
        return _refused(request, exc, "Saving the credential")
    session = provider(connection.pool.kind)
    who = connection.provider_username or connection.subject or "unknown"
    saved = f"{capfirst(session.paste.words)} saved for {connection.pool.name}"
    messages.success(request, f"{saved} ({session.label} account {who}).")
    return redirect("web:connection-list")


@login_required
@require_POST
def connection_disconnect(request, pool):
    try:
        forgotten = credential_services.disconnect(user=request.user, pool_id=pool)
    except REFUSALS as exc:
        return _refused(request, exc, "Disconnecting")
    tell = messages.warning if forgotten.revoked is False else messages.success
    tell(request, f"Disconnected: {forgotten.detail}")
    return redirect("web:connection-list")
