from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import Count, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.forms.models import BaseInlineFormSet
from django.utils.html import format_html_join

from apps.core.admin_base import DeletedByService, ModelAdmin
from apps.resources import services
from apps.resources.launch import launch_spec
from apps.resources.models import PoolKind, ResourceClass, ResourcePool, fmt, usage_of


class ClassInlineFormSet(BaseInlineFormSet):
    """Checks the classes of a pool as a set: exactly one default (R-POOL-2), and the pool's
    kind/quota rules (R-POOL-3/6) against the classes as they will be after this save."""

    def _construct_form(self, i, **kwargs):
        form = super()._construct_form(i, **kwargs)
        form.instance._default_checked_as_set = True
        return form

    def clean(self):
        super().clean()
        if any(self.errors):
            return
        planned = [
            form.instance
            for form in self.forms
            if form.cleaned_data and not form.cleaned_data.get("DELETE") and (form.instance.pk or form.has_changed())
        ]
        try:
            services.check_class_set(planned, self.instance.name)
            self.instance.clean_classes(planned)
        except ValidationError as exc:
            raise ValidationError(exc.messages) from None  # formset errors are a flat list


class ResourceClassInline(admin.TabularInline):
    model = ResourceClass
    formset = ClassInlineFormSet
    extra = 0
    fields = [
        "name",
        "cpu",
        "memory",
        "gpu",
        "max_storage",
        "default_storage",
        "max_tasks",
        "wall_time",
        "max_wall_time",
        "default",
        "remote",
    ]


class ResourcePoolAdmin(ModelAdmin):
    """The pool page's own part, with what its active sessions hold (its usage row). Registered
    once, by apps.scheduling.admin, as the subclass that adds the devices inline: resources does
    not import scheduling."""

    list_display = [
        "name",
        "kind",
        "public",
        "default",
        "slots_in_use",
        "strategy",
        "is_accessible",
        "trusted",
        "network",
        "class_count",
    ]
    list_filter = ["kind", "public", "default", "strategy", "is_accessible", "trusted", "network"]
    search_fields = ["name", "accessibility_message"]
    filter_horizontal = ["users", "groups"]
    readonly_fields = ["created_at", "updated_at", "slots_in_use", "quota_in_use", "usage_repairs"]
    list_select_related = ["usage"]
    inlines = [ResourceClassInline]
    fieldsets = [
        (None, {"fields": ["name", "kind", "public", "default", "remote"]}),
        (
            "Capacity",
            {
                "fields": [
                    "quota_cpu",
                    "quota_memory",
                    "quota_gpu",
                    "slots_total",
                    "slurm_licence",
                    "slots_in_use",
                    "quota_in_use",
                    "usage_repairs",
                ]
            },
        ),
        (
            "Sessions and scheduling",
            {"fields": ["strategy", "share_by", "usage_half_life", "idle_timeout", "max_lifetime"]},
        ),
        ("Running cases (R-CASE-8)", {"fields": ["sandbox_unlinked", "trusted", "network", "allowed_networks"]}),
        ("Accessibility", {"fields": ["is_accessible", "accessibility_message", "paused_reason"]}),
        ("Access (private pools)", {"fields": ["users", "groups"]}),
        ("History", {"fields": ["created_at", "updated_at"]}),
    ]

    def get_queryset(self, request):
        # A subquery, not Count("classes"): other apps' admins add their own aggregates, and two
        # joins in one GROUP BY would multiply each other's counts.
        classes = ResourceClass.objects.filter(pool=OuterRef("pk")).order_by().values("pool")
        return (
            super()
            .get_queryset(request)
            .select_related("usage")
            .annotate(_class_count=Coalesce(Subquery(classes.annotate(n=Count("pk")).values("n")), 0))
        )

    @admin.display(description="classes", ordering="_class_count")
    def class_count(self, obj):
        return obj._class_count

    @admin.display(description="slots used / total", ordering="usage__slots_used")
    def slots_in_use(self, obj):
        total = obj.slots_total if obj.slots_total is not None else "∞"
        return f"{usage_of(obj).slots_used} / {total}"

    @admin.display(description="quota used (CPU, memory GB, GPU)")
    def quota_in_use(self, obj):
        if not obj.has_quota:
            return "no quota"
        usage = usage_of(obj)
        held = (fmt(usage.cpu_used), usage.memory_used, usage.gpu_used)
        limits = (fmt(obj.quota_cpu), obj.quota_memory, obj.quota_gpu or 0)
        return ", ".join(f"{used} / {limit}" for used, limit in zip(held, limits, strict=True))

    @admin.display(description="usage repairs")
    def usage_repairs(self, obj):
        return usage_of(obj).repairs

    def get_object(self, request, object_id, from_field=None):
        obj = super().get_object(request, object_id, from_field)
        if obj is not None and request.method == "POST":
            # The edit is checked against the row as it is once locked (another operator's edit
            # commits first, or waits for this one), as the API's: the admin's transaction holds it.
            services.pool_for_edit(obj.pk)
            obj = super().get_object(request, object_id, from_field)
        return obj

    def save_model(self, request, obj, form, change):
        from apps.credentials.services import note_provider_url_change, provider_urls

        before = provider_urls(ResourcePool.objects.get(pk=obj.pk)) if change else None
        if change:  # what the operator changed, never the rest of the row as this request read it
            obj.save(update_fields=obj.changed_columns())
        else:
            super().save_model(request, obj, form, change)
        if before is not None:
            ended = note_provider_url_change(pool=obj, before=before, actor=request.user)
            if ended:
                self.message_user(
                    request,
                    f"The provider URLs of pool '{obj.name}' changed: {ended} user connection(s) were ended and "
                    "their users must reconnect (the change is in the pool's history).",
                    messages.WARNING,
                )
        if obj.network and obj.kind == PoolKind.LOCAL:
            self.message_user(
                request,
                f"Cases of pool '{obj.name}' may reach the network: public addresses, and "
                f"{obj.allowed_networks or 'no private, link-local or worker-host address'} (their egress "
                "filter drops the rest; docs/operations.md, 'Network').",
                messages.WARNING,
            )

    def get_form(self, request, obj=None, **kwargs):
        form = super().get_form(request, obj, **kwargs)
        # The classes inline is on the page only for staff who may see classes (Django leaves it
        # out otherwise): without it, nothing would check the class-dependent rules, and an
        # operator holding only the pool's permissions changed a pool's kind or quota past its
        # classes (R-POOL-3/6), which the API refuses them. They are checked here, against the
        # stored classes, as the API's PATCH without classes does.
        inline = any(isinstance(inline, ResourceClassInline) for inline in self.get_inline_instances(request, obj))

        class PoolForm(form):
            def _post_clean(self):
                # The inline formset checks class-dependent rules against the edited classes,
                # so a kind change and the class fixes it needs can be saved together.
                self.instance._defer_class_checks = inline
                super()._post_clean()

        return PoolForm


@admin.register(ResourceClass)
class ResourceClassAdmin(DeletedByService, ModelAdmin):
    list_display = ["name", "pool", "kind", "cpu", "memory", "gpu", "default"]
    list_filter = ["pool__kind", "default", "pool"]
    list_select_related = ["pool"]
    search_fields = ["name", "pool__name"]
    readonly_fields = ["kind", "launch_specification", "created_at", "updated_at"]

    def get_readonly_fields(self, request, obj=None):
        # A class stays in its pool (ResourceClass.clean says why): shown, not editable.
        fields = super().get_readonly_fields(request, obj)
        return [*fields, "pool"] if obj is not None else fields

    @admin.display(description="kind (from the pool)")
    def kind(self, obj):
        return obj.pool.kind

    @admin.display(description="launch specification")
    def launch_specification(self, obj):
        if not obj.pk:
            return "-"
        spec = launch_spec(obj)
        rows = [("resources", spec["resources"])]
        rows += [(name, value) for name, value in spec["environment"].items()]
        rows += [("#SBATCH", " ".join(spec["batch_directives"]) or "-")]
        return format_html_join("", "<div><code>{}</code>: {}</div>", rows)

    actions = ["delete_selected"]

    def delete_one(self, obj):
        services.delete_class(obj)  # Conflict: the default class goes last (R-POOL-2), as the API's 409

    def save_model(self, request, obj, form, change):
        try:
            super().save_model(request, obj, form, change)
        except ValidationError as exc:  # pragma: no cover - full_clean ran in the form
            self.message_user(request, "; ".join(exc.messages), messages.ERROR)
