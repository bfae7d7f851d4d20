from django.contrib import admin
from django.utils import timezone

from apps.allocations import selectors, services
from apps.allocations.models import Allocation, Charge
from apps.core.admin_base import ModelAdmin


@admin.register(Allocation)
class AllocationAdmin(ModelAdmin):
    """Operators grant, raise and end allocations here. Raising a grant (or a new period)
    releases the project's waiting jobs at the next dispatch; the used figures are the charges'."""

    list_display = ["name", "pool", "project", "period", "device_seconds", "core_hours", "left", "starts_at", "ends_at"]
    list_filter = ["pool", "period"]
    search_fields = ["name", "user__username", "group__name", "pool__name"]
    list_select_related = ["pool", "user", "group"]
    autocomplete_fields = ["user", "group"]
    readonly_fields = ["used_device_seconds", "used_core_hours", "used_period_start", "created_at", "updated_at"]
    fields = [
        "name",
        "pool",
        "user",
        "group",
        "device_seconds",
        "core_hours",
        "period",
        "starts_at",
        "ends_at",
        "window_days",
        *readonly_fields,
    ]

    def get_readonly_fields(self, request, obj=None):
        # An allocation stays on its pool: its sessions there spend it (chosen at admission among
        # the user's allocations on that pool), and moved it would charge another pool's jobs.
        # Once charged it stays with its project too: the usage reports read a charge's group
        # through its allocation (R-ACCT-1), so a grant given to another group or user moved the
        # past periods' usage with it. A new project gets an allocation of its own.
        fields = super().get_readonly_fields(request, obj)
        if obj is None:
            return fields
        return [*fields, "pool", *(["user", "group"] if obj.charges.exists() else [])]

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if change and set(services.PERIOD_FIELDS) & set(form.changed_data):
            # R-ALLOC-1/R-ACCT-1: the used figures follow the period to its new dates.
            services.settle_period(obj.pk, timezone.now())

    @admin.display(description="project")
    def project(self, allocation):
        return allocation.project

    @admin.display(description="left this period")
    def left(self, allocation):
        return selectors.summary(allocation, timezone.now())


@admin.register(Charge)
class ChargeAdmin(ModelAdmin):
    """The ledger: one row per job or case that used time, written by the workers only."""

    list_display = [
        "charged_at",
        "kind",
        "pool",
        "user",
        "allocation",
        "job_id",
        "case_id",
        "device_seconds",
        "core_hours",
    ]
    list_filter = ["kind", "pool"]
    search_fields = ["user__username", "allocation__name"]
    # An allocation reads as "<name> on <pool>": its pool comes with the row.
    list_select_related = ["pool", "user", "allocation__pool"]
    date_hierarchy = "charged_at"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
