from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList

from apps.resources.admin import ResourcePoolAdmin
from apps.sessions import services
from apps.sessions.models import Session, SessionStatus
from apps.sessions.selectors import active_usage


@admin.register(Session)
class SessionAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "user",
        "pool",
        "resource_class",
        "slots",
        "external_id",
        "status",
        "revocation_reason",
        "created_at",
        "idle_expires_at",
        "expires_at",
    ]
    list_filter = ["pool", "status", "revocation_reason", ("user", admin.RelatedOnlyFieldListFilter)]
    list_select_related = ["user", "pool", "resource_class", "resource_class__pool"]
    search_fields = ["external_id", "=id", "user__username"]
    date_hierarchy = "created_at"
    readonly_fields = [
        "id",
        "user",
        "resource_class",
        "pool",
        "slots",
        "external_id",
        "status",
        "created_at",
        "last_activity_at",
        "expires_at",
        "idle_expires_at",
        "revoked_at",
        "revocation_reason",
        "vruntime",
        "launch_spec",
    ]
    actions = ["revoke_sessions"]

    def has_add_permission(self, request):
        # Sessions are opened through admission (capacity checks under the pool lock), never by form.
        return False

    @admin.action(description="Revoke selected sessions (frees their slots now)", permissions=["change"])
    def revoke_sessions(self, request, queryset):
        revoked = sum(services.revoke(session) for session in queryset.filter(status=SessionStatus.ACTIVE))
        self.message_user(request, f"Revoked {revoked} session(s).", messages.SUCCESS)


class PoolAdminWithSlots(ResourcePoolAdmin):
    """The pool page with slot usage (sessions are a separate app; resources does not import it).
    Registered by apps.scheduling.admin, which adds the devices inline."""

    def get_list_display(self, request):
        return [*super().get_list_display(request), "slots_used"]

    def get_readonly_fields(self, request, obj=None):
        return [*super().get_readonly_fields(request, obj), "slots_used"]

    def get_fieldsets(self, request, obj=None):
        fieldsets = [list(f) for f in super().get_fieldsets(request, obj)]
        for name, options in fieldsets:
            if name == "Capacity":
                options["fields"] = [*options["fields"], "slots_used"]
        return [tuple(f) for f in fieldsets]

    def get_changelist(self, request, **kwargs):
        return _PoolUsageChangeList

    @admin.display(description="slots used / total")
    def slots_used(self, obj):
        used = getattr(obj, "_slots_used", None)
        if used is None and obj.pk:
            used = active_usage([obj.pk])[obj.pk].slots
        total = obj.slots_total if obj.slots_total is not None else "∞"
        return f"{used or 0} / {total}"


class _PoolUsageChangeList(ChangeList):
    """The pool list reads every listed pool's usage in one query (``active_usage``)."""

    def get_results(self, request):
        super().get_results(request)
        used = active_usage(pool.pk for pool in self.result_list)
        for pool in self.result_list:
            pool._slots_used = used[pool.pk].slots
