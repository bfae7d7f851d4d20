"""The base of every Gridgate admin page."""

from django.contrib import admin, messages
from django.contrib.admin import actions as admin_actions
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.widgets import AutocompleteSelect, AutocompleteSelectMultiple
from django.core.exceptions import FieldDoesNotExist, ValidationError
from django.db import transaction
from django.http import HttpResponseRedirect
from django.urls import reverse
from django.utils.translation import gettext_lazy

from apps.core.exceptions import Conflict


def read_as(field, value):
    """``value`` (one, or a list of them) as the model ``field`` reads it, or ValidationError;
    a relation reads its target's key."""
    read = (field.target_field if field.is_relation else field).to_python
    return [read(item) for item in value] if isinstance(value, list) else read(value)


class IdsItTakes:
    """An autocomplete widget shows again the choices a form was sent, which it looks up by id:
    an id that is no number ('abc', '²') raised in that query, and the page answered 500 where a
    form error was due. It looks up only the ids its field takes."""

    def optgroups(self, name, value, attr=None):
        taken = []
        for item in value:
            try:
                read_as(self.field, item)
            except ValidationError:
                continue
            taken.append(item)
        return super().optgroups(name, taken, attr)


class IdsItTakesSelect(IdsItTakes, AutocompleteSelect):
    pass


class IdsItTakesSelectMultiple(IdsItTakes, AutocompleteSelectMultiple):
    pass


class DatesItTakes:
    """A list's date drill-down (``date_hierarchy``) whose end is past datetime's range: Django
    bounds ``?start__year=9999`` (``__month=12``, ``__day=31``) by the year (month, day) after it,
    which raised ValueError or OverflowError (a 500, on a link the drill-down itself shows for a
    window the API took in year 9999). It is the admin's answer to a filter it cannot read."""

    def get_filters(self, request):
        try:
            return super().get_filters(request)
        except (ValueError, OverflowError) as exc:
            raise IncorrectLookupParameters(exc) from exc


class FieldValues:
    """What an administrator types by hand, read as each model field reads it:
    - an add page's values from its query string (``?user=3``): Django hands them to the form as
      the text that came, so a user's id that is no number made the autocomplete query raise,
      and any ``?start=`` reached the split date-time widget as text (both answered 500); a value
      its field does not take is left out;
    - an autocomplete field's value sent back with a form error (``IdsItTakes``)."""

    def get_changeform_initial_data(self, request):
        initial = {}
        for name, value in super().get_changeform_initial_data(request).items():
            try:
                initial[name] = read_as(self.model._meta.get_field(name), value)
            except FieldDoesNotExist:
                initial[name] = value
            except ValidationError:
                continue
        return initial

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if "widget" not in kwargs and db_field.name in self.get_autocomplete_fields(request):
            kwargs["widget"] = IdsItTakesSelect(db_field, self.admin_site, using=kwargs.get("using"))
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def formfield_for_manytomany(self, db_field, request, **kwargs):
        if "widget" not in kwargs and db_field.name in self.get_autocomplete_fields(request):
            kwargs["widget"] = IdsItTakesSelectMultiple(db_field, self.admin_site, using=kwargs.get("using"))
        return super().formfield_for_manytomany(db_field, request, **kwargs)

    def get_changelist(self, request, **kwargs):
        changelist = super().get_changelist(request, **kwargs)
        return (
            changelist if issubclass(changelist, DatesItTakes) else type("ChangeList", (DatesItTakes, changelist), {})
        )


class ModelAdmin(FieldValues, admin.ModelAdmin):
    #: models whose rows go with this page's rows when they are deleted, as the API's delete takes
    #: them: the system's own records of them (a pool's queue row, a device's driver runs). Their
    #: own pages refuse a deletion by hand, which Django also asked of every row a deletion here
    #: takes with it: even a superuser could not delete a pool that ever queued a job, nor a device
    #: that ever ran one, in the admin, while the API deleted both.
    deleted_with: tuple = ()

    def get_deleted_objects(self, objs, request):
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        taken = {str(model._meta.verbose_name) for model in self.deleted_with}
        return deleted, counts, {name for name in perms_needed if str(name) not in taken}, protected


class DeletedByService:
    """A page whose rows a service deletes, and may refuse to (``Conflict``, as the API's 409): its
    delete page and the list's "delete selected" keep a refused row out of the history and out of
    the count, and say why. Django's own logged each deletion, and said it was done, before the
    deletion ran: a refused one was reported deleted. ``delete_one`` calls the service."""

    def delete_one(self, obj) -> None:
        raise NotImplementedError

    def delete_model(self, request, obj):
        self.delete_one(obj)  # Conflict: answered by delete_view

    def delete_view(self, request, object_id, extra_context=None):
        try:
            return super().delete_view(request, object_id, extra_context)
        except Conflict as exc:  # the view's transaction, log entry included, is rolled back
            self.message_user(request, f"Not deleted: {exc.detail}", messages.ERROR)
            opts = self.model._meta
            return HttpResponseRedirect(reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[object_id]))

    @admin.action(permissions=["delete"], description=gettext_lazy("Delete selected %(verbose_name_plural)s"))
    def delete_selected(self, request, queryset):
        """Django's action (its confirmation page, its permission checks), but each row is deleted
        by the service, logged only if it went, and the message counts only those."""
        if not request.POST.get("post"):
            return admin_actions.delete_selected(self, request, queryset)  # the confirmation page
        _, _, perms_needed, protected = self.get_deleted_objects(queryset, request)
        if perms_needed or protected:
            return admin_actions.delete_selected(self, request, queryset)  # refused as Django does
        deleted, refused = 0, []
        for obj in queryset.order_by("pk"):
            try:
                with transaction.atomic():  # the log entry goes with the deletion
                    self.log_deletions(request, [obj])
                    self.delete_one(obj)
                deleted += 1
            except Conflict as exc:
                refused.append(exc.detail)
        if deleted:
            name = self.model._meta.verbose_name if deleted == 1 else self.model._meta.verbose_name_plural
            self.message_user(request, f"Deleted {deleted} {name}.", messages.SUCCESS)
        for refusal in refused:
            self.message_user(request, f"Not deleted: {refusal}", messages.ERROR)
        return None
