import time

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import ValidationError
from django.db.models import Count, OuterRef, Subquery
from django.db.models.functions import Coalesce

from apps.core.admin_base import DeletedByService, ModelAdmin
from apps.core.exceptions import Conflict
from apps.core.tasks import enqueue
from apps.licences.models import LicenceState
from apps.reservations.models import Reservation
from apps.resources.admin import ResourcePoolAdmin
from apps.resources.models import ResourcePool
from apps.scheduling import device_status, eta, selectors, services, shares
from apps.scheduling.devices import FIELDS, validate_driver_settings
from apps.scheduling.models import UNFINISHED, Device, DriverRun, FairShare, Job, JobStatus, OpenBatch, PoolQueue


class DeviceForm(forms.ModelForm):
    """The device's driver rules (apps.scheduling.devices), on the device page and the pool's
    devices inline alike."""

    def clean(self):
        cleaned = super().clean()
        # A field that failed its own validation is reported as it is; the driver's rules are
        # checked once the values they depend on parse.
        if not any(self.has_error(name) for name in FIELDS):
            try:
                validate_driver_settings(cleaned, self.instance)
            except ValidationError as exc:
                self.add_error(None, exc)
        return cleaned


class DeviceFormSet(forms.BaseInlineFormSet):
    """The pool page's devices inline deletes through the same rule as the device's own page and
    the API (services.busy_devices): a device in use is refused, with its name, not deleted."""

    def clean(self):
        super().clean()
        doomed = [form.instance.pk for form in self.deleted_forms if form.instance.pk]
        busy = services.busy_devices(Device.objects.filter(pk__in=doomed)) if doomed else []
        if busy:
            names = ", ".join(str(device) for device in busy)
            raise ValidationError(f"Not deleted, running jobs or pending jobs asked for them: {names}.")

    def delete_existing(self, obj, commit=True):
        # clean() read the jobs without a lock: the dispatcher may have handed the device a job
        # since. The service checks again holding the pool's queue row; a device it refuses stays,
        # out of the page's change message, and PoolAdmin.save_formset says so.
        if not commit:
            return
        try:
            services.delete_device(obj)
        except Conflict as exc:
            self.deleted_objects.remove(obj)
            self.refused = [*getattr(self, "refused", []), exc.detail]


class DeviceInline(admin.TabularInline):
    model = Device
    form = DeviceForm
    formset = DeviceFormSet
    extra = 0
    fields = ["name", "driver", "config", "online", "max_concurrent_jobs", "running_jobs", "pending_jobs"]
    readonly_fields = ["running_jobs", "pending_jobs"]

    def get_queryset(self, request):
        return selectors.devices_with_load(super().get_queryset(request))

    @admin.display(description="running")
    def running_jobs(self, obj):
        return getattr(obj, "running_jobs", 0)

    @admin.display(description="pending (it could take)")
    def pending_jobs(self, obj):
        return getattr(obj, "pending_jobs", 0)


@admin.register(ResourcePool)
class PoolAdmin(ResourcePoolAdmin):
    """The pool page, composed here and registered once (STYLE rule 9): the resources app's pool,
    classes and usage, and this app's devices inline."""

    inlines = [*ResourcePoolAdmin.inlines, DeviceInline]
    # As DELETE /api/v1/resource-pools/{id}/ takes them (a window is cancelled by hand, not deleted).
    deleted_with = (PoolQueue, DriverRun, OpenBatch, Reservation, LicenceState)
    actions = [*ResourcePoolAdmin.actions, "recompute_usage"]
    readonly_fields = [*ResourcePoolAdmin.readonly_fields, "eta_calibration"]
    fieldsets = [*ResourcePoolAdmin.fieldsets, ("Expected starts (R-JOB-5)", {"fields": ["eta_calibration"]})]

    @admin.display(description="calibration of the expected start")
    def eta_calibration(self, obj):
        """How the bound shown to the pool's last dispatched jobs held (promised: 9 times in 10),
        how often they started by the median shown (promised: half), and the correction of the
        bound the ETA learned from them (``eta.learn``); read afresh, one query."""
        if obj.pk is None:
            return "—"
        found = eta.learn(selectors.recorded_starts([obj.pk]).get(obj.pk, []))
        if not found.starts:
            return "no dispatched job with a recorded expected start yet"
        text = (
            f"over the last {found.starts} recorded starts, the bound shown held {found.coverage:.0%} of the time "
            f"(promised 90 %) and {found.early:.0%} started by the median shown (promised 50 %)"
        )
        if found.starts < eta.CORRECTION_MIN:
            return f"{text}; no correction before {eta.CORRECTION_MIN} starts"
        return f"{text}; the bound now ×{found.p90:.2f}, the {found.level:.0%} quantile of the last starts"

    @admin.action(
        description="Recompute users' and groups' usage from the job history (usage_fair)", permissions=["change"]
    )
    def recompute_usage(self, request, queryset):
        now = time.time()
        for pool in queryset.filter(strategy="usage_fair"):
            counted = shares.recompute(pool, now)
            self.message_user(request, f"{pool.name}: usage rebuilt from {counted} job(s).", messages.SUCCESS)

    def save_formset(self, request, form, formset, change):
        super().save_formset(request, form, formset, change)
        for refusal in getattr(formset, "refused", []):
            self.message_user(request, f"Not deleted: {refusal}", messages.ERROR)
        if formset.model is Device:
            for device in formset.new_objects + [obj for obj, _ in formset.changed_objects]:
                if device.online:
                    services.set_device_online(device, True)


@admin.register(Device)
class DeviceAdmin(DeletedByService, ModelAdmin):
    form = DeviceForm
    deleted_with = (DriverRun, OpenBatch, Reservation)  # as services.delete_device takes them
    list_display = [
        "name",
        "pool",
        "driver",
        "online",
        "paused_reason",
        "provider_status",
        "provider_checked_at",
        "max_concurrent_jobs",
        "running_jobs",
    ]
    list_filter = ["driver", "online", "provider_status", "pool"]
    list_select_related = ["pool"]
    search_fields = ["name", "pool__name"]
    # Written by the worker's status pass (real QPUs), never by hand.
    readonly_fields = [
        "provider_status",
        "provider_message",
        "provider_checked_at",
        "provider_specs",
        "provider_specs_text",
    ]
    actions = ["delete_selected", "bring_online", "take_offline", "check_provider_status"]

    def get_queryset(self, request):
        return selectors.devices_with_load(super().get_queryset(request))

    def has_delete_permission(self, request, obj=None):
        # A device that runs jobs cannot go (see services.delete_device); the admin hides the
        # button rather than failing on the database constraint.
        if obj is not None and services.busy_devices(Device.objects.filter(pk=obj.pk)).exists():
            return False
        return super().has_delete_permission(request, obj)

    # Every delete path goes through services.delete_device, which checks busy_devices holding the
    # pool's queue row (as the dispatcher does): the page's check above ran without a lock, and a
    # job handed to the device since then would make a plain DELETE fail (IntegrityError, a 500).
    def delete_one(self, obj):
        services.delete_device(obj)

    @admin.display(description="running", ordering="running_jobs")
    def running_jobs(self, obj):
        return obj.running_jobs

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if obj.online and (not change or "online" in form.changed_data):
            services.set_device_online(obj, True)  # R-SCHED-5: dispatch on "device back online"

    @admin.action(description="Bring selected devices online", permissions=["change"])
    def bring_online(self, request, queryset):
        for device in queryset:
            services.set_device_online(device, True)
        self.message_user(request, f"{queryset.count()} device(s) online.", messages.SUCCESS)

    @admin.action(description="Take selected devices offline (running jobs finish)", permissions=["change"])
    def take_offline(self, request, queryset):
        for device in queryset:
            services.set_device_online(device, False)
        self.message_user(request, f"{queryset.count()} device(s) offline.", messages.SUCCESS)

    # Every bulk action changes devices (the status check writes what the provider says): without
    # ``permissions`` Django offers an action to whoever may merely view the list.
    @admin.action(
        description="Ask the provider for the status of selected devices now (worker)", permissions=["change"]
    )
    def check_provider_status(self, request, queryset):
        ids = list(queryset.filter(driver__in=device_status.PROVIDER_DRIVERS).values_list("id", flat=True))
        for device_id in ids:
            enqueue("apps.scheduling.tasks.check_device_status", device_id)
        self.message_user(request, f"Status check queued for {len(ids)} device(s).", messages.SUCCESS)


class JobChangeList(ChangeList):
    """Computes why each pending job of the page waits, for the whole page at once (constant
    queries: ``selectors.queue_info``), and leaves the answer on the row objects."""

    def get_results(self, request):
        super().get_results(request)
        info = selectors.queue_info(list(self.result_list))
        for job in self.result_list:
            job.queue_info = info.get(job.pk)


@admin.register(Job)
class JobAdmin(ModelAdmin):
    # Narrow enough for 1440 px: the session's UUID is searchable and on the job's page, not a column.
    list_display = ["id", "user", "pool", "device", "status", "waiting_because", "shots", "created_at", "finished_at"]
    # Every device (a handful): "only those that ran a job" was a DISTINCT over the whole job history.
    list_filter = ["status", "pool", "device"]
    list_select_related = ["user", "pool", "device", "device__pool", "session", "session__user", "session__pool"]
    search_fields = ["=id", "user__username", "remote_id", "=session__id"]
    date_hierarchy = "created_at"
    readonly_fields = [f.name for f in Job._meta.fields]
    actions = ["cancel_jobs"]

    def has_add_permission(self, request):
        return False  # jobs are submitted in sessions (admission, fair scheduling), not by form

    def save_model(self, request, obj, form, change):
        # Every field is read-only (submission, the dispatcher and the workers write them):
        # "Save" writes nothing back over what they wrote since this request read the row.
        pass

    def get_changelist(self, request, **kwargs):
        return JobChangeList

    @admin.display(description="waiting because")
    def waiting_because(self, obj):
        info = getattr(obj, "queue_info", None)
        if not info:
            return "—"
        text = f"{info.reason} (#{info.position})" if info.position else info.reason
        if info.eta_seconds is None:
            return text
        return f"{text}, starts in about {info.eta_seconds:.0f} s (± {info.eta_error_seconds:.0f} s)"

    def has_delete_permission(self, request, obj=None):
        # An unfinished job is cancelled, not deleted (services.deletable_jobs): the page answers 403.
        if obj is not None and not services.deletable_jobs(Job.objects.filter(pk=obj.pk)).exists():
            return False
        return super().has_delete_permission(request, obj)

    def delete_queryset(self, request, queryset):
        kept = queryset.count() - services.deletable_jobs(queryset).count()
        if kept:
            self.message_user(request, f"Not deleted: {kept} unfinished job(s) (cancel them first).", messages.ERROR)
        super().delete_queryset(request, services.deletable_jobs(queryset))

    @admin.action(description="Cancel selected jobs", permissions=["change"])
    def cancel_jobs(self, request, queryset):
        done, refused = 0, 0
        for job in queryset.filter(status__in=UNFINISHED):
            try:
                services.cancel_job(job)
                done += 1
            except Conflict:
                refused += 1
        self.message_user(
            request, f"Cancelled or asked to stop {done} job(s); {refused} already ending.", messages.SUCCESS
        )


@admin.register(PoolQueue)
class PoolQueueAdmin(ModelAdmin):
    """Read-only: one row per pool whose lock serializes its dispatch; operators read when the pool
    last dispatched and how much waits, to spot a stuck queue."""

    list_display = ["pool", "last_dispatch_at", "pending", "running"]
    list_select_related = ["pool"]
    list_filter = ["pool__kind"]
    search_fields = ["pool__name"]

    def get_queryset(self, request):
        # Counted in the list's one query (no N+1); a correlated count per status touches only the
        # pool's unfinished jobs (partial indexes), never its finished history.
        def count(status):
            jobs = Job.objects.filter(pool=OuterRef("pool_id"), status=status).order_by()
            return Coalesce(Subquery(jobs.values("pool").annotate(n=Count("id")).values("n")[:1]), 0)

        return (
            super()
            .get_queryset(request)
            .annotate(n_pending=count(JobStatus.PENDING), n_running=count(JobStatus.RUNNING))
        )

    @admin.display(ordering="n_pending")
    def pending(self, obj):
        return obj.n_pending

    @admin.display(ordering="n_running")
    def running(self, obj):
        return obj.n_running

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class ReadOnlyAdmin(ModelAdmin):
    """What the workers write and operators only read."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class RunStatusFilter(admin.SimpleListFilter):
    """The states the drivers write (``apps/scheduling/drivers``): Django's own filter read a
    DISTINCT over every run kept at each view of the list. Another value still filters by URL."""

    title = "status"
    parameter_name = "status"
    STATES = (
        "prepared",
        "submitting",
        "unsent",
        "submitted",
        "queued",
        "running",
        "completed",
        "failed",
        "cancelled",
    )

    def lookups(self, request, model_admin):
        return [(state, state) for state in self.STATES]

    def queryset(self, request, queryset):
        return queryset.filter(status=self.value()) if self.value() else queryset


@admin.register(DriverRun)
class DriverRunAdmin(ReadOnlyAdmin):
    """Read-only: the built-in drivers' runs (emulator, fake). Operators read here which worker
    started an emulation last, how many times (a worker that died is re-run: docs/operations.md,
    "Recovery") and its last heartbeat."""

    list_display = ["remote_id", "device", "status", "attempts", "worker", "heartbeat_at", "started_at", "finished_at"]
    list_select_related = ["device"]
    list_filter = [RunStatusFilter, "device__driver"]
    search_fields = ["remote_id", "worker", "external_id", "batch_id"]
    readonly_fields = [f.name for f in DriverRun._meta.fields]


@admin.register(OpenBatch)
class OpenBatchAdmin(ReadOnlyAdmin):
    """Read-only: the Pasqal Cloud batches kept open for sessions that stream jobs
    (``open_batches``); the worker closes each when its session ends."""

    list_display = ["batch_id", "device", "session", "creator", "opened_at", "closed_at"]
    list_select_related = ["device"]
    list_filter = ["device"]
    search_fields = ["batch_id", "creator"]
    readonly_fields = [f.name for f in OpenBatch._meta.fields]


@admin.register(FairShare)
class FairShareAdmin(ModelAdmin):
    """usage_fair's shares (R-SCHED-6): operators set a user's or group's weight on a pool (add
    one before they ever ran); the decayed device time is the scheduler's, shown as of now."""

    list_display = ["pool", "user", "group", "weight", "usage_now", "vtime"]
    list_select_related = ["pool", "user", "group"]
    list_filter = ["pool"]
    list_editable = ["weight"]
    search_fields = ["user__username", "group__name", "pool__name"]
    autocomplete_fields = ["user", "group"]
    fields = ["pool", "user", "group", "weight", "usage_now", "usage", "usage_at", "vtime"]
    readonly_fields = ["usage_now", "usage", "usage_at", "vtime"]

    def save_model(self, request, obj, form, change):
        if not change:
            return super().save_model(request, obj, form, change)
        # The dispatcher keeps usage, catch_up, queued and vtime (a read-modify-write per job
        # served): this page and the list write only what they edited (the weight).
        obj.save(update_fields=form.changed_data)

    @admin.display(description="decayed device time now (s)")
    def usage_now(self, obj):
        if obj.pk is None:
            return "—"
        return f"{shares.decayed(obj.usage, obj.usage_at, time.time(), obj.pool.usage_half_life):.1f}"
