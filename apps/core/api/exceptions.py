"""One error shape for the whole API: bad input is a 4xx with a JSON body, never a 500."""

from django.conf import settings
from django.core.exceptions import (
    BadRequest,
    RequestDataTooBig,
    SuspiciousOperation,
    TooManyFieldsSent,
    TooManyFilesSent,
)
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import DataError, IntegrityError, OperationalError
from django.db.models import ProtectedError, RestrictedError
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler
from rest_framework.views import set_rollback

from apps.core import cases_root
from apps.core.exceptions import Conflict, InvalidFields, ServiceError, TooManyRequests, field_errors

# Services raise ``apps.core.exceptions``; this name stays for callers that still import it here.
__all__ = ["Conflict", "exception_handler", "request_error", "validation_error_dict"]


validation_error_dict = field_errors  # the one definition lives with the service exceptions


# A transient database failure is worth one retry a moment later.
RETRY_AFTER_SECONDS = 1


def request_error(exc) -> tuple[dict, int, dict] | None:
    """``(body, status, headers)`` for errors raised below the view (Django's request parsing, the
    database) that must reach an API client as JSON: shared by the DRF handler and
    ``apps.core.middleware.ApiErrorMiddleware`` so both answer alike; None for anything else."""
    if isinstance(exc, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        detail = f"The request body is larger than the {limit}-byte limit (GRIDGATE_MAX_BODY_MB)."
        return {"detail": detail, "limit_bytes": limit}, 413, {}
    if isinstance(exc, TooManyFieldsSent):
        limit = settings.DATA_UPLOAD_MAX_NUMBER_FIELDS
        return {"detail": f"Too many form fields: at most {limit}.", "limit": limit}, 400, {}
    if isinstance(exc, TooManyFilesSent):
        limit = settings.DATA_UPLOAD_MAX_NUMBER_FILES
        return {"detail": f"Too many files: at most {limit} per request.", "limit": limit}, 400, {}
    if isinstance(exc, (SuspiciousOperation, BadRequest)):
        return {"detail": "The request is malformed."}, 400, {}
    if cases_root.is_disk_full(exc):
        # A disk without room where nothing expected it (an upload's temporary file while Django
        # parses the body, a write of the service's): 507, as the workspace's own writes answer.
        detail = "The server's disk is full: the request could not be stored. Try again once an operator has made room."
        return {"detail": detail, "free_bytes": cases_root.free_bytes() or 0}, 507, {}
    if isinstance(exc, OperationalError):
        # Deadlock, serialization failure, a connection lost to a database restart (a reused
        # connection is not pinged first: config/env.py): the request may well succeed when
        # retried, so 503 + Retry-After rather than a 500 (PATTERNS.md §2, lock order).
        detail = "The database is temporarily unavailable or the request lost a lock race; retry shortly."
        return {"detail": detail}, 503, {"Retry-After": str(RETRY_AFTER_SECONDS)}
    return None


def exception_handler(exc, context):
    mapped = request_error(exc)
    if mapped is not None:
        set_rollback()
        body, code, headers = mapped
        return Response(body, status=code, headers=headers)
    if isinstance(exc, InvalidFields):
        return Response(exc.errors, status=exc.status)
    if isinstance(exc, ServiceError):
        headers = {"Retry-After": str(exc.retry_after)} if isinstance(exc, TooManyRequests) else {}
        return Response({"detail": exc.detail, **exc.extra}, status=exc.status, headers=headers)
    if isinstance(exc, DjangoValidationError):
        return Response(validation_error_dict(exc), status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, (ProtectedError, RestrictedError)):
        blockers = exc.protected_objects if isinstance(exc, ProtectedError) else exc.restricted_objects
        names = sorted({str(obj) for obj in list(blockers)[:5]})
        detail = "This object is still in use" + (f" by: {', '.join(names)}." if names else ".")
        return Response({"detail": detail}, status=status.HTTP_409_CONFLICT)
    if isinstance(exc, DataError):
        # The database refused a value the request carried (a NUL byte, an integer out of range):
        # the client's input, not a server fault.
        return Response(
            {"detail": "A value in the request is not valid here (out of range or forbidden characters)."},
            status=status.HTTP_400_BAD_REQUEST,
        )
    if isinstance(exc, IntegrityError):
        # A constraint caught a race that validation could not see: the request conflicts with
        # a concurrent one. The database message is not echoed (it can name internals).
        return Response(
            {"detail": "The request conflicts with existing data (a uniqueness or integrity rule)."},
            status=status.HTTP_409_CONFLICT,
        )
    return drf_exception_handler(exc, context)
