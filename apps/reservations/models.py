"""The QPU calendar (SPEC §11): reservations and maintenance windows on a pool or one device.

A window is configuration, edited by staff; what is derived from it is derived where it is read,
from the clock, and never written on a timer: admission reads the open reservations in its own
statement (``apps.sessions.statements``), the dispatcher and the pool's status read the open
windows (``apps.reservations.selectors``), the licence sync mirrors the windows to Slurm
(``apps.licences``). The one counter on a window, ``slots_used`` (the slots its holders' sessions
hold of it), is written only by the admission and revocation statements, never by ``save()``.
"""

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.core.validators import MinLengthValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from apps.core.models import KeepsWorkerColumns
from apps.resources.models import ResourcePool, fmt
from apps.scheduling.models import Device


class WindowKind(models.TextChoices):
    RESERVATION = "reservation", "Reservation (slots held for its holders)"
    MAINTENANCE = "maintenance", "Maintenance (the pool or device is paused)"


class ReservationQuerySet(models.QuerySet):
    def live(self):
        """Not cancelled."""
        return self.filter(cancelled_at__isnull=True)

    def open_at(self, at):
        """Live windows that hold at ``at`` (start <= at < end)."""
        return self.live().filter(start__lte=at, end__gt=at)

    def overlapping(self, start, end):
        """Live windows that share an instant with [start, end)."""
        return self.live().filter(start__lt=end, end__gt=start)

    def peak(self, start, end=None) -> tuple[int, object, list[str]]:
        """The most slots these live reservations hold together at one instant of [start, end)
        (no ``end``: from ``start`` on), the first such instant, and the titles of those holding
        then: counted at ``start`` and at each reservation's start within the span."""
        rows = self.live().filter(kind=WindowKind.RESERVATION, end__gt=start)
        if end is not None:
            rows = rows.filter(start__lt=end)
        rows = list(rows.values_list("start", "end", "slots", "title"))
        peak, at, names = 0, start, []
        for instant in sorted({start, *(max(row[0], start) for row in rows)}):
            held = [(slots, title) for first, last, slots, title in rows if first <= instant < last]
            total = sum(slots for slots, _title in held)
            if total > peak:
                peak, at, names = total, instant, [title for _slots, title in held]
        return peak, at, names

    def held_by(self, user):
        """Reservations ``user`` holds, directly or through a group: the ids from the holder tables
        (their indexes on the user and the group), so a user's list reads their own windows, not
        every window of the calendar's past joined to its holders and made distinct."""
        direct = Reservation.users.through.objects.filter(user=user).values("reservation_id")
        through_groups = Reservation.groups.through.objects.filter(group__user=user).values("reservation_id")
        return self.filter(pk__in=direct.union(through_groups))


def holder_sql(window: str) -> tuple[str, int]:
    """Whether a user holds the reservation ``window`` (an SQL alias), directly or through one of
    their groups, as SQL taking the user's id twice; written once for admission's statement and the
    start of a window (``apps.sessions.statements``)::

        EXISTS (user is one of the window's users) OR EXISTS (a group of the user is one of its groups)
    """
    users = Reservation.users.through._meta.db_table
    groups = Reservation.groups.through._meta.db_table
    members = get_user_model().groups.through._meta.db_table
    return (
        f"(EXISTS (SELECT 1 FROM {users} ru WHERE ru.reservation_id = {window}.id AND ru.user_id = %s)"  # noqa: S608
        f" OR EXISTS (SELECT 1 FROM {groups} rg JOIN {members} m ON m.group_id = rg.group_id"
        f" WHERE rg.reservation_id = {window}.id AND m.user_id = %s))",
        2,
    )


class Reservation(KeepsWorkerColumns, models.Model):
    """A window of the calendar: slots of a pool held for holders (``reservation``), or the pool
    or one of its devices paused (``maintenance``), from ``start`` to ``end``. Cancelled windows
    are kept (``cancelled_at``), as the calendar's history."""

    pool = models.ForeignKey(ResourcePool, on_delete=models.CASCADE, related_name="reservations")
    device = models.ForeignKey(
        Device,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="reservations",
        help_text=_("One device of the pool; empty for the whole pool."),
    )
    kind = models.CharField(max_length=16, choices=WindowKind.choices, default=WindowKind.RESERVATION)
    start = models.DateTimeField()
    end = models.DateTimeField()
    slots = models.PositiveIntegerField(
        default=0,
        help_text=_("Reservation: the pool's slots held for its holders. Maintenance holds none (it pauses)."),
    )
    title = models.CharField(max_length=200, validators=[MinLengthValidator(1)])
    users = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="reservations")
    groups = models.ManyToManyField(Group, blank=True, related_name="reservations")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", editable=False
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    cancelled_at = models.DateTimeField(null=True, blank=True, editable=False)
    # Admission's counter: the slots of this window its holders' sessions hold (each session
    # records its part, ``Session.reserved_slots``). Written only by apps.sessions.statements
    # under the row's lock; ``save()`` leaves it alone.
    slots_used = models.IntegerField(default=0, editable=False)
    # When the start of the window made room for its holders (apps.reservations.passes); cleared
    # when staff change what it holds, so that the next tick makes room again.
    started_at = models.DateTimeField(null=True, blank=True, editable=False)

    objects = ReservationQuerySet.as_manager()

    class Meta:
        ordering = ["start", "id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(end__gt=models.F("start")),
                name="reservations_end_after_start",
                violation_error_message="A window ends after it starts.",
            ),
            models.CheckConstraint(
                condition=Q(kind="reservation", slots__gte=1) | Q(kind="maintenance", slots=0),
                name="reservations_slots_by_kind",
                violation_error_message="A reservation holds at least one slot; a maintenance window none.",
            ),
        ]
        indexes = [
            # Admission's lookup of a pool's open reservations (apps.sessions.statements), the
            # dispatcher's and the status's open windows, the schedule: a pool's live windows that
            # have not ended, whatever the pool's past calendar.
            models.Index(fields=["pool", "end"], condition=Q(cancelled_at__isnull=True), name="reservations_live_end"),
            # The tick's windows to start and a refused admission's probe for one: only the windows
            # not started yet (the tick marks every window it passes, of either kind).
            models.Index(
                fields=["pool", "start"],
                condition=Q(cancelled_at__isnull=True, started_at__isnull=True),
                name="reservations_to_start",
            ),
            # Meta.ordering: the admin's calendar list and the staff's GET /reservations/ read a
            # page from it, not the whole past calendar sorted at each view.
            models.Index(fields=["start", "id"], name="reservations_list"),
        ]

    CLEAN_ENFORCED = frozenset({"reservations_end_after_start", "reservations_slots_by_kind"})

    def __str__(self):
        where = f"{self.pool.name}/{self.device.name}" if self.device_id else (self.pool.name if self.pool_id else "?")
        return f"{self.title} ({self.kind}, {where})"

    #: the counter admission keeps, its start's mark, and the cancel (``services.cancel_reservation``
    #: alone sets it): a change that read the window live and saves after a cancel committed must
    #: not bring the cancelled window back
    WORKER_COLUMNS = ("slots_used", "started_at", "cancelled_at")

    def validate_constraints(self, exclude=None):
        errors = {}
        for constraint in self._meta.constraints:
            if constraint.name in self.CLEAN_ENFORCED:
                continue
            try:
                constraint.validate(self.__class__, self, exclude=exclude)
            except ValidationError as exc:
                errors = exc.update_error_dict(errors)
        if errors:
            raise ValidationError(errors)

    @property
    def is_maintenance(self) -> bool:
        return self.kind == WindowKind.MAINTENANCE

    @property
    def slurm_name(self) -> str:
        """The name of the Slurm reservation that mirrors this window (R-RES-3): named after its
        pool's licence as well as its id, so that two Gridgate databases mirroring into one Slurm
        (two sites, a test instance beside production) never take each other's reservation."""
        return f"gridgate_{self.pool.slurm_licence.split('@', 1)[0]}_{self.pk}"

    def holds_at(self, at) -> bool:
        return self.cancelled_at is None and self.start <= at < self.end

    def clean(self):
        """R-RES-1: a window ends after it starts; a reservation holds 1 to ``slots_total`` slots
        of a pool that counts slots, a maintenance window none; a device is one of the pool's.
        Overbooking (other windows) is checked by :meth:`clean_overbooking`, which the service runs
        under the pool's calendar lock."""
        errors: dict[str, list[str]] = {}
        if self.title is not None:
            self.title = self.title.strip()
            if not self.title:
                errors.setdefault("title", []).append("A window needs a title (users see it).")
        if self.start and self.end and self.end <= self.start:
            errors.setdefault("end", []).append("The window must end after it starts.")
        pool = self._state.fields_cache.get("pool") or (
            ResourcePool.objects.filter(pk=self.pool_id).first() if self.pool_id else None
        )
        if self.device_id and pool is not None:
            device = self._state.fields_cache.get("device") or Device.objects.filter(pk=self.device_id).first()
            if device is not None and device.pool_id != pool.pk:
                errors.setdefault("device", []).append(f"Device '{device.name}' is not a device of pool '{pool.name}'.")
        if self.kind == WindowKind.MAINTENANCE:
            self.slots = 0
        elif pool is not None:
            if pool.slots_total is None:
                errors.setdefault("pool", []).append(
                    f"Pool '{pool.name}' counts no slots (slots_total is empty): set it before reserving slots."
                )
            elif self.slots is None or not 1 <= self.slots <= pool.slots_total:
                errors.setdefault("slots", []).append(
                    f"A reservation holds 1 to {pool.slots_total} slots (the pool's slots_total)."
                )
        if errors:
            raise ValidationError(errors)

    def clean_overbooking(self) -> None:
        """R-RES-1: the reservations on one pool never hold more than its ``slots_total`` at any
        instant: the peak of the live reservations overlapping this one, counted at each start
        within it, plus this one's slots."""
        if self.kind != WindowKind.RESERVATION or self.cancelled_at is not None or not (self.start and self.end):
            return
        pool = ResourcePool.objects.filter(pk=self.pool_id).first()
        if pool is None or pool.slots_total is None:
            return
        peak, at, names = (
            Reservation.objects.filter(pool_id=self.pool_id).exclude(pk=self.pk).peak(self.start, self.end)
        )
        if peak + self.slots > pool.slots_total:
            raise ValidationError(
                {
                    "slots": [
                        f"Pool '{pool.name}' would be overbooked: at {at:%Y-%m-%d %H:%M} UTC, "
                        f"{', '.join(repr(name) for name in names)} already hold {fmt(peak)} of its "
                        f"{pool.slots_total} slots; this reservation asks {self.slots} (R-RES-1)."
                    ]
                }
            )
