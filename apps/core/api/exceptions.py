"""One error shape for the whole API: bad input is a 4xx with a JSON body, never a 500."""

from django.core.exceptions import NON_FIELD_ERRORS
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import DataError, IntegrityError
from django.db.models import ProtectedError, RestrictedError
from rest_framework import status
from rest_framework.exceptions import APIException
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import exception_handler as drf_exception_handler

from apps.core.exceptions import ServiceError


class Conflict(APIException):
    """409 with a ``detail`` and optional extra fields (e.g. ``slots_available``)."""

    status_code = status.HTTP_409_CONFLICT
    default_detail = "The request conflicts with the current state."
    default_code = "conflict"

    def __init__(self, detail=None, **extra):
        super().__init__(detail)
        self.extra = extra


def validation_error_dict(exc: DjangoValidationError) -> dict:
    """Key a Django ValidationError by field, the way DRF reports serializer errors."""
    if hasattr(exc, "error_dict"):
        out = {}
        for field, errors in exc.message_dict.items():
            key = api_settings.NON_FIELD_ERRORS_KEY if field == NON_FIELD_ERRORS else field
            out.setdefault(key, []).extend(errors)
        return out
    return {api_settings.NON_FIELD_ERRORS_KEY: list(exc.messages)}


def exception_handler(exc, context):
    if isinstance(exc, ServiceError):
        return Response({"detail": exc.detail, **exc.extra}, status=exc.status)
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
    response = drf_exception_handler(exc, context)
    if response is not None and isinstance(exc, Conflict):
        response.data.update(exc.extra)
    return response
