from django.contrib import admin, messages

from apps.core.admin_base import ModelAdmin
from apps.licences.models import LicenceState
from apps.licences.services import request_sync


@admin.register(LicenceState)
class LicenceStateAdmin(ModelAdmin):
    """What the licence sync last pushed to Slurm for each pool, why, and whether sacctmgr
    answered (the pool's licence itself is set on the pool's page)."""

    list_display = ["pool", "licence", "count", "reason", "synced_at", "failures", "error"]
    list_filter = ["failures"]
    list_select_related = ["pool"]
    search_fields = ["pool__name", "licence"]
    readonly_fields = [
        "pool",
        "licence",
        "count",
        "reason",
        "reservations",
        "synced_at",
        "error",
        "failures",
        "pending_since",
    ]
    actions = ["sync_now"]

    def has_add_permission(self, request):
        return False  # made by the sync

    def has_delete_permission(self, request, obj=None):
        # The sync's memory of what it made in Slurm: deleted by hand, the licence it last pushed
        # was never set to 0 once the pool's licence was changed or removed, and the Slurm
        # reservations it mirrored were never removed (it forgets them). It goes with its pool
        # (PoolAdmin.deleted_with), whose deletion closes both (services.on_pool_deleted).
        return False

    def save_model(self, request, obj, form, change):
        # Every field is the sync's (its UPDATEs): a Save writes none back, or the reservations it
        # made in Slurm meanwhile would be forgotten and never removed.
        obj.save(update_fields=form.changed_data)

    @admin.action(description="Sync the selected pools' licences now", permissions=["change"])
    def sync_now(self, request, queryset):
        pool_ids = list(queryset.values_list("pool_id", flat=True))
        request_sync(pool_ids)
        self.message_user(request, f"Asked for a sync of {len(pool_ids)} licence(s).", messages.SUCCESS)
