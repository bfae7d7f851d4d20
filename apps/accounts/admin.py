"""API tokens for operators: who holds which, until when, when last used, and revoking them. A key
is never shown here: only its digest is stored, and tokens are issued to their holders (the token
login, the "API tokens" page, ``POST /api/v1/auth/tokens/``)."""

from django.contrib import admin
from django.utils import timezone

from apps.accounts.forms import AdminLoginForm
from apps.accounts.models import ApiToken, Identity
from apps.core.admin_base import ModelAdmin

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
class ApiTokenAdmin(ModelAdmin):
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


class IdentityInline(admin.TabularInline):
    """A user's identities at the identity provider, on the user's page (``apps/qrmi/admin.py``
    composes the user page): an operator links a sign-in or a service account to this user here."""

    model = Identity
    extra = 0
    fields = ["issuer", "subject", "note", "last_login_at", "checked_at"]
    readonly_fields = ["last_login_at", "checked_at"]
    verbose_name_plural = "identities at the identity provider (sign-in, bearer tokens)"


@admin.register(Identity)
class IdentityAdmin(ModelAdmin):
    """Who a provider's (issuer, subject) is here. Linking: a local account whose first sign-in was
    refused (its username was taken), or a service account's client credentials tokens. A subject
    belongs to one user (the constraint); deleting an identity makes that sign-in a stranger again."""

    list_display = ["subject", "user", "issuer", "note", "last_login_at", "checked_at", "created_at"]
    list_filter = ["issuer"]
    list_select_related = ["user"]
    search_fields = ["subject", "user__username", "note"]
    autocomplete_fields = ["user"]
    fields = ["user", "issuer", "subject", "note", "created_at", "last_login_at", "checked_at"]
    readonly_fields = ["created_at", "last_login_at", "checked_at"]

    def get_changeform_initial_data(self, request):
        from django.conf import settings

        return {"issuer": settings.GRIDGATE_OIDC_ISSUER, **super().get_changeform_initial_data(request)}
