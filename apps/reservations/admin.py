from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import Exists, OuterRef

from apps.core.admin_base import ModelAdmin
from apps.reservations import services
from apps.reservations.models import Reservation
from apps.reservations.week import monday_of, week
from apps.resources.models import ResourcePool


class ReservationForm(forms.ModelForm):
    """The window's rules (``clean()``), its holders, and R-RES-1's no overbooking, checked under
    the pool's calendar lock, which the admin's transaction holds until the window is saved."""

    class Meta:
        model = Reservation
        fields = ["pool", "device", "kind", "start", "end", "slots", "title", "users", "groups"]

    def clean(self):
        cleaned = super().clean()
        try:
            services.validate_holders(cleaned.get("kind"), cleaned.get("users") or [], cleaned.get("groups") or [])
        except ValidationError as exc:
            self.add_error(None, exc)
        return cleaned

    def _post_clean(self):
        super()._post_clean()  # the instance is built and its clean() has run
        if self.errors or not self.instance.pool_id:
            return
        try:
            services.lock_calendar(self.instance.pool_id)
            self.instance.clean_overbooking()
        except ValidationError as exc:
            self._update_errors(exc)


@admin.register(Reservation)
class ReservationAdmin(ModelAdmin):
    """The calendar: staff create windows and cancel them (kept, with ``cancelled_at``); the list
    opens on the week's view of every pool's windows."""

    form = ReservationForm
    change_list_template = "admin/reservations/reservation/change_list.html"
    list_display = ["title", "pool", "device", "kind", "start", "end", "slots", "slots_used", "cancelled_at"]
    list_filter = ["kind", "pool", ("cancelled_at", admin.EmptyFieldListFilter)]
    list_select_related = ["pool", "device"]
    search_fields = ["title", "pool__name"]
    filter_horizontal = ["users", "groups"]
    readonly_fields = ["created_by", "created_at", "cancelled_at", "slots_used", "started_at", "slurm_name"]
    date_hierarchy = "start"
    actions = ["cancel"]

    def has_delete_permission(self, request, obj=None):
        return False  # windows are cancelled, not deleted: the calendar keeps its history

    def save_model(self, request, obj, form, change):
        services.save_reservation(
            obj,
            users=form.cleaned_data.get("users", []),
            groups=form.cleaned_data.get("groups", []),
            actor=request.user,
        )

    def save_related(self, request, form, formsets, change):
        pass  # the holders were set by save_reservation, in the same transaction

    @admin.display(description="Slurm reservation")
    def slurm_name(self, obj):
        return obj.slurm_name if obj.pk and obj.pool.slurm_licence else "—"

    @admin.action(description="Cancel the selected windows", permissions=["change"])
    def cancel(self, request, queryset):
        count = 0
        for reservation in queryset.filter(cancelled_at__isnull=True).select_related("pool"):
            services.cancel_reservation(reservation)
            count += 1
        self.message_user(request, f"Cancelled {count} window(s).", messages.SUCCESS)

    def changelist_view(self, request, extra_context=None):
        pools = ResourcePool.objects.order_by("name", "id")
        chosen = request.GET.get("pool__id__exact")
        if chosen and chosen.isascii() and chosen.isdigit():  # "²".isdigit(), and int("²") raises
            pools = pools.filter(pk=int(chosen))
        else:
            # One index probe per pool (reservations_reservation_pool_id), not a join over every
            # window of the past calendar made distinct.
            pools = pools.filter(Exists(Reservation.objects.filter(pool=OuterRef("pk"))))
        monday = monday_of(request.GET.get("week"))
        extra = {"week": week(list(pools[:20]), request.user, monday)}
        return super().changelist_view(request, extra_context={**(extra_context or {}), **extra})

    def get_changelist(self, request, **kwargs):
        changelist = super().get_changelist(request, **kwargs)

        class WithoutWeek(changelist):
            def get_filters_params(self, params=None):
                found = super().get_filters_params(params)
                found.pop("week", None)
                return found

        return WithoutWeek
