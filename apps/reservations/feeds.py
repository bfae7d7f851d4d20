"""The iCalendar feed of a pool's schedule (R-RES-4) and the personal token that reads it.

Calendar applications fetch a URL and send no header, so the feed is also readable with a token
in its query string: a *feed token*, signed by the server for one user, that reads schedules and
nothing else (an API token in a URL that a calendar keeps would open the whole API). It is
derived, never stored: ``SECRET_KEY`` signs the user's id with a digest of the user's password
hash, so a password change (which also ends the user's API tokens) revokes every feed URL.
"""

import re
from datetime import datetime

from django.contrib.auth import get_user_model
from django.core import signing
from django.utils.crypto import salted_hmac
from icalendar import Calendar, Event, vText

from apps.core.text import HIDDEN_IN_NAMES
from apps.reservations.selectors import Slot

SALT = "gridgate.calendar-feed"

#: what RFC 5545 TEXT may not carry (CONTROL but tab; line breaks are escaped as ``\n``): a strict
#: reader refuses the whole feed for one such character in a name
_NOT_TEXT = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _secret_of(user) -> str:
    return salted_hmac(SALT, f"{user.pk}:{user.password}").hexdigest()[:16]


def feed_token(user) -> str:
    return signing.dumps([user.pk, _secret_of(user)], salt=SALT, compress=True)


def user_for_feed_token(token: str):
    """The active user the token was made for, or None (forged, or revoked by a password change)."""
    try:
        pk, secret = signing.loads(token, salt=SALT)
    except (signing.BadSignature, ValueError, TypeError):
        return None
    user = get_user_model().objects.filter(pk=pk, is_active=True).first() if isinstance(pk, int) else None
    if user is None or secret != _secret_of(user):
        return None
    return user


def filename(pool) -> str:
    """The feed's file name (``Content-Disposition``): the pool's name, its control characters
    (a line break would be refused as a header) made ``_``."""
    return HIDDEN_IN_NAMES.sub("_", pool.name) + ".ics"


def _text(value: str) -> vText:
    """A name as iCalendar TEXT: escaped by icalendar, each character TEXT may not carry shown as
    U+FFFD."""
    return vText(_NOT_TEXT.sub("\ufffd", str(value)))


def ics(pool, slots: list[Slot], *, host: str, generated: datetime) -> bytes:
    """The schedule as an iCalendar (RFC 5545) calendar: one VEVENT per slot, its kind as its
    CATEGORIES; open slots are transparent (they block nothing in the reader's calendar)."""
    calendar = Calendar()
    calendar.add("prodid", "-//Gridgate//QPU calendar//EN")
    calendar.add("version", "2.0")
    # Typed as TEXT so that it is escaped like SUMMARY: icalendar writes an X- property's plain str
    # as it is, and a line break in the pool's name would end the line (a new property, or an
    # AssertionError: a 500 for every reader of the feed).
    calendar.add("x-wr-calname", _text(f"{pool.name} (Gridgate)"))
    for index, slot in enumerate(slots):
        event = Event()
        if slot.reservation is not None:
            event.add("uid", f"reservation-{slot.reservation}@{host}")
        else:
            # An open slot is named after the window edge that bounds it, which stays from one
            # fetch to the next: the first one begins when the feed is read (a new UID at each
            # fetch made calendars replace it every time), so it is named after its end.
            edge = slot.start if index else slot.end
            anchor = "all" if len(slots) == 1 else int(edge.timestamp())
            event.add("uid", f"open-{pool.pk}-{anchor}@{host}")
        event.add("dtstamp", generated)
        event.add("dtstart", slot.start)
        event.add("dtend", slot.end)
        mine = " (yours)" if slot.mine else ""
        if slot.kind == "maintenance":
            summary = f"Maintenance: {slot.title}"
        elif slot.kind == "reservation":
            summary = f"Reserved{mine}: {slot.title} ({slot.slots} slot{'s' if slot.slots != 1 else ''})"
        else:
            summary = f"Open ({slot.slots} slots)" if slot.slots is not None else "Open"
        event.add("summary", _text(f"{pool.name} · {summary}"))
        event.add("categories", [slot.kind.upper()])
        event.add("transp", "TRANSPARENT" if slot.kind == "open" else "OPAQUE")
        if slot.device is not None:
            event.add("location", _text(f"device {slot.device}"))
        calendar.add_component(event)
    return calendar.to_ical()
