from django.contrib import admin, messages

from apps.core.admin_base import ModelAdmin
from apps.sessions import services
from apps.sessions.models import Session, SessionStatus


@admin.register(Session)
class SessionAdmin(ModelAdmin):
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
    # Every user: "only those with a session" was a DISTINCT over the whole session history.
    list_filter = ["pool", "status", "revocation_reason", "user"]
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

    def save_model(self, request, obj, form, change):
        # Every field is read-only (admission, release and the dispatcher write them): "Save"
        # writes nothing back over what they wrote since this request read the row.
        pass

    def has_delete_permission(self, request, obj=None):
        # An active session (or one whose jobs still run) is revoked, not deleted: see
        # services.deletable. The delete page answers 403 rather than skipping its release.
        if obj is not None and not services.deletable(Session.objects.filter(pk=obj.pk)).exists():
            return False
        return super().has_delete_permission(request, obj)

    def delete_queryset(self, request, queryset):
        kept = queryset.count() - services.deletable(queryset).count()
        if kept:
            self.message_user(
                request,
                f"Not deleted: {kept} session(s) still active or running jobs (revoke them first).",
                messages.ERROR,
            )
        super().delete_queryset(request, services.deletable(queryset))

    @admin.action(description="Revoke selected sessions (frees their slots now)", permissions=["change"])
    def revoke_sessions(self, request, queryset):
        revoked = services.revoke(session_ids=queryset.filter(status=SessionStatus.ACTIVE).values_list("pk", flat=True))
        self.message_user(request, f"Revoked {revoked} session(s).", messages.SUCCESS)
