"""How a delivery leaves (R-NOTE-1): e-mail through Django's mail settings, webhooks through httpx.

Called by the delivery pass with no transaction open. Each returns an :class:`Outcome`; none
raises. Nothing here puts a secret into an outcome or a log line.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
from dataclasses import dataclass

from django.conf import settings
from django.core.mail import EmailMessage

from apps.core import outbound
from apps.core.text import printable
from apps.credentials import sealing
from apps.notifications.models import Channel, Delivery, Event

log = logging.getLogger(__name__)

USER_AGENT = "Gridgate-Webhooks/1"
#: what a receiver's answer may say that we keep (its body is never read)
ERROR_LENGTH = 500
#: a whole call (connect, send, the answer's head) ends after this many timeouts
DEADLINE = 2


@dataclass
class Outcome:
    ok: bool
    status_code: int | None = None
    error: str = ""
    permanent: bool = False  # retrying cannot help (the rules refuse the URL, the receiver said 4xx)


def envelope(delivery: Delivery) -> bytes:
    """The webhook's body (and the e-mail's details): the exact bytes that are signed."""
    body = {
        "id": delivery.pk,
        "event": delivery.event,
        "subject": delivery.subject,
        "created_at": delivery.created_at.isoformat(),
        "data": delivery.payload,
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def signature(secret: str, body: bytes) -> str:
    """``X-Gridgate-Signature``: ``sha256=`` and the hex HMAC-SHA256 of the body under the secret."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


async def _post(url: str, body: bytes, headers: dict, extensions: dict) -> int:
    """The POST, its answer's status code. Async for one reason: a whole-call deadline
    (``asyncio.wait_for``); httpx's timeouts bound each read, and a receiver dripping its answer a
    byte at a time would otherwise hold the pass for as long as it likes."""
    import httpx

    timeout = settings.GRIDGATE_NOTIFY_TIMEOUT_SECONDS
    async with httpx.AsyncClient(timeout=timeout, follow_redirects=False, trust_env=False) as client:
        request = client.build_request("POST", url, content=body, headers=headers)
        request.extensions.update(extensions)
        response = await client.send(request, stream=True)
        await response.aclose()  # the body is never read
        return response.status_code


def send(delivery: Delivery) -> Outcome:
    try:
        if delivery.subscription.channel == Channel.EMAIL:
            return send_email(delivery)
        return send_webhook(delivery)
    except Exception as exc:  # a bug or an SDK surprise: a failed attempt, retried, never a dead pass
        log.exception("delivery %s: sending failed unexpectedly", delivery.pk)
        return Outcome(False, error=f"{type(exc).__name__}"[:ERROR_LENGTH])


def summary(delivery: Delivery) -> str:
    """One line for the e-mail's subject: a name a user chose (a case's) never splits a header."""
    text = delivery.payload.get("summary") if isinstance(delivery.payload, dict) else None
    return printable(str(text or f"{Event(delivery.event).label}: {delivery.subject}"))[:200]


def send_email(delivery: Delivery) -> Outcome:
    """To the address of the delivery's own account, read now (never an address from elsewhere)."""
    address = delivery.user.email
    if not address:
        return Outcome(False, error="your account has no e-mail address", permanent=True)
    details = json.dumps(delivery.payload, sort_keys=True, indent=2, default=str)
    message = EmailMessage(
        subject=f"[Gridgate] {summary(delivery)}",
        body=f"{summary(delivery)}\n\nEvent: {delivery.event}\nDelivery: {delivery.pk}\n\n{details}\n",
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=[address],
        headers={"X-Gridgate-Event": delivery.event, "X-Gridgate-Delivery": str(delivery.pk)},
    )
    try:
        message.send(fail_silently=False)
    except Exception as exc:  # the mail server is away or refused: retried
        return Outcome(False, error=f"mail: {type(exc).__name__}: {exc}"[:ERROR_LENGTH])
    return Outcome(True)


def send_webhook(delivery: Delivery) -> Outcome:
    """POST the signed envelope to the subscription's URL, connecting to an address resolved and
    checked now (R-NOTE-1: the outbound rules at delivery time; a name that moved to a private
    address since the subscription is refused). No redirect is followed; the body of the answer
    is never read."""
    import httpx

    subscription = delivery.subscription
    try:
        target = outbound.resolve(subscription.url)
    except outbound.OutboundRefused as exc:
        return Outcome(False, error=f"refused: {exc}"[:ERROR_LENGTH], permanent=True)
    try:
        secret = sealing.unseal(subscription.secret_sealed)
    except sealing.SealingUnavailable:
        return Outcome(False, error="the signing key is not configured here (GRIDGATE_CREDENTIALS_KEY)")
    except sealing.Unreadable:
        unreadable = "the webhook's secret cannot be opened; create the subscription again"
        return Outcome(False, error=unreadable, permanent=True)
    body = envelope(delivery)
    headers = {
        "Host": target.host_header,
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "X-Gridgate-Event": delivery.event,
        "X-Gridgate-Delivery": str(delivery.pk),
        "X-Gridgate-Signature": signature(secret, body),
    }
    # TLS is verified against the URL's name (SNI), while the connection goes to the checked address.
    extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
    timeout = settings.GRIDGATE_NOTIFY_TIMEOUT_SECONDS
    try:
        code = asyncio.run(asyncio.wait_for(_post(target.connect_url, body, headers, extensions), DEADLINE * timeout))
    except TimeoutError:
        return Outcome(False, error=f"no answer within {DEADLINE * timeout} s")
    except httpx.HTTPError as exc:
        return Outcome(False, error=f"{type(exc).__name__}: {exc}"[:ERROR_LENGTH])
    if 200 <= code < 300:
        return Outcome(True, status_code=code)
    # Retried: the receiver's trouble (5xx), a timeout or a rate limit. A redirect or any other
    # 4xx says the receiver does not take it: retrying would only repeat the answer.
    permanent = 300 <= code < 500 and code not in (408, 429)
    return Outcome(False, status_code=code, error=f"the receiver answered {code}", permanent=permanent)
