from django.contrib import admin, messages

from apps.core.api.exceptions import Conflict
from apps.resources.models import ResourcePool
from apps.scheduling import selectors, services
from apps.scheduling.models import Device, Job, JobStatus


class DeviceInline(admin.TabularInline):
    model = Device
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


PoolAdminBase = type(admin.site._registry[ResourcePool])


class PoolAdminWithDevices(PoolAdminBase):
    inlines = [*PoolAdminBase.inlines, DeviceInline]

    def save_formset(self, request, form, formset, change):
        super().save_formset(request, form, formset, change)
        if formset.model is Device:
            for device in formset.new_objects + [obj for obj, _ in formset.changed_objects]:
                if device.online:
                    services.set_device_online(device, True)


admin.site.unregister(ResourcePool)
admin.site.register(ResourcePool, PoolAdminWithDevices)


@admin.register(Device)
class DeviceAdmin(admin.ModelAdmin):
    list_display = ["name", "pool", "driver", "online", "max_concurrent_jobs", "running_jobs"]
    list_filter = ["driver", "online", "pool"]
    list_select_related = ["pool"]
    search_fields = ["name", "pool__name"]
    actions = ["bring_online", "take_offline"]

    def get_queryset(self, request):
        return selectors.devices_with_load(super().get_queryset(request))

    def has_delete_permission(self, request, obj=None):
        # A device that runs jobs cannot go (see services.delete_device); the admin hides the
        # button rather than failing on the database constraint.
        if obj is not None and Job.objects.filter(device=obj, status=JobStatus.RUNNING).exists():
            return False
        return super().has_delete_permission(request, obj)

    def delete_queryset(self, request, queryset):
        busy = queryset.filter(jobs__status=JobStatus.RUNNING).distinct()
        if busy.exists():
            names = ", ".join(str(d) for d in busy)
            self.message_user(request, f"Not deleted, running jobs: {names}.", messages.ERROR)
        super().delete_queryset(request, queryset.exclude(pk__in=busy.values("pk")))

    @admin.display(description="running", ordering="running_jobs")
    def running_jobs(self, obj):
        return obj.running_jobs

    @admin.action(description="Bring selected devices online")
    def bring_online(self, request, queryset):
        for device in queryset:
            services.set_device_online(device, True)
        self.message_user(request, f"{queryset.count()} device(s) online.", messages.SUCCESS)

    @admin.action(description="Take selected devices offline (running jobs finish)")
    def take_offline(self, request, queryset):
        for device in queryset:
            services.set_device_online(device, False)
        self.message_user(request, f"{queryset.count()} device(s) offline.", messages.SUCCESS)


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ["id", "user", "pool", "session", "device", "status", "shots", "created_at", "finished_at"]
    list_filter = ["status", "pool", ("device", admin.RelatedOnlyFieldListFilter)]
    list_select_related = ["user", "pool", "device", "device__pool", "session", "session__user", "session__pool"]
    search_fields = ["=id", "user__username", "remote_id", "=session__id"]
    date_hierarchy = "created_at"
    readonly_fields = [f.name for f in Job._meta.fields]
    actions = ["cancel_jobs"]

    def has_add_permission(self, request):
        return False  # jobs are submitted in sessions (admission, fair scheduling), not by form

    @admin.action(description="Cancel selected jobs", permissions=["change"])
    def cancel_jobs(self, request, queryset):
        done, refused = 0, 0
        for job in queryset.filter(status__in=[JobStatus.PENDING, JobStatus.RUNNING]):
            try:
                services.cancel_job(job)
                done += 1
            except Conflict:
                refused += 1
        self.message_user(
            request, f"Cancelled or asked to stop {done} job(s); {refused} already ending.", messages.SUCCESS
        )
