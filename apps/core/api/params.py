"""Query-string values as the API reads them."""

import re
from datetime import UTC

from django.core.exceptions import ValidationError
from django_filters.fields import IsoDateTimeField
from django_filters.filters import IsoDateTimeFilter

#: a date and time followed by a space and an offset: a '+' that the query string made a space
_PLUS_LOST = re.compile(r"(\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d{1,9})?)?) (\d{2}(?::?\d{2})?)")


def moment_text(raw: str) -> str:
    """An ISO 8601 date-time from a query string, its positive UTC offset given back its '+'.

    In a query string '+' means a space, so ``?from=2030-03-04T12:00:00+02:00`` typed as is (curl,
    an address bar) arrives as ``2030-03-04T12:00:00 02:00``: unreadable, while ``-05:00`` and
    ``Z`` came through. A date-time followed by a space and an offset can mean nothing else.
    """
    found = _PLUS_LOST.fullmatch(raw.strip())
    return f"{found[1]}+{found[2]}" if found else raw


class MomentField(IsoDateTimeField):
    """A filter's date-time from a query string: its offset's '+' given back (``moment_text``), a
    naive one read as UTC, and one whose offset takes it out of the range a date-time has in UTC
    refused like an unreadable one (the database would answer 500 on SQLite)."""

    def to_python(self, value):
        found = super().to_python(moment_text(value) if isinstance(value, str) else value)
        try:
            return found.astimezone(UTC) if found is not None else None
        except OverflowError:
            raise ValidationError("Out of range.", code="invalid") from None


class MomentFilter(IsoDateTimeFilter):
    field_class = MomentField
