"""``Idempotency-Key`` for POST endpoints (SPEC §7).

A repeat by the same user with the same key and the same request returns the first response
(with ``Idempotent-Replayed: true``); the same key with a different request gets 409. Keys are
kept at least 24 h (``IDEMPOTENCY_RETENTION``; pruned by ``manage.py cleanup``).

A killed request never leaves a key stuck, in one of two ways:

- **One transaction** (the default): the key row, the work and the stored response commit
  together. A request killed mid-way rolls all of it back (PostgreSQL ends the transaction with the
  connection), so the retry runs afresh; a response lost after the commit is replayed from the row.
  A concurrent repeat waits on the key's unique index until the first ends, then replays it.
- **Under a lease** (``atomic=False``, for work that commits its own claim before a slow call, like a
  case launch): the key row is committed first with ``locked_until``; a repeat within the lease gets
  409 "still being processed", a repeat after it takes the key over (the work itself must be
  idempotent, as ``launch_case`` is).

Only 2xx responses are stored: a refused request (4xx, or an exception) leaves no key behind.
"""

import hashlib
import json
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from rest_framework.response import Response

from apps.core.exceptions import Conflict, Invalid
from apps.core.models import IdempotencyKey

HEADER = "Idempotency-Key"
IDEMPOTENCY_RETENTION = timedelta(hours=24)


def lease() -> timedelta:
    return timedelta(seconds=settings.GRIDGATE_IDEMPOTENCY_LEASE_SECONDS)


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


def _replay(existing: IdempotencyKey, fingerprint: str) -> Response:
    if existing.fingerprint != fingerprint:
        raise Conflict("This Idempotency-Key was already used with a different request.")
    if existing.response_status is None:
        raise Conflict("A request with this Idempotency-Key is still being processed; retry shortly.")
    response = Response(existing.response_body, status=existing.response_status)
    response["Idempotent-Replayed"] = "true"
    return response


def _store(record: IdempotencyKey, response: Response) -> None:
    record.response_status = response.status_code
    record.response_body = response.data
    record.locked_until = None
    record.save(update_fields=["response_status", "response_body", "locked_until"])


def idempotent(request, handler: Callable[[], Response], *, atomic: bool = True) -> Response:
    """Run ``handler`` at most once per (user, Idempotency-Key); without the header, just run it."""
    key = request.headers.get(HEADER)
    if key is None or not request.user.is_authenticated:
        return handler()
    key = key.strip()
    if not key or len(key) > 255:
        raise Invalid(f"The {HEADER} header must be 1 to 255 characters.", header=HEADER)
    fingerprint = _fingerprint(request)
    if atomic:
        return _in_one_transaction(request.user, key, fingerprint, handler)
    return _under_lease(request.user, key, fingerprint, handler)


def _in_one_transaction(user, key, fingerprint, handler) -> Response:
    with transaction.atomic():
        try:
            with transaction.atomic():
                # On PostgreSQL this INSERT waits while another transaction holds the same key:
                # a concurrent repeat is serialized behind the first attempt, then replays it.
                record = IdempotencyKey.objects.create(user=user, key=key, fingerprint=fingerprint)
        except IntegrityError:
            existing = IdempotencyKey.objects.filter(user=user, key=key).first()
            if existing is None:  # the holder rolled back between our INSERT and SELECT
                raise Conflict("A request with this Idempotency-Key was just retried; retry shortly.") from None
            return _replay(existing, fingerprint)
        response = handler()  # an exception rolls back the work and the key alike
        if 200 <= response.status_code < 300:
            _store(record, response)
        else:
            transaction.set_rollback(True)  # a refusal leaves no key behind: the client may retry
    return response


def _under_lease(user, key, fingerprint, handler) -> Response:
    now = timezone.now()
    try:
        with transaction.atomic():
            record = IdempotencyKey.objects.create(
                user=user, key=key, fingerprint=fingerprint, locked_until=now + lease()
            )
    except IntegrityError:
        existing = IdempotencyKey.objects.filter(user=user, key=key).first()
        if existing is None:
            raise Conflict("A request with this Idempotency-Key was just retried; retry shortly.") from None
        stale = existing.response_status is None and (existing.locked_until is None or existing.locked_until <= now)
        if existing.fingerprint != fingerprint or not stale:
            return _replay(existing, fingerprint)
        # The first attempt died mid-way (its lease ran out): take the key over. Compare-and-set on
        # the old lease: of several retries racing here, the one whose UPDATE matched wins.
        taken = IdempotencyKey.objects.filter(
            pk=existing.pk, response_status__isnull=True, locked_until=existing.locked_until
        ).update(locked_until=now + lease())
        if not taken:
            raise Conflict("A request with this Idempotency-Key is still being processed; retry shortly.") from None
        record = existing
    try:
        response = handler()
    except BaseException:
        record.delete()
        raise
    if 200 <= response.status_code < 300:
        _store(record, response)
    else:
        record.delete()
    return response
