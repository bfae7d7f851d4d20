"""Resource pools and classes (SPEC §3).

Rules live in ``clean()`` so the admin and the API report them with the same message; database
constraints back the invariants that a race or a raw write could otherwise break.
"""

import copy
from decimal import Decimal

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.core.validators import MinLengthValidator, MinValueValidator, RegexValidator
from django.db import models, router, transaction
from django.db.models import Q
from django.db.models.expressions import RawSQL
from django.utils.translation import gettext_lazy as _

from apps.resources import remote as remote_rules


class PoolKind(models.TextChoices):
    LOCAL = "local", "Local"
    SLURM = "slurm", "Slurm"
    FIRECREST = "firecrest", "FirecREST"
    RUNAI = "runai", "Run:AI"
    QARNOT = "qarnot", "Qarnot"


SLURM_LIKE = frozenset({PoolKind.SLURM, PoolKind.FIRECREST})


class Strategy(models.TextChoices):
    FIFO = "fifo", "FIFO"
    WEIGHTED_FAIR = "weighted_fair", "Weighted fair (job count / slots)"
    USAGE_FAIR = "usage_fair", "Usage fair (decayed device time per user or group, then per session)"


def fmt(value) -> str:
    """A number as people write it: 8, 0.5 (not 8.000 or 5E-1)."""
    if isinstance(value, (Decimal, float)):
        return f"{Decimal(value).normalize():f}"
    return str(value)


class _CleanEnforcedConstraints:
    """Skip, in ``full_clean()``, the constraints that ``clean()`` already reports in words.

    Without this the admin would show the rule's message and the constraint's message side by
    side. The constraints still guard every write in the database.
    """

    CLEAN_ENFORCED: frozenset[str] = frozenset()

    def validate_constraints(self, exclude=None):
        errors = {}
        using = router.db_for_write(self.__class__, instance=self)
        for constraint in self._meta.constraints:
            if constraint.name in self.CLEAN_ENFORCED:
                continue
            try:
                constraint.validate(self.__class__, self, exclude=exclude, using=using)
            except ValidationError as exc:
                errors = exc.update_error_dict(errors)
        if errors:
            raise ValidationError(errors)


class ResourcePoolQuerySet(models.QuerySet):
    def visible_to(self, user):
        """R-POOL-8: public pools, pools granted to the user or one of their groups; staff see all."""
        if user.is_staff:
            return self
        if not user.is_authenticated:
            return self.none()
        return self.filter(pk__in=RawSQL(*visible_pools_sql(user)))  # noqa: S611 (names from _meta; values are parameters)


def visible_pools_sql(user) -> tuple[str, list]:
    """R-POOL-8, written once: the ids of the pools a signed-in user who is not staff may see and
    use, as a SELECT with its parameters. ``visible_to`` filters on it, and so does session
    admission's hand-written class lookup (``apps.sessions.statements``)::

        SELECT id FROM pool WHERE public
            OR granted to the user OR granted to one of the user's groups
    """
    users = ResourcePool.users.through._meta.db_table
    groups = ResourcePool.groups.through._meta.db_table
    members = get_user_model().groups.through._meta.db_table
    return (
        f"SELECT v.id FROM {ResourcePool._meta.db_table} v WHERE v.public"  # noqa: S608 (names from _meta)
        f" OR EXISTS (SELECT 1 FROM {users} g WHERE g.resourcepool_id = v.id AND g.user_id = %s)"
        f" OR EXISTS (SELECT 1 FROM {groups} pg JOIN {members} m ON m.group_id = pg.group_id"
        f" WHERE pg.resourcepool_id = v.id AND m.user_id = %s)",
        [user.pk, user.pk],
    )


class ResourcePool(_CleanEnforcedConstraints, models.Model):
    """A set of classes on one kind of compute, with optional quota and session capacity."""

    name = models.CharField(max_length=64, unique=True, validators=[MinLengthValidator(1)])
    kind = models.CharField(max_length=16, choices=PoolKind.choices, default=PoolKind.LOCAL)
    public = models.BooleanField(default=False, help_text=_("Usable by every authenticated user."))
    default = models.BooleanField(default=False, help_text=_("The pool users get when they name none."))
    quota_cpu = models.DecimalField("quota CPU", max_digits=10, decimal_places=3, null=True, blank=True)
    quota_memory = models.PositiveIntegerField("quota memory (GB)", null=True, blank=True)
    quota_gpu = models.PositiveIntegerField("quota GPU", null=True, blank=True)
    remote = models.JSONField(
        default=dict,
        blank=True,
        help_text=_("Per-kind configuration (no secrets: name environment variables instead)."),
    )
    slots_total = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text=_("Session capacity in slots; empty means unlimited."),
    )
    slurm_licence = models.CharField(
        "Slurm licence",
        max_length=64,
        blank=True,
        default="",
        validators=[
            RegexValidator(
                r"\A[A-Za-z0-9_.-]+@[A-Za-z0-9_.-]+\Z",
                _("A remote licence as Slurm names it, name@server (e.g. qpu_fresnel@gridgate)."),
            )
        ],
        help_text=_(
            "A Slurm remote licence (name@server, e.g. qpu_fresnel@gridgate) whose count Gridgate keeps equal to "
            "the slots Slurm may hand out: jobs ask for it with sbatch -L and wait for free slots in Slurm's "
            "queue (docs/qrmi.md, 'Slurm licences'). Empty: none."
        ),
    )
    strategy = models.CharField(max_length=16, choices=Strategy.choices, default=Strategy.WEIGHTED_FAIR)
    # -- usage_fair (R-SCHED-6): shares by decayed device time --
    share_by = models.CharField(
        max_length=8,
        choices=[("user", _("User")), ("group", _("Group"))],
        default="user",
        help_text=_(
            "usage_fair: whose decayed device time is compared, each user's or each group's (a user in several "
            "of the pool's groups counts under the first by name; a user granted directly, under their own name)."
        ),
    )
    usage_half_life = models.PositiveIntegerField(
        default=24 * 3600,
        validators=[MinValueValidator(60)],
        help_text=_("usage_fair: seconds after which device time used counts half (default 1 day)."),
    )
    idle_timeout = models.PositiveIntegerField(default=3600, validators=[MinValueValidator(1)], help_text=_("Seconds."))
    max_lifetime = models.PositiveIntegerField(
        default=30 * 24 * 3600, validators=[MinValueValidator(1)], help_text=_("Seconds.")
    )
    is_accessible = models.BooleanField(default=True)
    accessibility_message = models.CharField(max_length=500, blank=True, default="")
    paused_reason = models.CharField(
        "paused (reason)",
        max_length=500,
        blank=True,
        default="",
        help_text=_(
            "Calibration or maintenance: sessions are still admitted and jobs still accepted, but they wait "
            "until this is cleared; QRMI's status() reports the pool paused with this reason. Empty: not paused."
        ),
    )
    # -- how cases run (R-CASE-8) --
    sandbox_unlinked = models.BooleanField(
        "run unlinked users in the sandbox account",
        default=False,
        help_text=_(
            "Local and Slurm cases of users without a linked Unix account run as the dedicated "
            "unprivileged sandbox account (GRIDGATE_SANDBOX_USER) instead of being refused."
        ),
    )
    trusted = models.BooleanField(
        "trusted single-user pool",
        default=False,
        help_text=_(
            "Demo/laptop mode: cases run as the service's own account, with no switch to the user's "
            "account. Never on a public pool: only for a pool granted to the people who own the host."
        ),
    )
    network = models.BooleanField(
        default=False,
        help_text=_(
            "Local cases may reach the network (through slirp4netns; never the worker host's loopback). "
            "Off: the sandbox has only its own loopback. On, a case reaches public addresses; link-local "
            "(169.254.169.254 among them), private (RFC 1918), CGNAT and the worker host's own addresses "
            "are dropped by its egress filter unless listed in 'allowed networks'."
        ),
    )
    allowed_networks = models.TextField(
        blank=True,
        default="",
        help_text=_(
            "Networks (CIDRs, comma- or space-separated) the cases of a pool with the network may reach "
            "although the egress filter drops them otherwise, e.g. a licence server's 10.1.2.3/32."
        ),
    )
    users = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="granted_pools")
    groups = models.ManyToManyField(Group, blank=True, related_name="granted_pools")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    objects = ResourcePoolQuerySet.as_manager()

    CLEAN_ENFORCED = frozenset(
        {
            "resources_pool_single_default",
            "resources_pool_default_is_public_local",
            "resources_pool_quota_valid",
            "resources_pool_trusted_not_public",
        }
    )

    class Meta:
        ordering = ["name", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["default"],
                condition=Q(default=True),
                name="resources_pool_single_default",
                violation_error_message="At most one pool is the default pool.",
            ),
            models.UniqueConstraint(
                fields=["slurm_licence"],
                condition=~Q(slurm_licence=""),
                name="resources_pool_unique_slurm_licence",
                violation_error_message="Another pool already keeps this Slurm licence.",
            ),
            models.CheckConstraint(
                condition=Q(default=False)
                | Q(public=True, kind="local", quota_cpu__isnull=True, quota_memory__isnull=True),
                name="resources_pool_default_is_public_local",
                violation_error_message="The default pool is public, local and has no quota.",
            ),
            models.CheckConstraint(
                condition=Q(quota_cpu__isnull=True, quota_memory__isnull=True, quota_gpu__isnull=True)
                | Q(quota_cpu__gt=0, quota_memory__gt=0, quota_gpu__gte=0),
                name="resources_pool_quota_valid",
                violation_error_message="A quota has cpu > 0, memory > 0 and gpu >= 0.",
            ),
            models.CheckConstraint(
                condition=Q(slots_total__isnull=True) | Q(slots_total__gte=1),
                name="resources_pool_slots_total_positive",
            ),
            # R-CASE-8: a trusted pool runs commands as the service account: never for everyone.
            models.CheckConstraint(
                condition=Q(trusted=False) | Q(public=False),
                name="resources_pool_trusted_not_public",
                violation_error_message="A trusted pool cannot be public (R-CASE-8).",
            ),
        ]

    def __str__(self):
        return self.name

    def save(self, *args, **kwargs):
        adding = self._state.adding
        with transaction.atomic(using=kwargs.get("using")):
            super().save(*args, **kwargs)
            if adding:
                # Admission counts every session in this row: it exists from the pool's first
                # commit (a pool made another way gets it at its first refused admission).
                PoolUsage.objects.using(kwargs.get("using")).get_or_create(pool=self)

    @classmethod
    def from_db(cls, db, field_names, values):
        instance = super().from_db(db, field_names, values)
        # The row as read, which an edit is compared with: R-POOL-3/6 and R-RES-1 run only when
        # what they guard changed (legacy rows that predate a rule stay editable, SPEC R-POOL-4),
        # and an edit writes only what it changed (changed_columns). The JSON column (``remote``)
        # is copied: an edit may change it in place.
        instance._loaded = {
            name: copy.deepcopy(value) if isinstance(value, dict | list) else value
            for name, value in zip(field_names, values, strict=True)
            if name != cls._meta.pk.attname
        }
        return instance

    def changed_columns(self) -> list[str]:
        """The columns this instance changed since it was read (an edit's fields, and what the
        pool's rules completed, such as a quota's gpu; a column not read then, once set), and
        ``updated_at``: what an edit writes. Never the rest of the row as it was read: it may
        have changed since (a load sensor's accessibility, another operator's edit)."""
        read = getattr(self, "_loaded", {})
        changed = [
            f.attname
            for f in self._meta.concrete_fields
            if not f.primary_key
            and f.attname != "updated_at"
            and f.attname in self.__dict__
            and (f.attname not in read or self.__dict__[f.attname] != read[f.attname])
        ]
        return [*changed, "updated_at"]

    # -- derived ---------------------------------------------------------------------------
    @property
    def has_quota(self) -> bool:
        return self.quota_cpu is not None or self.quota_memory is not None

    @property
    def quota(self) -> dict | None:
        if not self.has_quota:
            return None
        return {"cpu": self.quota_cpu, "memory": self.quota_memory, "gpu": self.quota_gpu or 0}

    @property
    def is_slurm_like(self) -> bool:
        return self.kind in SLURM_LIKE

    def remote_config(self) -> dict:
        """``remote`` with the documented defaults filled in (e.g. ``token_env``), and the pool's
        id, by which a credential variable is read only for the pools it is bound to
        (``apps.core.credentials``; never a key a pool's own ``remote`` may hold)."""
        from apps.core.credentials import POOL_KEY

        return {**remote_rules.with_defaults(self.kind, self.remote), POOL_KEY: self.pk}

    def credentials_changed(self) -> bool:
        """Whether whose provider credentials run the cases (``remote.credentials``) changed."""
        loaded = getattr(self, "_loaded", None)
        if not (self.pk and loaded) or self.kind_changed():
            return False
        before = remote_rules.credential_mode(loaded.get("kind"), loaded.get("remote"))
        return before != remote_rules.credential_mode(self.kind, self.remote)

    def has_unfinished_remote_cases(self) -> bool:
        from django.apps import apps

        case = apps.get_model("cases", "Case")
        return case.objects.filter(resource_class__pool=self).in_flight().exists()

    def kind_changed(self) -> bool:
        loaded = getattr(self, "_loaded", None)
        return bool(self.pk and loaded and loaded.get("kind") != self.kind)

    def slots_lowered(self) -> bool:
        loaded = getattr(self, "_loaded", None)
        if not (self.pk and loaded) or self.slots_total is None:
            return False
        return loaded.get("slots_total") is None or self.slots_total < loaded["slots_total"]

    def quota_changed(self) -> bool:
        loaded = getattr(self, "_loaded", None)
        if not (self.pk and loaded):
            return False
        return any(loaded.get(f) != getattr(self, f) for f in ("quota_cpu", "quota_memory", "quota_gpu"))

    # -- rules -----------------------------------------------------------------------------
    def clean(self):
        errors: dict[str, list[str]] = {}
        if self.remote is None:
            self.remote = {}
        if self.name is not None:
            self.name = self.name.strip()
        problems = remote_rules.validate_pool_remote(self.kind, self.remote)
        if problems:
            errors["remote"] = problems
        elif self.credentials_changed() and self.has_unfinished_remote_cases():
            # R-CRED-2: a submitted job belongs to the provider account it was submitted under (a
            # user's own, or the service's); polling it under the other would lose it.
            errors["remote"] = [
                "'credentials' cannot change while cases of this pool are being submitted or run: their jobs "
                "belong to the account they were submitted under. Wait until they end (or cancel them) first."
            ]

        if self.quota_cpu is not None or self.quota_memory is not None or self.quota_gpu is not None:
            if self.quota_gpu is None:
                self.quota_gpu = 0
            if self.quota_cpu is None or self.quota_cpu <= 0:
                errors.setdefault("quota_cpu", []).append("A quota needs a cpu value greater than 0.")
            if self.quota_memory is None or self.quota_memory <= 0:
                errors.setdefault("quota_memory", []).append("A quota needs a memory value (GB) greater than 0.")

        # R-CASE-8: cases of a trusted pool run as the service's own account, so only the people
        # the pool is granted to (the host's owners) may use it.
        if self.trusted and self.public:
            errors.setdefault("trusted", []).append(
                "A trusted pool runs cases as the service's own account: it cannot be public (R-CASE-8). "
                "Grant it to its users instead."
            )
        try:
            self.allowed_networks = ", ".join(str(network) for network in self.egress_exceptions())
        except ValueError as exc:
            errors.setdefault("allowed_networks", []).append(f"{exc}: write networks as CIDRs (10.1.2.0/24).")
        else:
            if self.allowed_networks and not self.network:
                errors.setdefault("allowed_networks", []).append(
                    "Allowed networks only widen the network of a pool whose cases have it: turn 'network' on."
                )
        # A licence counts slots: a pool without slot capacity has nothing to hand out.
        if self.slurm_licence and self.slots_total is None:
            errors.setdefault("slurm_licence", []).append(
                "A Slurm licence counts the pool's slots: set slots_total first (docs/qrmi.md, 'Slurm licences')."
            )
        if self.slots_lowered():
            from apps.reservations.services import check_pool_slots

            try:
                check_pool_slots(self)
            except ValidationError as exc:
                errors.setdefault("slots_total", []).extend(exc.message_dict["slots_total"])
        # R-POOL-1: one default pool, and it is usable by everyone without limits.
        if self.default:
            other = ResourcePool.objects.filter(default=True).exclude(pk=self.pk).first()
            if other is not None:
                errors.setdefault("default", []).append(
                    f"Pool '{other.name}' is already the default pool; at most one pool is the default (R-POOL-1)."
                )
            if not self.public or self.kind != PoolKind.LOCAL or self.has_quota:
                errors.setdefault("default", []).append(
                    "The default pool must be public, local and without quota (R-POOL-1)."
                )
        if errors:
            raise ValidationError(errors)
        if not getattr(self, "_defer_class_checks", False) and self.pk:
            self.clean_classes(list(self.classes.all()))

    def egress_exceptions(self) -> list:
        """The networks of ``allowed_networks`` (ValueError naming a malformed one)."""
        import ipaddress

        networks = []
        for item in (self.allowed_networks or "").replace(",", " ").split():
            try:
                networks.append(ipaddress.ip_network(item))
            except ValueError:
                raise ValueError(f"{item!r} is not a network") from None
        return networks

    def clean_classes(self, classes) -> None:
        """R-POOL-3 and R-POOL-6 against ``classes`` (the stored ones, or a planned set)."""
        errors: dict[str, list[str]] = {}
        if self.quota_changed() and self.has_quota:
            for dim, label in (("cpu", "quota_cpu"), ("memory", "quota_memory"), ("gpu", "quota_gpu")):
                limit = getattr(self, label) or 0
                too_big = [c for c in classes if getattr(c, dim) is not None and getattr(c, dim) > limit]
                if too_big:
                    names = ", ".join(f"{c.name} ({fmt(getattr(c, dim))})" for c in too_big)
                    errors.setdefault(label, []).append(
                        f"The quota {dim} {fmt(limit)} no longer fits these classes: {names} (R-POOL-3)."
                    )
        if self.kind_changed():
            target = self.kind
            if target not in SLURM_LIKE:
                bad = [c.name for c in classes if c.remote]
                if bad:
                    errors.setdefault("kind", []).append(
                        f"Cannot change the kind to {target}: classes {', '.join(bad)} carry a remote "
                        "override, which only Slurm-like pools accept; clear it first or in the same "
                        "request (R-POOL-6)."
                    )
            else:
                if target == PoolKind.SLURM:
                    bad = [c.name for c in classes if c.remote and "system_name" in c.remote]
                    if bad:
                        errors.setdefault("kind", []).append(
                            f"Cannot change the kind to slurm: classes {', '.join(bad)} set system_name, "
                            "which only firecrest pools accept (R-POOL-6)."
                        )
                fractional = [c for c in classes if c.cpu is not None and c.cpu != c.cpu.to_integral_value()]
                if fractional:
                    names = ", ".join(f"{c.name} (cpu {fmt(c.cpu)})" for c in fractional)
                    errors.setdefault("kind", []).append(
                        f"Cannot change the kind to {target}: classes with a fractional cpu: {names}. "
                        "Give them a whole number of CPUs, in the same request if you like (R-POOL-6)."
                    )
        if errors:
            raise ValidationError(errors)


def default_class_message(pool_name: str) -> str:
    return (
        f"Pool '{pool_name}' needs exactly one default class: make this class the default, "
        "or make another class the default first (R-POOL-2)."
    )


class PoolUsage(models.Model):
    """What a pool's active sessions hold (R-SESS-1): its own narrow row, beside the pool's.

    Admission and release change these counters, in the same statement as the sessions they
    count (``apps.sessions.statements``), and serialize on this row's lock. They live apart from
    the pool's row because that row is read as the version of the pool's configuration (a job
    submission checks it, R-SESS-7): a row others rewrite at every admission and release would
    change that version without any change that matters to a submission. The expiry sweep
    recounts them from the sessions and repairs a drift (``repairs``). Plain integers, no CHECK:
    a drift below zero must be repairable, never an error in a release.
    """

    pool = models.OneToOneField(ResourcePool, on_delete=models.CASCADE, primary_key=True, related_name="usage")
    slots_used = models.IntegerField(default=0)
    cpu_used = models.DecimalField("CPU used", max_digits=12, decimal_places=3, default=Decimal(0))
    memory_used = models.IntegerField("memory used (GB)", default=0)
    gpu_used = models.IntegerField("GPU used", default=0)
    repairs = models.IntegerField(default=0, help_text=_("Times the expiry sweep's recount found these counters off."))

    class Meta:
        verbose_name_plural = "pool usage"

    def __str__(self):
        return f"usage of pool {self.pool_id}"


def usage_of(pool: ResourcePool) -> PoolUsage:
    """``pool``'s usage row (fetch it with ``select_related("usage")``), or zeros for a pool that
    has none yet (made by ``bulk_create`` or raw SQL: its first refused admission makes one)."""
    try:
        return pool.usage
    except PoolUsage.DoesNotExist:
        return PoolUsage(pool=pool)


class ResourceClass(_CleanEnforcedConstraints, models.Model):
    """A size within a pool. Its kind is its pool's kind (derived, never stored)."""

    pool = models.ForeignKey(ResourcePool, on_delete=models.CASCADE, related_name="classes")
    name = models.CharField(max_length=64, validators=[MinLengthValidator(1)])
    cpu = models.DecimalField("CPU", max_digits=8, decimal_places=3)
    memory = models.PositiveIntegerField("memory (GB)")
    gpu = models.PositiveIntegerField("GPU", default=0)
    max_storage = models.PositiveIntegerField(
        "max storage (GB)",
        default=1,
        help_text=_("A local case's working directory, and any case's results, never hold more."),
    )
    default_storage = models.PositiveIntegerField("default storage (GB)", default=1)
    # A local case's bounds beside cpu and memory (enforced by apps.backends.privileged).
    max_tasks = models.PositiveIntegerField(
        "max tasks",
        default=512,
        validators=[MinValueValidator(1)],
        help_text=_("Processes and threads a local case may run at once; a fork past it stops the case."),
    )
    wall_time = models.PositiveIntegerField(
        "wall time (s)",
        default=24 * 3600,
        validators=[MinValueValidator(1)],
        help_text=_("Seconds a local case may run unless its launch asks for more (up to the maximum)."),
    )
    max_wall_time = models.PositiveIntegerField(
        "max wall time (s)",
        default=7 * 24 * 3600,
        validators=[MinValueValidator(1)],
        help_text=_("The longest wall time a launch may ask for (the 'time' launch option, in minutes)."),
    )
    default = models.BooleanField(default=False)
    remote = models.JSONField(
        null=True,
        blank=True,
        default=None,
        help_text=_("Slurm-like pools only: system_name (firecrest), partition, forward_resource_values."),
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    CLEAN_ENFORCED = frozenset(
        {
            # Making a class the default demotes the previous default in save(); validating the
            # partial unique constraint first would refuse that switch.
            "resources_class_single_default",
            "resources_class_cpu_positive",
            "resources_class_memory_positive",
            "resources_class_storage_default_within_max",
            "resources_class_wall_time_within_max",
        }
    )

    class Meta:
        ordering = ["pool_id", "name", "id"]
        verbose_name_plural = "resource classes"
        constraints = [
            models.UniqueConstraint(
                fields=["pool", "name"],
                name="resources_class_unique_name_in_pool",
                violation_error_message="A class with this name already exists in this pool.",
            ),
            models.UniqueConstraint(
                fields=["pool"],
                condition=Q(default=True),
                name="resources_class_single_default",
                violation_error_message="A pool has exactly one default class.",
            ),
            models.CheckConstraint(condition=Q(cpu__gt=0), name="resources_class_cpu_positive"),
            models.CheckConstraint(condition=Q(memory__gt=0), name="resources_class_memory_positive"),
            models.CheckConstraint(
                condition=Q(default_storage__lte=models.F("max_storage")),
                name="resources_class_storage_default_within_max",
            ),
            models.CheckConstraint(
                condition=Q(wall_time__gte=1, max_tasks__gte=1, wall_time__lte=models.F("max_wall_time")),
                name="resources_class_wall_time_within_max",
            ),
        ]

    def __str__(self):
        return f"{self.pool.name}/{self.name}" if self.pool_id else self.name

    def save(self, *args, **kwargs):
        with transaction.atomic():
            if self.default and self.pool_id:
                ResourceClass.objects.filter(pool_id=self.pool_id, default=True).exclude(pk=self.pk).update(
                    default=False
                )
            super().save(*args, **kwargs)

    @classmethod
    def from_db(cls, db, field_names, values):
        instance = super().from_db(db, field_names, values)
        instance._loaded_pool_id = instance.__dict__.get("pool_id")
        return instance

    @property
    def kind(self) -> str:
        return self.pool.kind

    def remote_value(self, key: str, default=None):
        return (self.remote or {}).get(key, default)

    @property
    def forward_resource_values(self) -> bool:
        return bool(self.remote_value("forward_resource_values", False))

    def clean(self):
        errors: dict[str, list[str]] = {}
        if self.name is not None:
            self.name = self.name.strip()
        if self.remote == {}:
            self.remote = None
        if self.cpu is not None and self.cpu <= 0:
            errors.setdefault("cpu", []).append("cpu must be greater than 0.")
        if self.memory is not None and self.memory <= 0:
            errors.setdefault("memory", []).append("memory (GB) must be greater than 0.")
        if (
            self.default_storage is not None
            and self.max_storage is not None
            and self.default_storage > self.max_storage
        ):
            errors.setdefault("default_storage", []).append("default_storage cannot exceed max_storage.")
        if self.wall_time is not None and self.max_wall_time is not None and self.wall_time > self.max_wall_time:
            errors.setdefault("wall_time", []).append("wall_time cannot exceed max_wall_time.")
        # A class never moves to another pool: its active sessions carry its pool (admission
        # sums them per pool), the old pool would lose a class (maybe its default) and the new
        # one's default would be demoted. Create the class in the other pool instead.
        loaded = getattr(self, "_loaded_pool_id", None)
        if loaded is not None and self.pool_id != loaded:
            errors.setdefault("pool", []).append(
                "A class cannot move to another pool: create a class in that pool instead."
            )
        pool = self._state.fields_cache.get("pool") or (self.pool if self.pool_id else None)
        if pool is not None:
            self._clean_against_pool(pool, errors)
        if errors:
            raise ValidationError(errors)

    def _clean_against_pool(self, pool: ResourcePool, errors: dict) -> None:
        # R-POOL-3: the class fits the pool's quota.
        if pool.has_quota:
            for dim, limit in (
                ("cpu", pool.quota_cpu),
                ("memory", pool.quota_memory),
                ("gpu", pool.quota_gpu or 0),
            ):
                value = getattr(self, dim)
                if value is not None and limit is not None and value > limit:
                    errors.setdefault(dim, []).append(
                        f"{dim} {fmt(value)} exceeds the quota of pool '{pool.name}' ({fmt(limit)}) (R-POOL-3)."
                    )
        # R-POOL-4: Slurm-like pools allocate whole CPUs. 2.0 is accepted and stored as 2.
        if pool.kind in SLURM_LIKE and self.cpu is not None:
            cpu = Decimal(self.cpu)
            if cpu != cpu.to_integral_value():
                errors.setdefault("cpu", []).append(
                    f"Classes of {pool.kind} pools need a whole number of CPUs (got {fmt(cpu)}) (R-POOL-4)."
                )
            else:
                self.cpu = cpu.to_integral_value()
        # R-POOL-5: remote overrides only for Slurm-like pools; system_name only for FirecREST.
        if self.remote is not None:
            problems = remote_rules.validate_class_remote(self.remote)
            if problems:
                errors.setdefault("remote", []).extend(problems)
            elif pool.kind not in SLURM_LIKE:
                errors.setdefault("remote", []).append(
                    f"Only classes of Slurm-like pools (firecrest, slurm) take a remote override; "
                    f"pool '{pool.name}' is {pool.kind} (R-POOL-5)."
                )
            elif "system_name" in self.remote and pool.kind != PoolKind.FIRECREST:
                errors.setdefault("remote", []).append(
                    f"system_name is only accepted in firecrest pools; pool '{pool.name}' is {pool.kind} (R-POOL-5)."
                )
        # R-POOL-2: exactly one default class. Saving a default demotes the previous one; a
        # non-default class is refused when no other class of the pool is the default. A class
        # set edited as a whole (admin inline, pool PATCH) is checked as a set instead.
        if not self.default and pool.pk and not getattr(self, "_default_checked_as_set", False):
            has_other_default = pool.classes.filter(default=True).exclude(pk=self.pk).exists()
            if not has_other_default:
                errors.setdefault("default", []).append(default_class_message(pool.name))
