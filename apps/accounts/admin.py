"""API tokens for operators: who holds which, until when, when last used, and revoking them. A key
is never shown here: only its digest is stored, and tokens are issued to their holders (the token
login, the "API tokens" page, ``POST /api/v1/auth/tokens/``)."""

from django.contrib import admin
from django.utils import timezone

from apps.accounts.forms import AdminLoginForm
from apps.accounts.models import ApiToken

# The admin login says when django-axes refused an attempt (it counts failures like every login).
admin.site.login_form = AdminLoginForm


class ExpiryFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return [("valid", "valid"), ("expired", "expired")]

    def queryset(self, request, queryset):
        if self.value() == "valid":
            return queryset.filter(expires_at__gt=timezone.now())
        if self.value() == "expired":
            return queryset.filter(expires_at__lte=timezone.now())
        return queryset


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["prefix", "user", "name", "created_at", "expires_at", "last_used_at", "valid"]
    list_filter = [ExpiryFilter]
    list_select_related = ["user"]
    search_fields = ["user__username", "^prefix", "name"]
    date_hierarchy = "created_at"
    fields = readonly_fields = ["user", "prefix", "name", "created_at", "expires_at", "last_used_at"]
    actions = ["revoke"]

    def has_add_permission(self, request):
        # A key is only ever shown to its holder, who creates it (the token login, the API tokens page).
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # "revoke" is the same deletion, named for what it means
        return actions

    @admin.display(boolean=True, description="valid")
    def valid(self, obj):
        return not obj.expired

    @admin.action(description="Revoke the selected tokens (their clients must log in again)", permissions=["delete"])
    def revoke(self, request, queryset):
        count, _ = queryset.delete()
        self.message_user(request, f"{count} token(s) revoked.")
