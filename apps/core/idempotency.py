"""``Idempotency-Key`` for POST endpoints (SPEC §7).

A repeat by the same user with the same key and the same request returns the first response
(with ``Idempotent-Replayed: true``); the same key with a different request gets 409; a repeat
while the first is still being processed gets 409 too. Keys are kept at least 24 h
(``IDEMPOTENCY_RETENTION``; pruned by ``manage.py cleanup``).
"""

import hashlib
import json
from collections.abc import Callable
from datetime import timedelta

from django.db import IntegrityError, transaction
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from apps.core.api.exceptions import Conflict
from apps.core.models import IdempotencyKey

HEADER = "Idempotency-Key"
IDEMPOTENCY_RETENTION = timedelta(hours=24)


def _fingerprint(request) -> str:
    digest = hashlib.sha256()
    digest.update(request.method.encode())
    digest.update(b"\0" + request.path.encode() + b"\0")
    data = request.data
    files = getattr(request, "FILES", None) or {}
    if hasattr(data, "lists"):  # QueryDict (form or multipart): keep repeated keys, drop files
        plain = {key: values for key, values in data.lists() if key not in files}
    else:
        plain = data
    digest.update(json.dumps(plain, sort_keys=True, default=str).encode())
    for name in sorted(files):
        for upload in files.getlist(name):
            digest.update(f"\0{name}\0{upload.name}\0{upload.size}\0".encode())
            for chunk in upload.chunks():
                digest.update(chunk)
            upload.seek(0)
    return digest.hexdigest()


def idempotent(request, handler: Callable[[], Response]) -> Response:
    """Run ``handler`` at most once per (user, Idempotency-Key); without the header, just run it."""
    key = request.headers.get(HEADER)
    if key is None or not request.user.is_authenticated:
        return handler()
    key = key.strip()
    if not key or len(key) > 255:
        raise ValidationError({HEADER: ["Must be 1 to 255 characters."]})
    fingerprint = _fingerprint(request)
    try:
        with transaction.atomic():
            record = IdempotencyKey.objects.create(user=request.user, key=key, fingerprint=fingerprint)
    except IntegrityError:
        existing = IdempotencyKey.objects.filter(user=request.user, key=key).first()
        if existing is None:  # deleted meanwhile by a failed first attempt: let the client retry
            raise Conflict("A request with this Idempotency-Key was just retried; try again.") from None
        if existing.fingerprint != fingerprint:
            raise Conflict("This Idempotency-Key was already used with a different request.") from None
        if existing.response_status is None:
            raise Conflict("A request with this Idempotency-Key is still being processed.") from None
        response = Response(existing.response_body, status=existing.response_status)
        response["Idempotent-Replayed"] = "true"
        return response
    try:
        response = handler()
    except BaseException:
        record.delete()
        raise
    if 200 <= response.status_code < 300:
        record.response_status = response.status_code
        record.response_body = response.data
        record.save(update_fields=["response_status", "response_body"])
    else:
        record.delete()
    return response
