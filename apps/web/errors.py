"""Errors in user language for the user pages.

The API answers with status codes and the services' exact words; a person at the pages needs to
know what went wrong and what to do. ``refusal(exc, what)`` turns any exception a service, a form
or a driver raises into a sentence without Python internals or HTTP codes; the exact detail (the
API's words, a parser's message) is kept for experts behind a "Details" disclosure.

A Django message holds one string, so the detail travels in it after ``DETAIL_MARK`` and the
``message_parts`` template filter splits it again.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib import messages
from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework.exceptions import APIException

from apps.core.exceptions import InvalidFields, ServiceError
from apps.scheduling.drivers import DriverError

#: what a page catches around a service call (services raise apps.core.exceptions, field rules
#: Django's ValidationError, drivers DriverError): a refusal the user can read, never a 500
REFUSALS = (ServiceError, DjangoValidationError, DriverError, APIException)

DETAIL_MARK = "\n\u2063details\u2063\n"  # invisible separators: never typed by a user


@dataclass(frozen=True)
class Refusal:
    text: str
    detail: str = ""

    def as_message(self) -> str:
        return f"{self.text}{DETAIL_MARK}{self.detail}" if self.detail and self.detail != self.text else self.text


def split_message(message: str) -> tuple[str, str]:
    text, _, detail = str(message).partition(DETAIL_MARK)
    return text, detail


def flatten(detail) -> str:
    """A DRF/Django error structure as plain words (field names kept, no brackets or quotes)."""
    if isinstance(detail, InvalidFields):
        return flatten(detail.errors)
    if isinstance(detail, DjangoValidationError):
        return flatten(detail.message_dict if hasattr(detail, "error_dict") else detail.messages)
    if isinstance(detail, dict):
        return " ".join(
            flatten(value) if key in ("non_field_errors", "__all__", "detail") else f"{key}: {flatten(value)}"
            for key, value in detail.items()
        )
    if isinstance(detail, (list, tuple)):
        return " ".join(flatten(item) for item in detail)
    return str(detail)


def _status(exc) -> int:
    return int(getattr(exc, "status_code", None) or getattr(exc, "status", None) or 400)


def _extra(exc) -> dict:
    extra = dict(getattr(exc, "extra", None) or {})
    wait = getattr(exc, "wait", None) or getattr(exc, "retry_after", None) or extra.get("retry_after")
    if wait is not None:
        extra.setdefault("wait", wait)
    return extra


def refusal(exc: Exception, what: str) -> Refusal:
    """What to tell a person whose ``what`` ("The session", "The job", …) was refused by ``exc``."""
    if isinstance(exc, DriverError):
        return Refusal(
            f"{what} was refused: the sequence cannot run on this pool's device. "
            "Check that it was built for this device, is measured, and stays within the device's limits.",
            str(exc),
        )
    detail = error_text(exc)
    status = _status(exc)
    extra = _extra(exc)
    if status == 429:
        wait = extra.get("wait")
        when = f"in {int(wait)} second{'s' if int(wait) != 1 else ''}" if wait else "in a moment"
        return Refusal(f"You asked for this a moment ago. Try again {when}.", detail)
    if status == 409 and "slots_available" in extra:
        free = extra["slots_available"]
        return Refusal(
            f"{what} was not opened: the pool has no room for that many slots right now "
            f"({free} free). Ask for fewer slots, or try again when others release theirs.",
            detail,
        )
    if status == 409:
        return Refusal(f"{what} is not possible in its current state: {detail}", detail)
    if status == 403:
        return Refusal(f"{what} is not allowed: {detail}", detail)
    if status == 404:
        return Refusal(f"{what} failed: it no longer exists or is not yours.", detail)
    if status == 413:
        return Refusal(f"{what} was refused: the upload is too large. {detail}", detail)
    if status >= 500:
        return Refusal(f"{what} could not be done right now; please try again in a minute.", detail)
    return Refusal(f"{what} was refused: {detail}", detail)


def error_text(exc: Exception) -> str:
    """A refusal in the API's own words (for the experts' details)."""
    if isinstance(exc, InvalidFields):
        return flatten(exc.errors)
    return flatten(getattr(exc, "detail", None) or exc)


def refuse(request, exc: Exception, what: str) -> None:
    """The one mapping of a refusal to a flash message of the pages."""
    messages.error(request, refusal(exc, what).as_message())
