"""Operators' view of per-user remote credentials (docs/backends.md, "Per-user credentials"):
whose connection exists, to which pool, as which provider identity, and since when; staff can
delete one (the user then reconnects). Nothing here can open the sealed credential.
"""

from django.contrib import admin, messages

from apps.core.admin_base import ModelAdmin
from apps.credentials import services as credential_services
from apps.credentials.models import RemoteConnection


@admin.register(RemoteConnection)
class RemoteConnectionAdmin(ModelAdmin):
    list_display = ["user", "pool", "state", "subject", "connected_at", "last_refreshed_at", "failed_at"]
    list_filter = ["state", "pool"]
    list_select_related = ["user", "pool"]
    search_fields = ["user__username", "pool__name", "subject", "provider_username"]
    date_hierarchy = "connected_at"
    # Never "sealed_secret": not even its ciphertext is shown (it is not editable, so no form has it).
    fields = [
        "user",
        "pool",
        "state",
        "subject",
        "provider_username",
        "issuer",
        "connected_at",
        "last_refreshed_at",
        "failed_at",
        "failure",
        "updated_at",
    ]
    readonly_fields = fields
    actions = ["delete_selected"]

    def has_add_permission(self, request):
        return False  # only the user's own connect creates one (the credential is theirs to give)

    def has_change_permission(self, request, obj=None):
        return False

    def delete_model(self, request, obj):
        self.delete_queryset(request, RemoteConnection.objects.filter(pk=obj.pk))

    def delete_queryset(self, request, queryset):
        """Deleting revokes a FirecREST grant at the identity provider, as the user's own
        disconnect does (``credential_services.forget``)."""
        for connection in queryset.select_related("user", "pool"):
            forgotten = credential_services.forget(RemoteConnection.objects.filter(pk=connection.pk))
            if forgotten is None:
                continue  # deleted meanwhile
            self.message_user(
                request,
                f"{connection.user}'s connection to {connection.pool} is deleted: their cases there wait until "
                f"they reconnect. {forgotten.detail}",
                messages.WARNING if forgotten.revoked is False else messages.INFO,
            )
