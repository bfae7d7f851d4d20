"""R-QRMI-2: a user's Unix uid is edited on the user's own admin page (an inline)."""

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin

from apps.accounts.admin import IdentityInline
from apps.core.admin_base import FieldValues, ModelAdmin
from apps.qrmi.models import UnixAccount

User = get_user_model()


class UnixAccountInline(admin.StackedInline):
    model = UnixAccount
    can_delete = True
    max_num = 1
    extra = 1
    fields = ["unix_uid"]
    verbose_name_plural = "Unix account (MUNGE / QRMI)"


# Django's auth app registers its UserAdmin for User; this subclass replaces that registration
# (Django's documented way to extend the user page) and is the only one Gridgate makes.
admin.site.unregister(User)


@admin.register(User)
class UserWithUnixAccountAdmin(FieldValues, UserAdmin):
    inlines = [*UserAdmin.inlines, UnixAccountInline, IdentityInline]
    list_display = [*UserAdmin.list_display, "unix_uid"]
    search_fields = [*UserAdmin.search_fields, "=unix_account__unix_uid", "identities__subject"]

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("unix_account")

    @admin.display(description="Unix uid", ordering="unix_account__unix_uid")
    def unix_uid(self, obj):
        account = getattr(obj, "unix_account", None)
        return account.unix_uid if account else None


@admin.register(UnixAccount)
class UnixAccountAdmin(ModelAdmin):
    list_display = ["user", "unix_uid", "updated_at"]
    list_select_related = ["user"]
    search_fields = ["user__username", "=unix_uid"]
    autocomplete_fields = ["user"]
