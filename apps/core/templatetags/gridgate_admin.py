"""The admin's date hierarchy without a scan of the whole history (SPEC §9).

Django's drill-down lists the years (months, days) that hold rows with a ``SELECT DISTINCT
DATE_TRUNC(...)`` over the list's rows: on the jobs, sessions, cases, charges or deliveries of a
centre that has run for years, every view of the list read all of them. Here the steps are every
year (month, day) between the list's first and last date, read as ``MIN``/``MAX`` of the field (an
index's two ends); a step that holds no row shows an empty list. Everything else is Django's own
``date_hierarchy``, used by ``templates/admin/change_list.html``.
"""

from datetime import date, datetime, timedelta

from django import template
from django.contrib.admin.templatetags.admin_list import date_hierarchy
from django.contrib.admin.templatetags.base import InclusionAdminNode
from django.db.models import Max, Min
from django.utils import timezone

register = template.Library()

#: more years than this between a list's first and last date (a window the API took in year 9999
#: beside this year's): the years that hold rows are read as Django does, not thousands of links
MAX_YEARS = 50


def _steps(first, last, kind: str, as_datetimes: bool) -> list:
    if first is None or last is None:
        return []
    if as_datetimes:
        first, last = (timezone.localtime(v) if timezone.is_aware(v) else v for v in (first, last))
        first, last = first.date(), last.date()
    if kind == "year":
        return [date(year, 1, 1) for year in range(first.year, last.year + 1)]
    if kind == "month":
        months = range(first.year * 12 + first.month - 1, last.year * 12 + last.month)
        return [date(index // 12, index % 12 + 1, 1) for index in months]
    return [first + timedelta(days=n) for n in range((last - first).days + 1)]


class _Bounded:
    """The list's queryset as Django's tag uses it, its steps read from the bounds."""

    def __init__(self, queryset, field_name: str):
        self._queryset = queryset
        self._field_name = field_name
        self._bounds = None

    def aggregate(self, **kwargs):
        """Django's tag asks the bounds to choose its level, the steps below read them again."""
        if set(kwargs) != {"first", "last"}:
            return self._queryset.aggregate(**kwargs)
        if self._bounds is None:
            self._bounds = self._queryset.aggregate(first=Min(self._field_name), last=Max(self._field_name))
        return dict(self._bounds)

    def datetimes(self, field_name, kind):
        bounds = self.aggregate(first=None, last=None)
        steps = _steps(bounds["first"], bounds["last"], kind, True)
        if len(steps) > MAX_YEARS:
            return self._queryset.datetimes(field_name, kind)
        return [datetime(d.year, d.month, d.day) for d in steps]

    def dates(self, field_name, kind):
        bounds = self.aggregate(first=None, last=None)
        steps = _steps(bounds["first"], bounds["last"], kind, False)
        return self._queryset.dates(field_name, kind) if len(steps) > MAX_YEARS else steps


class _ChangeList:
    def __init__(self, changelist):
        self._changelist = changelist
        self.queryset = _Bounded(changelist.queryset, changelist.date_hierarchy)

    def __getattr__(self, name):
        return getattr(self._changelist, name)


def bounded_date_hierarchy(cl):
    return date_hierarchy(_ChangeList(cl))


@register.tag(name="bounded_date_hierarchy")
def bounded_date_hierarchy_tag(parser, token):
    return InclusionAdminNode(
        parser, token, func=bounded_date_hierarchy, template_name="date_hierarchy.html", takes_context=False
    )
