from django import template
from django.urls import NoReverseMatch, reverse

register = template.Library()


@register.simple_tag
def admin_change_url(obj) -> str:
    """The admin page of ``obj`` ("" when its model is not in the admin)."""
    opts = obj._meta
    try:
        return reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.pk])
    except NoReverseMatch:
        return ""


@register.filter
def percent(value) -> int:
    """A 0..1 fraction as a whole percentage."""
    try:
        return round(float(value) * 100)
    except (TypeError, ValueError):
        return 0


@register.filter
def filesize(value) -> str:
    size = float(value or 0)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size} B"


@register.filter
def message_parts(message) -> dict:
    """A flash message split into its user-language text and the expert detail (apps.web.errors)."""
    from apps.web.errors import split_message

    text, detail = split_message(message)
    return {"text": text, "detail": detail}


@register.filter
def gigabytes(value) -> str:
    """A memory or storage amount held in GB, with its unit."""
    if value is None or value == "":
        return "—"
    return f"{value} GB"


@register.filter
def resource(value, key) -> str:
    """A launch-spec resource value with its unit (memory in GB; cpu and gpu are counts)."""
    if key == "memory":
        return gigabytes(value)
    return str(value)


@register.filter
def from_now(value) -> str:
    """A future instant as "in 58 min" / "in 3 h 5 min" / "in 2 days" (past: "now")."""
    from django.utils import timezone

    if not value:
        return ""
    seconds = int((value - timezone.now()).total_seconds())
    if seconds <= 0:
        return "now"
    minutes = (seconds + 59) // 60
    if minutes < 60:
        return f"in {minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"in {hours} h {minutes} min" if minutes else f"in {hours} h"
    return f"in {hours // 24} days"


@register.filter
def since(value) -> str:
    """Elapsed time since an instant as "42 s" / "3 min 5 s" / "2 h 4 min"."""
    from django.utils import timezone

    if not value:
        return ""
    seconds = max(0, int((timezone.now() - value).total_seconds()))
    return duration(seconds)


@register.filter
def duration(seconds) -> str:
    if seconds is None or seconds == "":
        return ""
    seconds = int(float(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s" if seconds else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


@register.filter
def eta(waiting) -> str:
    """A pending job's expected start (R-JOB-5), the median and the bound it beats 9 times in 10:
    ``likely in about 4 min, almost surely within 11 min``; empty without one."""
    if waiting is None or waiting.eta_seconds is None:
        return ""
    likely = f"likely in about {duration(waiting.eta_seconds)}"  # "starts likely in …" on a session
    if waiting.eta_p90_seconds is None:
        return likely
    return f"{likely}, almost surely within {duration(waiting.eta_p90_seconds)}"


@register.simple_tag(takes_context=True)
def session_state(context, session, element_id: str = "") -> str:
    """A session's status badge in the viewer's words: "Active", "Released by you", "Revoked by an
    administrator", "Ended (idle)"…"""
    from django.utils.html import format_html

    from apps.web.views import session_end_words

    if session.is_active:
        words, css = "Active", "active"
    else:
        words = session_end_words(session, context["request"].user)
        words, css = words[:1].upper() + words[1:], "revoked"
    if element_id:
        return format_html('<span class="status status-{}" id="{}">{}</span>', css, element_id, words)
    return format_html('<span class="status status-{}">{}</span>', css, words)
