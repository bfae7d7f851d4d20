from django import forms
from django.contrib import admin, messages
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from apps.backends.registry import BACKENDS
from apps.backends.services import check_launch_options
from apps.cases import services, workspace
from apps.cases.models import TERMINAL, UNFINISHED, Campaign, Case, CaseEvent
from apps.core.admin_base import DeletedByService, ModelAdmin
from apps.core.exceptions import Conflict, ServiceError
from apps.core.text import printable
from apps.resources.selectors import can_use_pool

#: files listed on a case's change page; the API pages through the rest
ADMIN_FILES = 200


class CaseEventInline(admin.TabularInline):
    model = CaseEvent
    extra = 0
    can_delete = False
    fields = ["at", "kind", "from_status", "to_status", "message", "options"]
    readonly_fields = fields
    ordering = ["at", "id"]

    def has_add_permission(self, request, obj=None):
        return False


class BackendFilter(admin.SimpleListFilter):
    """The backends this site knows (Django's own filter read a DISTINCT over every case ever
    recorded at each view of the list)."""

    title = "backend"
    parameter_name = "backend"

    def lookups(self, request, model_admin):
        return [(name, name) for name in sorted(BACKENDS)]

    def queryset(self, request, queryset):
        return queryset.filter(backend=self.value()) if self.value() else queryset


class RunHostFilter(admin.SimpleListFilter):
    """The worker hosts running unfinished cases (the partial index ``cases_case_unfinished``
    serves it), and the host asked for: never a DISTINCT over the whole history."""

    title = "run host"
    parameter_name = "run_host"

    def lookups(self, request, model_admin):
        hosts = set(
            Case.objects.filter(status__in=UNFINISHED)  # the index's own condition
            .exclude(run_host="")
            .order_by()
            .values_list("run_host", flat=True)
            .distinct()
        )
        if self.value():
            hosts.add(self.value())
        return [(host, host) for host in sorted(hosts)]

    def queryset(self, request, queryset):
        return queryset.filter(run_host=self.value()) if self.value() else queryset


class CaseAdminForm(forms.ModelForm):
    class Meta:
        model = Case
        fields = "__all__"  # noqa: DJ007 - the admin's fieldsets and read-only fields choose

    def clean(self):
        """R-BACK-6 in the admin too: a prepared case's launch options (and its class) go through
        the one allow-list the API uses, so an edit cannot store what a launch would refuse."""
        data = super().clean()
        if "launch_options" in self.fields and data.get("resource_class") is not None:
            owner = data.get("owner") or (self.instance.owner if self.instance.owner_id else None)
            # R-POOL-8, as create_case checks it: the owner may use the class's pool.
            if owner is not None and not can_use_pool(owner, data["resource_class"].pool):
                self.add_error("resource_class", f"{owner} may not use this class's pool (R-POOL-8).")
                return data
            try:
                chosen = data.get("launch_options") or {}
                data["launch_options"] = check_launch_options(data["resource_class"], chosen, owner)
            except ServiceError as exc:
                self.add_error("launch_options", str(exc.detail))
        return data


@admin.register(Case)
class CaseAdmin(DeletedByService, ModelAdmin):
    form = CaseAdminForm
    list_display = ["name", "owner", "status", "backend", "remote_id", "progress", "submitted_at", "finished_at"]
    list_filter = ["status", BackendFilter, "results_fetched", "resource_class__pool", RunHostFilter]
    list_select_related = ["owner", "resource_class__pool"]
    search_fields = ["name", "remote_id", "remote_identity", "owner__username", "command"]
    date_hierarchy = "created_at"
    inlines = [CaseEventInline]
    actions = ["cancel_cases"]
    readonly_fields = [
        "id",
        "status",
        "backend",
        "remote_id",
        "progress",
        "execution_time",
        "cores",
        "created_at",
        "launch_requested_at",
        "submitted_at",
        "started_at",
        "finished_at",
        "last_polled_at",
        "last_synced_at",
        "poll_failures",
        "last_error",
        "status_message",
        "remote_identity",
        "results_fetched",
        "next_poll_at",
        "next_sync_at",
        "lease_owner",
        "lease_until",
        "run_host",
        "cancel_requested_at",
        "workspace_files",
    ]
    fieldsets = [
        (None, {"fields": ["id", "name", "owner", "campaign", "resource_class", "command"]}),
        (
            "Launch",
            {
                "fields": [
                    "launch_options",
                    "observability_globs",
                    "backend",
                    "remote_id",
                    "remote_identity",
                    "status",
                    "status_message",
                ]
            },
        ),
        ("Progress", {"fields": ["progress", "execution_time", "cores", "results_fetched", "workspace_files"]}),
        (
            "Timeline",
            {"fields": ["created_at", "launch_requested_at", "submitted_at", "started_at", "finished_at"]},
        ),
        (
            "Worker bookkeeping",
            {
                "classes": ["collapse"],
                "fields": [
                    "last_polled_at",
                    "last_synced_at",
                    "poll_failures",
                    "last_error",
                    "next_poll_at",
                    "next_sync_at",
                    "lease_owner",
                    "lease_until",
                    "run_host",
                    "cancel_requested_at",
                ],
            },
        ),
    ]

    def has_add_permission(self, request):
        # Cases are made by their owners through create_case (workspace, 'created' event, backend,
        # R-POOL-8, R-BACK-6), never by form.
        return False

    def save_model(self, request, obj, form, change):
        # R-CASE-2: the workers write the rest of the row (status, remote id, bookkeeping) and
        # write back only over what they read: this page (which adds none) writes only what it
        # edited, and the launch options clean() checked again for a new class or owner.
        fields = set(form.changed_data)
        if fields & {"resource_class", "owner"} and "launch_options" in form.fields:
            fields.add("launch_options")
        obj.save(update_fields=fields)

    #: what a launched case ran with: its account (R-CASE-8), class and command are history, and
    #: editing them would make the record lie about what ran (and as whom).
    LAUNCHED_READONLY = ["owner", "resource_class", "command", "launch_options", "campaign"]

    def get_readonly_fields(self, request, obj=None):
        fields = list(super().get_readonly_fields(request, obj))
        if obj is not None and obj.is_launched:
            fields += [name for name in self.LAUNCHED_READONLY if name not in fields]
        return fields

    @admin.display(description="files")
    def workspace_files(self, obj):
        if not obj.pk:
            return "-"
        listing = workspace.file_listing(workspace.case_dir(obj.id))
        entries = workspace.file_entries(listing, listing.paths[:ADMIN_FILES])
        if not entries:
            return "no files yet"
        # Names are the command's: shown escaped, linked percent-encoded.
        rows = format_html_join(
            "",
            '<div><a href="{}">{}</a> ({} bytes)</div>',
            (
                (
                    reverse("case-file", kwargs={"pk": obj.pk, "path": entry["path"]}),
                    printable(entry["path"]),
                    entry["size"],
                )
                for entry in entries
            ),
        )
        more = len(listing.paths) - len(entries)
        notes = [f"and {more} more (GET /api/v1/cases/{obj.pk}/files/ pages through them all)"] if more > 0 else []
        if listing.unlisted:
            notes.append(f"{listing.unlisted} file(s) not listed: their names are not UTF-8 text")
        return format_html("{}{}", rows, format_html_join("", "<div>{}</div>", ((note,) for note in notes)))

    def has_delete_permission(self, request, obj=None):
        # An unfinished case is cancelled, not deleted (services.deletable): the page answers 403.
        if obj is not None and not services.deletable(Case.objects.filter(pk=obj.pk)).exists():
            return False
        return super().has_delete_permission(request, obj)

    def delete_one(self, obj):
        # Its launch asked for since the page was shown: kept, and neither logged nor reported deleted.
        if not services.delete_cases(Case.objects.filter(pk=obj.pk)):
            raise Conflict(f"case {obj.name} is unfinished (cancel it first).")

    # ``change``: without ``permissions`` Django offers an action to whoever may merely view the list.
    @admin.action(description="Cancel the selected cases (same service as the API)", permissions=["change"])
    def cancel_cases(self, request, queryset):
        done, refused = 0, []
        for case in queryset.select_related("resource_class__pool"):
            try:
                services.cancel_case(case)
                done += 1
            except Exception as exc:  # Conflict (already ended) or backend unavailable
                refused.append(f"{case.name}: {getattr(exc, 'detail', exc)}")
        if done:
            self.message_user(request, f"Cancelled {done} case(s).", messages.SUCCESS)
        if refused:
            self.message_user(request, format_html("Not cancelled: {}", "; ".join(refused)), messages.WARNING)


@admin.register(Campaign)
class CampaignAdmin(DeletedByService, ModelAdmin):
    list_display = ["name", "owner", "created_at"]
    search_fields = ["name", "owner__username"]
    list_select_related = ["owner"]
    readonly_fields = ["id", "created_at"]

    def get_readonly_fields(self, request, obj=None):
        # A campaign stays its owner's, as in the API: its cases are its owner's (Case.clean), and
        # another user could add shared inputs that they read.
        fields = super().get_readonly_fields(request, obj)
        return [*fields, "owner"] if obj is not None else fields

    def has_delete_permission(self, request, obj=None):
        """Deleting a campaign is refused while it has unfinished cases (SPEC §6): the delete page
        answers 403 instead of swallowing the refusal and then reporting a deletion."""
        if obj is not None and obj.cases.exclude(status__in=list(TERMINAL)).exists():
            return False
        return super().has_delete_permission(request, obj)

    def get_actions(self, request):
        # The bulk delete cannot refuse per campaign (and reports every one deleted): no bulk delete.
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    def get_deleted_objects(self, objs, request):
        # Finished cases are detached from the campaign (they keep their own workspaces), not
        # deleted: the campaign is the only object the confirmation lists.
        return [str(obj) for obj in objs], {Campaign._meta.verbose_name_plural: len(objs)}, set(), []

    def delete_one(self, obj):
        # The same service as the API; it checks again under the campaign's lock, and a case
        # prepared in the campaign since this page's check is a refusal, not a 500.
        services.delete_campaign(obj)
