"""The web pages' one mapping of service refusals (STYLE.md, examples 1-2).

Services raise ``apps.core.exceptions`` (and Django ``ValidationError`` for field rules); the API
maps them in ``apps.core.api.exceptions``, the pages here: a flash message in the API's words,
with the status the API would have answered.
"""

from django.contrib import messages
from django.core.exceptions import ValidationError as DjangoValidationError

from apps.core.exceptions import InvalidFields, ServiceError

# What a page catches around a service call: a refusal the user can read, never a 500.
REFUSALS = (ServiceError, DjangoValidationError)


def status_of(exc: Exception) -> int:
    return getattr(exc, "status", 400)


def error_text(exc: Exception) -> str:
    """A refusal in words, as the API would have said it."""
    if isinstance(exc, DjangoValidationError):
        return " ".join(exc.messages)
    if isinstance(exc, InvalidFields):
        return _flatten(exc.errors)
    return str(getattr(exc, "detail", exc))


def _flatten(detail) -> str:
    if isinstance(detail, dict):
        return " ".join(
            f"{key}: {_flatten(value)}" if key != "non_field_errors" else _flatten(value)
            for key, value in detail.items()
        )
    if isinstance(detail, (list, tuple)):
        return " ".join(_flatten(item) for item in detail)
    return str(detail)


def refuse(request, exc: Exception, what: str) -> None:
    messages.error(request, f"{what} refused ({status_of(exc)}): {error_text(exc)}")
