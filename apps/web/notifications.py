"""The notifications page (R-NOTE-1): your subscriptions, a form to add one, your delivery log.

The same services as ``/api/v1/notifications/`` (``apps.notifications.services``). A new webhook's
secret is in the answer to its creation only, rendered once and kept nowhere (not in the session,
not in a message): reloading the page does not show it again.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpResponseNotAllowed
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from apps.core.exceptions import NotFound, ServiceError
from apps.notifications import services
from apps.notifications.models import Delivery, Subscription
from apps.web.forms import SubscriptionForm

DELIVERIES_SHOWN = 50


@login_required
@never_cache  # the answer to a creation holds the secret: no browser or proxy may keep a copy
def notification_list(request):
    created, status = None, 200
    if request.method == "POST":
        form = SubscriptionForm(request.POST)
        if form.is_valid():
            data = form.cleaned_data
            try:
                subscription, secret = services.create_subscription(
                    user=request.user, event=data["event"], channel=data["channel"], url=data["url"]
                )
            except ValidationError as exc:
                for field, errors in exc.message_dict.items():
                    form.add_error(field if field in form.fields else None, errors)
            except ServiceError as exc:  # already subscribed (409), no sealing key (503)
                form.add_error(None, exc.detail)
            else:
                created, status, form = {"subscription": subscription, "secret": secret}, 201, SubscriptionForm()
        if not created:
            status = 400
    elif request.method == "GET":
        form = SubscriptionForm()
    else:
        return HttpResponseNotAllowed(["GET", "POST"])
    subscriptions = list(Subscription.objects.filter(user=request.user).order_by("event", "channel", "id"))
    deliveries = list(
        Delivery.objects.filter(user=request.user)
        .select_related("subscription")
        .order_by("-created_at", "-id")[:DELIVERIES_SHOWN]
    )
    context = {"subscriptions": subscriptions, "deliveries": deliveries, "form": form, "created": created}
    return render(request, "web/notification_list.html", context, status=status)


@login_required
@require_POST
def notification_delete(request, pk):
    try:
        services.delete_subscription(user=request.user, subscription_id=pk)  # the caller's own alone
    except NotFound:
        raise Http404("No such subscription.") from None
    messages.success(request, "Unsubscribed: nothing more is sent there for that event.")
    return redirect("web:notification-list")
