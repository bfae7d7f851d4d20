"""Sessions: a user's claim on a pool's capacity (SPEC §4)."""

import uuid
from decimal import Decimal

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from apps.resources.models import ResourceClass, ResourcePool


class SessionStatus(models.TextChoices):
    ACTIVE = "active", "Active"
    REVOKED = "revoked", "Revoked"


class RevocationReason(models.TextChoices):
    RELEASED = "released", "Released by owner or service"
    MANUAL = "manual", "Revoked by staff"
    IDLE_TIMEOUT = "idle_timeout", "Idle timeout"
    MAX_LIFETIME = "max_lifetime", "Maximum lifetime reached"
    # R-RES-1: revoked at a reservation's start to free the slots it holds for its holders.
    RESERVATION = "reservation", "Made room for a reservation"
    # R-POOL-8: the owner may no longer use the pool (a grant withdrawn, the pool made private,
    # the account deactivated).
    ACCESS = "access", "Access to the pool withdrawn"


class SessionQuerySet(models.QuerySet):
    def active(self):
        return self.filter(status=SessionStatus.ACTIVE)

    def visible_to(self, user):
        """Own sessions; staff and service principals see all."""
        if is_service_principal(user):
            return self
        return self.filter(user=user)


def is_service_principal(user) -> bool:
    """Staff, or a user holding ``act_on_behalf`` (e.g. the SPANK plugin's account)."""
    return bool(user and user.is_authenticated and (user.is_staff or user.has_perm("compute_sessions.act_on_behalf")))


class Session(models.Model):
    """A claim on a pool: ``slots`` of its capacity and one class's resources.

    The UUID is the acquisition token handed to the client (QRMI's session id).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of its own: sessions_user_created leads with it.
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="compute_sessions", db_index=False
    )
    resource_class = models.ForeignKey(ResourceClass, on_delete=models.PROTECT, related_name="sessions")
    # Denormalized from the class: admission sums active sessions per pool under the pool lock.
    pool = models.ForeignKey(ResourcePool, on_delete=models.PROTECT, related_name="sessions")
    slots = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1)])
    # What the session holds of its pool's quota: its class's resources when it was admitted. The
    # pool's usage counters add them at admission and take the same amounts back when it ends,
    # whatever happens to the class meanwhile (R-SESS-1).
    cpu = models.DecimalField(max_digits=10, decimal_places=3, default=Decimal(0), editable=False)
    memory = models.PositiveIntegerField(default=0, editable=False)
    gpu = models.PositiveIntegerField(default=0, editable=False)
    external_id = models.CharField(
        max_length=128, blank=True, default="", help_text="Scheduler job id (e.g. Slurm's), for idempotency."
    )
    status = models.CharField(max_length=16, choices=SessionStatus.choices, default=SessionStatus.ACTIVE)
    created_at = models.DateTimeField(default=timezone.now)
    last_activity_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    idle_expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    revocation_reason = models.CharField(max_length=16, choices=RevocationReason.choices, blank=True, default="")
    # R-RES-1: the part of ``slots`` held of a reservation's slots (its holder's session, admitted
    # during the window or attributed at its start); the window's ``slots_used`` counts it and
    # gets it back when the session ends. Empty for every other session.
    reservation = models.ForeignKey(
        "reservations.Reservation",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="sessions",
        db_index=False,  # sessions_reservation: only the sessions that hold part of one
        editable=False,
    )
    reserved_slots = models.PositiveIntegerField(default=0, editable=False)
    # R-ALLOC-1: the allocation (project) this session's jobs spend, chosen when it opens; empty
    # on a pool with no allocations (unlimited) or for a user with no project there.
    allocation = models.ForeignKey(
        "allocations.Allocation",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="sessions",
        db_index=False,  # sessions_allocation: only the sessions that spend one
        editable=False,
    )
    vruntime = models.FloatField(default=0.0, help_text="Fair-scheduler virtual runtime.")
    launch_spec = models.JSONField(default=dict, help_text="The class's launch specification at creation.")

    objects = SessionQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "id"]
        permissions = [("act_on_behalf", "Can create, list and release sessions on behalf of other users")]
        constraints = [
            # R-SESS-2 backstop: one active session per (user, pool, scheduler job), whatever the
            # path; a batch job may hold one on each of several pools. Admission's same-job lookup
            # is a probe of this index (apps/sessions/statements.py).
            models.UniqueConstraint(
                fields=["user", "pool", "external_id"],
                condition=Q(status="active") & ~Q(external_id=""),
                name="sessions_unique_active_external_id",
                violation_error_message="An active session already exists for this external id on this pool.",
            ),
            models.CheckConstraint(condition=Q(slots__gte=1), name="sessions_slots_positive"),
            models.CheckConstraint(
                condition=Q(status="active", revoked_at__isnull=True) | Q(status="revoked", revoked_at__isnull=False),
                name="sessions_revoked_at_matches_status",
            ),
        ]
        indexes = [
            # The expiry sweep's recount of each pool's usage (apps.sessions.statements).
            models.Index(fields=["pool", "slots"], condition=Q(status="active"), name="sessions_active_pool"),
            # Admission's "anything due in this pool?" probe and the expiry sweep (partial: only
            # active sessions are ever due). Not idle_expires_at: every job submission renews it,
            # and a renewed column that an index holds makes PostgreSQL write a new entry into
            # every index of the table instead of updating the row in place (a HOT update);
            # the probe (only when a request would not fit) and the sweep read a pool's active
            # sessions through this index and check the idle deadline on the rows.
            models.Index(fields=["pool", "expires_at"], condition=Q(status="active"), name="sessions_active_expires"),
            # weighted_fair/usage_fair dispatch: active sessions of a pool by (vruntime, age, id).
            models.Index(
                fields=["pool", "vruntime", "created_at", "id"],
                condition=Q(status="active"),
                name="sessions_active_vruntime",
            ),
            # Lists: staff and service principals see all sessions, newest first.
            models.Index(fields=["-created_at", "id"], name="sessions_created"),
            # A reservation's sessions (its recount, a window's deletion); most sessions hold none.
            models.Index(fields=["reservation"], condition=Q(reservation__isnull=False), name="sessions_reservation"),
            # Lists: own sessions, newest first.
            models.Index(fields=["user", "-created_at", "id"], name="sessions_user_created"),
            # An allocation's sessions (its deletion's SET NULL); most sessions spend none.
            models.Index(fields=["allocation"], condition=Q(allocation__isnull=False), name="sessions_allocation"),
            # Accounting and the utilization charts: the sessions alive in a period are the active
            # ones (sessions_active_pool) and those revoked since its start (this one), not every
            # session created before its end. Partial: admission writes no entry here.
            models.Index(fields=["revoked_at"], condition=Q(revoked_at__isnull=False), name="sessions_revoked"),
        ]

    def __str__(self):
        return f"{self.id} ({self.user} on {self.pool.name if self.pool_id else '?'}, {self.status})"

    @property
    def is_active(self) -> bool:
        return self.status == SessionStatus.ACTIVE

    @property
    def slot_seconds(self) -> float:
        end = self.revoked_at or timezone.now()
        return max((end - self.created_at).total_seconds(), 0.0) * self.slots
