"""Operators' view of coordination state: ticker leases and idempotency keys, read-only, with an
action to release what is stuck."""

from axes import admin as axes_admin
from axes.models import AccessAttempt
from django.contrib import admin
from django.contrib.auth import admin as auth_admin
from django.contrib.auth.models import Group
from django.utils import timezone
from django_q import admin as django_q_admin
from django_q.models import Failure, Schedule, Success

from apps.core.admin_base import FieldValues, ModelAdmin
from apps.core.models import IdempotencyKey, Lease, WorkerHeartbeat

# The other apps' pages with an add form read what is typed by the same rule as ours (django-q2's
# schedule page answered 500 on ``?next_run=``). Their other pages add nothing.
admin.site.unregister(Group)
admin.site.unregister(Schedule)
# Their bulk actions name no permission, and Django offers such an action to every staff user who
# may merely view the list: re-running any past worker task with its stored arguments, or clearing
# login-failure records, needs the permission to change (delete) them, like our own actions.
admin.site.unregister(Success)
admin.site.unregister(Failure)
admin.site.unregister(AccessAttempt)


@admin.register(Group)
class GroupAdmin(FieldValues, auth_admin.GroupAdmin):
    pass


@admin.register(Schedule)
class ScheduleAdmin(FieldValues, django_q_admin.ScheduleAdmin):
    pass


@admin.action(description="Resubmit selected tasks to queue", permissions=["change"])
def resubmit_task(model_admin, request, queryset):
    return django_q_admin.resubmit_task(model_admin, request, queryset)


@admin.register(Success)
class SuccessAdmin(django_q_admin.TaskAdmin):
    actions = [resubmit_task]


@admin.register(Failure)
class FailureAdmin(django_q_admin.FailAdmin):
    actions = [resubmit_task]


@admin.register(AccessAttempt)
class AccessAttemptAdmin(axes_admin.AccessAttemptAdmin):
    @admin.action(description="Clean up expired attempts", permissions=["delete"])
    def cleanup_expired_attempts(self, request, queryset):
        return super().cleanup_expired_attempts(request, queryset)


class ReadOnlyAdmin(ModelAdmin):
    """Rows written by the system: seen, filtered, released by an action, never edited by hand."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class HeldFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "held"

    def lookups(self, request, model_admin):
        return [("yes", "held (not expired)"), ("no", "expired")]

    def queryset(self, request, queryset):
        now = timezone.now()
        if self.value() == "yes":
            return queryset.filter(expires_at__gt=now)
        if self.value() == "no":
            return queryset.filter(expires_at__lte=now)
        return queryset


@admin.register(WorkerHeartbeat)
class WorkerHeartbeatAdmin(ReadOnlyAdmin):
    """One row per worker host. A host retired for good keeps its row, which /metrics reports as
    an ever older heartbeat (the "worker dead" alert): delete the row here."""

    list_display = ["name", "seen_at", "age"]
    search_fields = ["name"]

    @admin.display(description="seconds since")
    def age(self, obj):
        return int((timezone.now() - obj.seen_at).total_seconds())


@admin.register(Lease)
class LeaseAdmin(ReadOnlyAdmin):
    list_display = ["name", "owner", "expires_at", "held"]
    list_filter = [HeldFilter]
    search_fields = ["name", "owner"]
    actions = ["expire_now"]

    @admin.display(boolean=True)
    def held(self, obj):
        return obj.expires_at > timezone.now()

    @admin.action(description="Expire the selected leases now (another worker takes over)", permissions=["delete"])
    def expire_now(self, request, queryset):
        count = queryset.filter(expires_at__gt=timezone.now()).update(expires_at=timezone.now())
        self.message_user(request, f"{count} lease(s) expired; the next worker tick takes them over.")


class KeyStateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return [("answered", "answered"), ("in_flight", "in flight"), ("stuck", "in flight, lease expired")]

    def queryset(self, request, queryset):
        if self.value() == "answered":
            return queryset.filter(response_status__isnull=False)
        if self.value() == "in_flight":
            return queryset.filter(response_status__isnull=True)
        if self.value() == "stuck":
            return stuck_keys(queryset)
        return queryset


def stuck_keys(queryset):
    from django.db.models import Q

    return queryset.filter(response_status__isnull=True).filter(
        Q(locked_until__isnull=True) | Q(locked_until__lte=timezone.now())
    )


@admin.register(IdempotencyKey)
class IdempotencyKeyAdmin(ReadOnlyAdmin):
    list_display = ["key", "user", "response_status", "created_at", "locked_until"]
    list_filter = [KeyStateFilter, "response_status"]
    list_select_related = ["user"]
    search_fields = ["key", "user__username"]
    date_hierarchy = "created_at"
    exclude = ["response_body"]
    readonly_fields = ["user", "key", "fingerprint", "response_status", "locked_until", "created_at", "answer"]
    actions = ["release_in_flight"]

    @admin.display(description="stored answer")
    def answer(self, obj):
        return obj.response_body

    @admin.action(
        description="Release the selected in-flight keys (the client's retry runs afresh)", permissions=["delete"]
    )
    def release_in_flight(self, request, queryset):
        # Answered keys are kept: they are what a retry must get back. Only unanswered ones go.
        count, _ = queryset.filter(response_status__isnull=True).delete()
        self.message_user(request, f"{count} in-flight key(s) released; answered keys were kept.")
