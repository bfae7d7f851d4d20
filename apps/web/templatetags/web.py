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
