"""The project's own service exceptions (STYLE.md, examples 1-2).

Services raise these and import nothing from DRF; they are mapped once for the API
(``apps.core.api.exceptions.exception_handler``) and once for the web pages. Each carries a
human ``detail`` and optional extra fields that reach the JSON body (e.g. ``slots_available``).
"""

from django.core.exceptions import NON_FIELD_ERRORS

# The key of errors that belong to no one field (DRF's default NON_FIELD_ERRORS_KEY).
NON_FIELD_KEY = "non_field_errors"


def field_errors(exc) -> dict:
    """A Django ``ValidationError`` keyed by field, the way the API reports serializer errors."""
    if hasattr(exc, "error_dict"):
        out = {}
        for field, errors in exc.message_dict.items():
            out.setdefault(NON_FIELD_KEY if field == NON_FIELD_ERRORS else field, []).extend(errors)
        return out
    return {NON_FIELD_KEY: list(exc.messages)}


class ServiceError(Exception):
    """Base class: ``status`` is the HTTP status the API answers with."""

    status = 400
    default_detail = "The request is not valid."

    def __init__(self, detail: str | None = None, **extra):
        self.detail = detail or self.default_detail
        self.extra = extra
        super().__init__(self.detail)


class Invalid(ServiceError):
    """400: the request carried a value the rule refuses."""

    status = 400
    default_detail = "The request is not valid."


class Forbidden(ServiceError):
    """403: the caller may see the object but not do this to it."""

    status = 403
    default_detail = "You do not have permission to perform this action."


class NotFound(ServiceError):
    """404: the object does not exist or is not the caller's to see."""

    status = 404
    default_detail = "Not found."


class Conflict(ServiceError):
    """409: the request conflicts with the current state (extra fields say which)."""

    status = 409
    default_detail = "The request conflicts with the current state."


class InvalidFields(Invalid):
    """400 with messages keyed by field (``{"field": ["…"]}``, nested for inline lists), the shape
    of a validation error, for rules a service checks across several objects."""

    def __init__(self, errors: dict):
        self.errors = errors
        super().__init__("; ".join(f"{key}: {value}" for key, value in errors.items()))


class PayloadTooLarge(ServiceError):
    """413: the body or upload is larger than the configured limit (the message names it)."""

    status = 413
    default_detail = "The upload is too large."


class InsufficientStorage(ServiceError):
    """507: the disk the request must write to (the cases root) has no room; ``free_bytes`` says
    how much is left. Retrying once an operator has made room works."""

    status = 507
    default_detail = "There is not enough free disk space to store this request."

    def __init__(self, detail: str | None = None, *, free_bytes: int, **extra):
        super().__init__(detail, free_bytes=free_bytes, **extra)


class TooManyRequests(ServiceError):
    """429: asked again too soon; ``retry_after`` seconds until it may be asked again."""

    status = 429
    default_detail = "Too many requests; retry later."

    def __init__(self, detail: str | None = None, *, retry_after: int, **extra):
        self.retry_after = retry_after
        super().__init__(detail or f"Asked too soon: retry in {retry_after} s.", **extra)


class Unavailable(ServiceError):
    """503: a transient condition (a provider, a lock, the database); retrying later may work."""

    status = 503
    default_detail = "The service is temporarily unavailable; try again shortly."
