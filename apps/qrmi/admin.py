"""R-QRMI-2: a user's Unix uid is edited on the user's own admin page (an inline)."""

from django import forms
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.forms.models import BaseInlineFormSet

from apps.accounts.admin import IdentityInline
from apps.cases.services import check_unix_uid_change
from apps.core.admin_base import DeletedByService, FieldValues, ModelAdmin
from apps.core.exceptions import Conflict
from apps.qrmi.models import UnixAccount

User = get_user_model()


def check_saved_uid(account: UnixAccount) -> None:
    """``Conflict`` while the user's cases run under ``account``'s saved uid, about to change or go."""
    saved = UnixAccount.objects.select_related("user").filter(pk=account.pk, unix_uid__isnull=False).first()
    if account.pk is not None and saved is not None:
        check_unix_uid_change(saved.user)


def refuse_while_cases_run(account: UnixAccount) -> None:
    try:
        check_saved_uid(account)
    except Conflict as exc:
        raise forms.ValidationError(exc.detail) from None


class UnixAccountForm(forms.ModelForm):
    def clean(self):
        data = super().clean()
        if self.has_changed():
            refuse_while_cases_run(self.instance)
        return data


class UnixAccountFormSet(BaseInlineFormSet):
    def clean(self):
        super().clean()
        for form in self.deleted_forms:  # Django drops a deleted form's own errors
            refuse_while_cases_run(form.instance)


class UnixAccountInline(admin.StackedInline):
    model = UnixAccount
    form = UnixAccountForm
    formset = UnixAccountFormSet
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
class UnixAccountAdmin(DeletedByService, ModelAdmin):
    form = UnixAccountForm
    list_display = ["user", "unix_uid", "updated_at"]
    list_select_related = ["user"]
    search_fields = ["user__username", "=unix_uid"]
    autocomplete_fields = ["user"]

    def delete_one(self, obj):
        check_saved_uid(obj)
        obj.delete()
