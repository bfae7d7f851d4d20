"""R-QRMI-2: a user's Unix uid is edited on the user's own admin page (an inline)."""

from django.contrib import admin
from django.contrib.auth import get_user_model

from apps.qrmi.models import UnixAccount

User = get_user_model()


class UnixAccountInline(admin.StackedInline):
    model = UnixAccount
    can_delete = True
    max_num = 1
    extra = 1
    fields = ["unix_uid"]
    verbose_name_plural = "Unix account (MUNGE / QRMI)"


# Extend whatever admin the User model has (Django's UserAdmin or another app's subclass)
# instead of replacing it.
_base = type(admin.site._registry[User]) if admin.site.is_registered(User) else admin.ModelAdmin
if admin.site.is_registered(User):
    admin.site.unregister(User)


@admin.register(User)
class UserWithUnixAccountAdmin(_base):
    inlines = [*getattr(_base, "inlines", []), UnixAccountInline]
    list_display = [*_base.list_display, "unix_uid"]
    search_fields = [*_base.search_fields, "=unix_account__unix_uid"]

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("unix_account")

    @admin.display(description="Unix uid", ordering="unix_account__unix_uid")
    def unix_uid(self, obj):
        account = getattr(obj, "unix_account", None)
        return account.unix_uid if account else None


@admin.register(UnixAccount)
class UnixAccountAdmin(admin.ModelAdmin):
    list_display = ["user", "unix_uid", "updated_at"]
    list_select_related = ["user"]
    search_fields = ["user__username", "=unix_uid"]
    autocomplete_fields = ["user"]
