"""Allocations (R-ALLOC-1): grants of device time and case core-hours to a project on a pool, and
the ledger of what each job and case was charged (R-ACCT-1's usage export reads it).

A project is a group or one user. An allocation's spending for its current period is kept on its
own row (``used_*``, with ``used_period_start`` saying which period those figures are of), so
the dispatcher reads its remaining budget with one probe and a charge is one ``used = used + x``
UPDATE of that row: nothing is written on the pool row, which submissions read as a version
(R-SESS-7). A pool with no allocation row is unlimited (allocations are opt-in per pool).
"""

from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from apps.core.models import KeepsWorkerColumns
from apps.resources.models import ResourcePool

INFINITY = float("inf")
#: the longest rolling window: a century (a longer one, e.g. seconds typed as days, ends past the
#: calendar's last date and every reading of its period would fail)
MAX_WINDOW_DAYS = 36_525


class PeriodKind(models.TextChoices):
    FIXED = "fixed", "Fixed dates (start to end)"
    ROLLING = "rolling", "Rolling: consecutive windows of N days from the start"


class Allocation(KeepsWorkerColumns, models.Model):
    """A grant to a project (``group``, or one ``user``) on ``pool`` of ``device_seconds`` of
    device time and/or ``core_hours`` of case time per period. A limit left empty is not limited.

    Periods: ``fixed`` runs from ``starts_at`` to ``ends_at`` (outside it nothing is left);
    ``rolling`` is a run of windows of ``window_days`` days from ``starts_at``, each starting
    afresh (the previous window's spending is not carried over)."""

    name = models.CharField(max_length=100, help_text=_("The project's name, as users see it."))
    pool = models.ForeignKey(ResourcePool, on_delete=models.CASCADE, related_name="allocations")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="allocations"
    )
    group = models.ForeignKey(Group, null=True, blank=True, on_delete=models.CASCADE, related_name="allocations")
    device_seconds = models.FloatField(
        null=True, blank=True, help_text=_("Device (QPU) seconds granted per period; empty: not limited.")
    )
    core_hours = models.FloatField(
        null=True, blank=True, help_text=_("Case core-hours (cores × run time) granted per period; empty: not limited.")
    )
    period = models.CharField(max_length=8, choices=PeriodKind.choices, default=PeriodKind.FIXED)
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField(null=True, blank=True, help_text=_("Fixed periods: when the grant ends."))
    window_days = models.PositiveIntegerField(null=True, blank=True, help_text=_("Rolling periods: days per window."))
    # Kept by the charges (apps.allocations.services.charge_*), never by hand.
    used_device_seconds = models.FloatField(default=0.0, editable=False)
    used_core_hours = models.FloatField(default=0.0, editable=False)
    used_period_start = models.DateTimeField(
        null=True, blank=True, editable=False, help_text=_("The period the used figures are of.")
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["pool_id", "name", "id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(user__isnull=False, group__isnull=True) | Q(user__isnull=True, group__isnull=False),
                name="allocation_user_or_group",
                violation_error_message="An allocation is granted to one group or to one user.",
            ),
            models.CheckConstraint(
                condition=Q(device_seconds__isnull=False) | Q(core_hours__isnull=False),
                name="allocation_grants_something",
                violation_error_message="Grant device seconds, core-hours, or both.",
            ),
            models.CheckConstraint(
                condition=(Q(device_seconds__isnull=True) | Q(device_seconds__gte=0))
                & (Q(core_hours__isnull=True) | Q(core_hours__gte=0)),
                name="allocation_grants_not_negative",
                violation_error_message="A grant cannot be negative.",
            ),
            models.CheckConstraint(
                condition=Q(period="fixed", ends_at__isnull=False, ends_at__gt=models.F("starts_at"))
                | Q(period="rolling", window_days__gte=1),
                name="allocation_period_complete",
                violation_error_message="A fixed period ends after it starts; a rolling one has a window of days.",
            ),
            models.CheckConstraint(
                condition=Q(window_days__isnull=True) | Q(window_days__lte=MAX_WINDOW_DAYS),
                name="allocation_window_at_most_a_century",
                violation_error_message=f"A window is at most {MAX_WINDOW_DAYS} days.",
            ),
        ]
        indexes = [
            models.Index(fields=["user"], name="allocations_user"),
            models.Index(fields=["group"], name="allocations_group"),
        ]

    def __str__(self):
        return f"{self.name} on {self.pool}"

    #: kept by the charges alone, each a ``used = used + x`` UPDATE of this row: an edit never
    #: writes back the spending it read (a job charged since would be lost, its time spent again)
    WORKER_COLUMNS = ("used_device_seconds", "used_core_hours", "used_period_start")

    def clean(self):
        if bool(self.user_id) == bool(self.group_id):
            raise ValidationError({"group": _("Grant the allocation to one group or to one user.")})
        if self.device_seconds is None and self.core_hours is None:
            raise ValidationError({"device_seconds": _("Grant device seconds, core-hours, or both.")})
        if self.period == PeriodKind.FIXED:
            if self.ends_at is None:
                raise ValidationError({"ends_at": _("A fixed period needs an end.")})
            if self.starts_at and self.ends_at <= self.starts_at:
                raise ValidationError({"ends_at": _("The end must be after the start.")})
        elif not self.window_days:
            raise ValidationError({"window_days": _("A rolling period needs a window of at least one day.")})
        elif self.window_days > MAX_WINDOW_DAYS:
            raise ValidationError({"window_days": _("A window is at most %(days)d days.") % {"days": MAX_WINDOW_DAYS}})

    @property
    def project(self) -> str:
        return f"group {self.group.name}" if self.group_id else f"user {self.user.get_username()}"

    # -- the period and what is left of it --------------------------------------------------------
    def period_at(self, now: datetime) -> tuple[datetime, datetime] | None:
        """The period that holds ``now``, as (start, end); None outside the grant (before its
        start, after a fixed end)."""
        if now < self.starts_at:
            return None
        if self.period == PeriodKind.FIXED:
            return (self.starts_at, self.ends_at) if now < self.ends_at else None
        window = timedelta(days=self.window_days)
        start = self.starts_at + window * ((now - self.starts_at) // window)
        return start, start + window

    def used_in(self, period) -> tuple[float, float]:
        """(device seconds, core-hours) spent in ``period`` (0 for a period not charged yet)."""
        if period is None or self.used_period_start != period[0]:
            return 0.0, 0.0
        return self.used_device_seconds, self.used_core_hours

    def remaining_at(self, now: datetime) -> tuple[float, float]:
        """(device seconds, core-hours) left now: infinite where not limited, 0 outside the
        grant, negative after an overdraw (a running job finishing past the limit)."""
        period = self.period_at(now)
        if period is None:
            return (
                0.0 if self.device_seconds is not None else INFINITY,
                0.0 if self.core_hours is not None else INFINITY,
            )
        device, cores = self.used_in(period)
        return (
            INFINITY if self.device_seconds is None else self.device_seconds - device,
            INFINITY if self.core_hours is None else self.core_hours - cores,
        )


class ChargeKind(models.TextChoices):
    JOB = "job", "Job (device time)"
    CASE = "case", "Case (cores × run time)"


class Charge(models.Model):
    """What one job (its device time) or one case (cores × run time) cost, written once: the
    unique constraints on ``job`` and on ``case`` make a second charge of the same work a no-op
    (``INSERT … ON CONFLICT DO NOTHING``). Written for every job and case that used time, with an
    allocation or without one (a pool with no allocations), so the usage export is complete."""

    kind = models.CharField(max_length=4, choices=ChargeKind.choices)
    # PROTECT: a pool, or a grant (and the user or group it was granted to), with charges is not
    # deleted: the usage reports of past periods read them by pool, project and group.
    allocation = models.ForeignKey(Allocation, null=True, blank=True, on_delete=models.PROTECT, related_name="charges")
    pool = models.ForeignKey(ResourcePool, on_delete=models.PROTECT, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    # Kept when a cleanup deletes the job or case: the ledger outlives them.
    job = models.ForeignKey("scheduling.Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    case = models.ForeignKey("cases.Case", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    device_seconds = models.FloatField(default=0.0)
    core_hours = models.FloatField(default=0.0)
    charged_at = models.DateTimeField()
    period_start = models.DateTimeField(null=True, blank=True, help_text=_("The allocation's period it counts in."))

    class Meta:
        ordering = ["-charged_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["job"], condition=Q(job__isnull=False), name="charge_once_per_job"),
            models.UniqueConstraint(fields=["case"], condition=Q(case__isnull=False), name="charge_once_per_case"),
        ]
        indexes = [
            # The usage export and the utilization page: charges of a period, grouped.
            models.Index(fields=["charged_at"], name="charges_charged_at"),
            models.Index(fields=["allocation", "charged_at"], name="charges_allocation"),
        ]

    def __str__(self):
        return f"{self.kind} charge {self.pk}: {self.device_seconds:.1f} s, {self.core_hours:.3f} core-h"
