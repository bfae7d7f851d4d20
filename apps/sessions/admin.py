from django.contrib import admin, messages

from apps.sessions import services
from apps.sessions.models import Session, SessionStatus


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
        revoked = services.revoke(session_ids=queryset.filter(status=SessionStatus.ACTIVE).values_list("pk", flat=True))
        self.message_user(request, f"Revoked {revoked} session(s).", messages.SUCCESS)
