"""The week view of the calendar (the pool's page and the admin): the schedule of one or more
pools, Monday to Sunday, day by day."""

from datetime import date, datetime, time, timedelta

from django.utils import timezone

from apps.reservations.selectors import schedule


def monday_of(raw: str | None) -> date:
    """The Monday of the week holding ``raw`` (YYYY-MM-DD), or of this week."""
    try:
        day = date.fromisoformat(raw) if raw else timezone.localdate()
    except ValueError:
        day = timezone.localdate()
    if not 1 < day.year < 9999:  # its previous and next weeks must exist
        day = timezone.localdate()
    return day - timedelta(days=day.weekday())


def week(pools, user, monday: date) -> dict:
    """``{"monday", "previous", "next", "start", "end", "zone", "days": [date], "pools": [{"pool",
    "days": [[slot]]}]}``: each pool's windows per day (open slots left out: the empty cells are
    open). The days are the site's time zone's (``zone``, UTC), from ``start`` to ``end``; a
    window that begins or ends outside them is shown with its dates."""
    zone = timezone.get_current_timezone()
    start = datetime.combine(monday, time.min, tzinfo=zone)
    days = [monday + timedelta(days=i) for i in range(7)]
    rows = []
    for pool in pools:
        slots = [slot for slot in schedule(pool, user, start, start + timedelta(days=7)) if slot.kind != "open"]
        per_day = []
        for day in days:
            begin = datetime.combine(day, time.min, tzinfo=zone)
            end = begin + timedelta(days=1)
            per_day.append([slot for slot in slots if slot.start < end and slot.end > begin])
        rows.append({"pool": pool, "days": per_day})
    return {
        "monday": monday,
        "previous": monday - timedelta(days=7),
        "next": monday + timedelta(days=7),
        "start": start,
        "end": start + timedelta(days=7),
        "zone": timezone.get_current_timezone_name(),
        "days": days,
        "pools": rows,
    }
