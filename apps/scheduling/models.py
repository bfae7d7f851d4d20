"""Devices, jobs and the scheduler's state (SPEC §5)."""

from django.conf import settings
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q

from apps.core.models import KeepsWorkerColumns
from apps.resources.models import ResourcePool
from apps.sessions.models import Session


class DriverName(models.TextChoices):
    FAKE = "fake", "Fake (scripted, for tests)"
    EMULATOR = "emulator", "Pulser emulator (QutipEmulator)"
    PASQAL_QPU = "pasqal_qpu", "Pasqal QPU (on-premise QPU API)"
    PASQAL_CLOUD = "pasqal_cloud", "Pasqal Cloud (pasqal-cloud SDK)"


class ProviderStatus(models.TextChoices):
    UNKNOWN = "", "Not checked yet"
    UP = "up", "Up"
    DOWN = "down", "Down"
    UNREACHABLE = "unreachable", "Unreachable"


class Device(KeepsWorkerColumns, models.Model):
    """Something that runs jobs for a pool: a QPU, or an emulator standing in for one."""

    pool = models.ForeignKey(ResourcePool, on_delete=models.CASCADE, related_name="devices")
    name = models.CharField(max_length=64)
    driver = models.CharField(max_length=16, choices=DriverName.choices, default=DriverName.EMULATOR)
    config = models.JSONField(default=dict, blank=True, help_text="Driver settings (no secrets).")
    online = models.BooleanField(default=True)
    paused_reason = models.CharField(
        "paused (reason)",
        max_length=500,
        blank=True,
        default="",
        help_text="Calibration or maintenance: the device takes no job until this is cleared (jobs wait). "
        "Empty: not paused.",
    )
    max_concurrent_jobs = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1)])
    # Written by the worker's status pass for drivers with a provider (pasqal_qpu, pasqal_cloud):
    # the device is online only while its provider reports it up, and its specs are the
    # provider's (SPEC §5). Never asked during a request.
    provider_status = models.CharField(max_length=16, choices=ProviderStatus.choices, blank=True, default="")
    provider_message = models.CharField(max_length=500, blank=True, default="")
    provider_checked_at = models.DateTimeField(null=True, blank=True)
    provider_specs = models.JSONField(null=True, blank=True, help_text="The provider's Pulser device, as last read.")
    provider_specs_text = models.TextField(
        blank=True, default="", help_text="The same specs exactly as the provider sent them (QRMI passes them through)."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["pool_id", "name", "id"]
        constraints = [
            models.UniqueConstraint(fields=["pool", "name"], name="scheduling_device_unique_name"),
            models.CheckConstraint(condition=Q(max_concurrent_jobs__gte=1), name="scheduling_device_capacity"),
            # A Pasqal QPU runs one job at a time: submitting a second drops the running one.
            models.CheckConstraint(
                condition=~Q(driver="pasqal_qpu") | Q(max_concurrent_jobs=1),
                name="scheduling_device_qpu_one_job",
                violation_error_message="A pasqal_qpu device runs one job at a time (max_concurrent_jobs = 1).",
            ),
        ]

    def __str__(self):
        return f"{self.pool.name}/{self.name}" if self.pool_id else self.name

    #: written by the worker's status pass alone (``device_status.record_status``)
    WORKER_COLUMNS = (
        "provider_status",
        "provider_message",
        "provider_checked_at",
        "provider_specs",
        "provider_specs_text",
    )

    def save(self, *args, **kwargs):
        super().save(*args, **kwargs)
        self._loaded_online = self.online

    def kept_columns(self) -> set[str]:
        # ``online`` too, unless the edit changed it: renaming a device must not bring a QPU the
        # status pass took offline meanwhile back online.
        kept = super().kept_columns()
        if self.online == getattr(self, "_loaded_online", None):
            kept.add("online")
        return kept

    @classmethod
    def from_db(cls, db, field_names, values):
        instance = super().from_db(db, field_names, values)
        instance._loaded_online = instance.__dict__.get("online")
        return instance

    def credential_config(self) -> dict:
        """``config`` with the device's pool, by which its credential variables are read only
        where ``<NAME>_POOLS`` binds them to that pool (``apps.core.credentials``)."""
        from apps.core.credentials import POOL_KEY

        return {**(self.config or {}), POOL_KEY: self.pool_id}

    def clean(self):
        # The driver's own rules (its config keys, its concurrency cap) are checked by
        # apps.scheduling.devices for the admin form and the API: models never import drivers.
        if self.config is None:
            self.config = {}
        if not isinstance(self.config, dict):
            raise ValidationError({"config": "Must be a JSON object."})


class JobStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    # The answer to its submission was lost and the provider cannot say whether it created the
    # job: it was not sent again, so that it never runs twice. An operator looks it up on the
    # provider's side (its tag: Job.run_tag) and submits it again if it never ran.
    UNKNOWN = "unknown", "Unknown (ask an operator)"


UNFINISHED = frozenset({JobStatus.PENDING, JobStatus.RUNNING})
TERMINAL = frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.UNKNOWN})


class Job(models.Model):
    """A unit of work submitted inside a session and dispatched to one device."""

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="jobs")
    # Denormalized from the session: the dispatcher and the lists filter on them.
    # Indexed by jobs_pool_created (pool first), not by a column index of its own.
    pool = models.ForeignKey(ResourcePool, on_delete=models.PROTECT, related_name="jobs", db_index=False)
    # No index of its own: jobs_user_created leads with it (each index is one more write per job
    # inserted).
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="jobs", db_index=False)
    payload = models.JSONField()
    shots = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    target_device = models.ForeignKey(
        Device,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="targeted_jobs",
        help_text="Run only on this device (else any online device of the pool).",
        db_index=False,  # jobs_target_device: only the jobs that name one
    )
    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.PENDING)
    device = models.ForeignKey(
        Device, null=True, blank=True, on_delete=models.SET_NULL, related_name="jobs", db_index=False
    )  # jobs_device: only the jobs that were handed to one
    remote_id = models.CharField(max_length=128, blank=True, default="")
    created_at = models.DateTimeField()
    scheduled_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    logs = models.TextField(blank=True, default="")
    runtime_seconds = models.FloatField(null=True, blank=True)
    # Worker bookkeeping.
    attempts = models.PositiveIntegerField(default=0, help_text="Transient submission failures so far.")
    not_before = models.DateTimeField(null=True, blank=True, help_text="Back-off after a transient failure.")
    next_poll_at = models.DateTimeField(null=True, blank=True)
    # A worker's claim (hand-over to the device, or one poll pass): who holds it, until when. The
    # claim's writes compare the owner, so a worker whose claim lapsed and was taken over never
    # hands the job over a second time (a second paid QPU job).
    lease_owner = models.CharField(max_length=100, blank=True, default="")
    lease_until = models.DateTimeField(null=True, blank=True)
    charged = models.BooleanField(default=False, help_text="usage_fair: device time charged to the session.")
    # R-JOB-5: the expected start recorded once while it waits (``passes.record_predictions``),
    # the model's own figures before any correction, and the correction of the bound shown then;
    # the dispatch compares them with the actual start (``scheduled_at``), and the pool's last
    # starts teach the ETA its correction (``apps.scheduling.eta.learn``).
    eta_recorded_at = models.DateTimeField(null=True, blank=True)
    eta_recorded_seconds = models.FloatField(null=True, blank=True, help_text="Median wait expected, uncorrected.")
    eta_p90_recorded_seconds = models.FloatField(
        null=True, blank=True, help_text="Wait beaten 90 % of the time, uncorrected."
    )
    eta_p90_factor = models.FloatField(null=True, blank=True, help_text="Correction of the bound shown then.")
    eta_p90_level = models.FloatField(
        null=True, blank=True, help_text="The quantile that correction was learned at (eta.learn)."
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=Q(shots__gte=1), name="scheduling_job_shots_positive"),
            models.CheckConstraint(
                condition=~Q(status="running") | Q(device__isnull=False), name="scheduling_running_has_device"
            ),
        ]
        indexes = [
            # fifo next job, and queue position: oldest pending job of a pool.
            models.Index(fields=["pool", "created_at", "id"], condition=Q(status="pending"), name="jobs_pending_pool"),
            # The ETA's correction: a pool's last dispatched jobs with a recorded expected start
            # (apps.scheduling.selectors.recorded_starts).
            models.Index(
                fields=["pool", "-scheduled_at"],
                condition=Q(eta_recorded_at__isnull=False, scheduled_at__isnull=False),
                name="jobs_eta_recorded_pool",
            ),
            # weighted/usage fair: "does this session have a pending job" and its oldest one.
            models.Index(
                fields=["session", "created_at", "id"], condition=Q(status="pending"), name="jobs_pending_session"
            ),
            # Device load: running jobs per device (capacity check at dispatch).
            models.Index(fields=["device"], condition=Q(status="running"), name="jobs_running_device"),
            # Poll pass: running jobs of a pool due for a poll.
            models.Index(fields=["pool", "next_poll_at"], condition=Q(status="running"), name="jobs_running_poll"),
            # R-SCHED-3 FIFO within a session: "is this session's queue in back-off?" (a transient
            # driver error put its head job there). Tiny: only pending jobs in back-off.
            models.Index(
                fields=["session", "not_before"],
                condition=Q(status="pending", not_before__isnull=False),
                name="jobs_backoff_session",
            ),
            # Idle-expiry busy check: unfinished jobs of a session.
            models.Index(
                fields=["session"], condition=Q(status__in=["pending", "running"]), name="jobs_unfinished_session"
            ),
            # Lists: staff see all jobs, newest first.
            models.Index(fields=["-created_at", "-id"], name="jobs_created"),
            # Lists: own jobs, newest first.
            models.Index(fields=["user", "-created_at", "-id"], name="jobs_user_created"),
            # A pool's jobs (and the foreign key's checks), and those submitted lately (the ETA's
            # arrival rates): in place of the pool column's own index, so no extra write.
            models.Index(fields=["pool", "created_at"], name="jobs_pool_created"),
            # A device's jobs (and its deletion's SET NULL): partial, so a job inserted without a
            # device writes no entry here; most jobs never name a target device.
            models.Index(fields=["device"], condition=Q(device__isnull=False), name="jobs_device"),
            models.Index(fields=["target_device"], condition=Q(target_device__isnull=False), name="jobs_target_device"),
            # The utilization charts (apps.accounting.selectors.utilization): jobs dispatched in a
            # period, and the device time held in it (dispatched jobs unfinished or finished since
            # its start), not every job dispatched before its end. Partial on dispatched jobs: a
            # submission writes no entry; the dispatch, which already rewrites the row's entries,
            # adds one to each.
            models.Index(fields=["scheduled_at"], condition=Q(scheduled_at__isnull=False), name="jobs_dispatched"),
            models.Index(
                fields=["finished_at"], condition=Q(scheduled_at__isnull=False), name="jobs_dispatched_finished"
            ),
        ]

    def __str__(self):
        return f"job {self.pk} ({self.status})"

    @property
    def is_finished(self) -> bool:
        return self.status in TERMINAL


class DriverRun(models.Model):
    """State of one execution on a built-in driver (fake, emulator): what a real QPU's own
    queue would hold. The core learns about it only through ``driver.poll``.

    For provider drivers (pasqal_qpu, pasqal_cloud) it is the submission's intent, written
    before the request is sent (``remote_id`` = Gridgate's stable run id, ``status``
    ``submitting``), then the provider's id once its answer arrives (``external_id``): a
    submission whose answer was lost is recognised on the next try and never sent blindly again.
    """

    remote_id = models.CharField(max_length=128, primary_key=True)
    external_id = models.CharField(max_length=128, blank=True, default="", help_text="The provider's id of the run.")
    batch_id = models.CharField(
        max_length=128, blank=True, default="", help_text="The open batch the run is added to (pasqal_cloud)."
    )
    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="runs")
    payload = models.JSONField()
    shots = models.PositiveIntegerField()
    status = models.CharField(max_length=16, default="queued")
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    logs = models.TextField(blank=True, default="")
    runtime_seconds = models.FloatField(null=True, blank=True)
    polls = models.PositiveIntegerField(default=0)
    cancel_requested = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True, help_text="When the device began the run.")
    heartbeat_at = models.DateTimeField(
        null=True, blank=True, help_text="Last sign of life of the worker running it (emulator)."
    )
    finished_at = models.DateTimeField(null=True, blank=True)
    # Emulator recovery (emulator.recover_runs): how many times a worker started the run (a run
    # found dead after MAX_ATTEMPTS starts is failed, not re-run), and when and how often its task
    # was last sent to the broker (a queued run nobody started is sent again).
    attempts = models.PositiveIntegerField(default=0, help_text="Times a worker started the run (emulator).")
    worker = models.CharField(
        max_length=100, blank=True, default="", help_text="The worker process that started it last (host:pid)."
    )
    enqueued_at = models.DateTimeField(null=True, blank=True, help_text="Last time its task was sent (emulator).")
    sent_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When its submission last left for the provider (pasqal_qpu: a lost answer is judged from it).",
    )
    enqueues = models.PositiveIntegerField(default=0, help_text="Sends of its task since it was last queued.")

    class Meta:
        ordering = ["created_at", "remote_id"]
        indexes = [
            # emulator.recover_runs, every few seconds: the live runs only.
            models.Index(fields=["status"], condition=Q(status__in=["queued", "running"]), name="driverruns_live"),
            # Meta.ordering: the admin's list reads a page from it (not every run kept, sorted), and
            # cleanup's runs older than the retention are a range of it.
            models.Index(fields=["created_at", "remote_id"], name="driverruns_list"),
            # pasqal_cloud, a job added to an open batch: the batch's runs already recorded.
            models.Index(fields=["batch_id"], condition=~Q(batch_id=""), name="driverruns_batch"),
        ]

    def __str__(self):
        return f"{self.remote_id} ({self.status})"


class OpenBatch(models.Model):
    """A Pasqal Cloud batch left open for one session's jobs on one device (the pasqal_cloud
    driver's ``open_batches``): each job of the session is added to it, and it is closed when the
    session ends. ``batch_id`` is blank while the job that creates it (``creator``) awaits
    the provider's answer."""

    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="open_batches")
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="open_batches")
    batch_id = models.CharField(max_length=128, blank=True, default="", help_text="The provider's id of the batch.")
    creator = models.CharField(max_length=128, help_text="The run (DriverRun id) that creates the batch.")
    opened_at = models.DateTimeField(auto_now_add=True)
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["device", "session"], condition=Q(closed_at__isnull=True), name="openbatch_one_per_session"
            ),
        ]

    def __str__(self):
        return f"{self.batch_id or 'batch being created'} (session {self.session_id})"


class PoolQueue(models.Model):
    """One row per pool: its lock serializes dispatch for that pool, separately from the pool
    row that admission locks, so admissions never delay dispatch. Submission never locks it."""

    pool = models.OneToOneField(ResourcePool, on_delete=models.CASCADE, primary_key=True, related_name="queue")
    last_dispatch_at = models.DateTimeField(null=True, blank=True)
    # R-SCHED-2: the pool's virtual time V, never decreasing: at each dispatch V = max(V, the
    # served session's vruntime before its charge). A session that becomes runnable starts at
    # max(its vruntime, V), so an arrival into an empty queue takes no burst of turns.
    vtime = models.FloatField(default=0.0, help_text="Virtual time of the fair strategies (R-SCHED-2).")
    # Coalesced wake-up (R-SCHED-5): True when the last dispatch pass left a device free with
    # nothing to run. Only then does a submission wake the dispatcher (once: it clears the flag
    # with a compare-and-set); while devices are busy, the job-finished event dispatches.
    awaiting_work = models.BooleanField(
        default=True, help_text="A device was left free with nothing to run: the next submission wakes the dispatcher."
    )
    # R-SCHED-6 (usage_fair): the virtual time of the level across users or groups, in decayed
    # device seconds per unit of weight as of ``share_vtime_at`` (Unix time); it decays as usage does.
    share_vtime = models.FloatField(default=0.0, help_text="usage_fair: virtual time across users or groups.")
    share_vtime_at = models.FloatField(default=0.0, help_text="Unix time ``share_vtime`` is given at.")

    class Meta:
        ordering = ["pool_id"]

    def __str__(self):
        return f"queue of {self.pool_id}"


class LatencyKind(models.TextChoices):
    QUEUE_WAIT = "queue_wait", "Queue wait (submitted → dispatched)"
    DISPATCH = "dispatch", "Dispatch (dispatched → accepted by the device)"
    # Not seconds: a dispatched job's wait over the bound it was shown (``eta_p90_seconds``);
    # the share of observations at or below 1 is the bound's coverage.
    ETA_BOUND = "eta_bound", "Wait over its expected bound (eta_p90_seconds)"


class JobLatencyBucket(models.Model):
    """One bucket of a per-pool latency histogram, counted when the event happens.

    Written by ``apps.scheduling.latency.observe`` and read by ``/metrics``. Counting at the
    event, not from the job rows at scrape time, keeps the counts monotonic (Prometheus counters:
    cleanup deleting old jobs, or a requeue clearing ``scheduled_at``, would make them go down)
    and the scrape cost independent of history: a few rows per pool. ``count`` and ``sum`` hold
    only this bucket's observations (the one with the smallest ``le`` ≥ the value, ``le`` = +Inf
    last), so an observation updates exactly one row; the reader accumulates.
    """

    pool = models.ForeignKey(ResourcePool, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=16, choices=LatencyKind.choices)
    le = models.FloatField(help_text="Upper bound in seconds (inclusive); +Inf for the last bucket.")
    count = models.BigIntegerField(default=0)
    sum = models.FloatField(default=0.0, help_text="Seconds, of this bucket's observations.")

    class Meta:
        ordering = ["pool_id", "kind", "le"]
        constraints = [
            models.UniqueConstraint(fields=["pool", "kind", "le"], name="scheduling_latency_bucket_unique"),
        ]

    def __str__(self):
        return f"{self.pool_id} {self.kind} le={self.le}: {self.count}"


class FairShare(models.Model):
    """One user's or group's share of a ``usage_fair`` pool (R-SCHED-6): its weight, set by an
    operator, and its decayed device time, kept by the scheduler.

    ``usage`` is device seconds decayed to ``usage_at`` (Unix time); at any later time ``t`` it
    is ``usage · 2^-((t - usage_at) / half-life)`` (``apps.scheduling.shares.decayed``), so a charge
    is one read-modify-write of this row and nothing decays in the background. The order uses
    ``usage + catch_up``: ``catch_up`` is what raised the share to the level's virtual time when it
    last became runnable (``queued`` turning on). ``vtime`` is the virtual time of the share's own
    sessions (the level below: SFQ across them)."""

    pool = models.ForeignKey(ResourcePool, on_delete=models.CASCADE, related_name="shares")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    group = models.ForeignKey(Group, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    weight = models.FloatField(
        default=1.0,
        validators=[MinValueValidator(0.001)],
        help_text="Relative share: a weight-2 user is given twice the device time of a weight-1 user.",
    )
    usage = models.FloatField(default=0.0, help_text="Decayed device seconds, as of usage_at.")
    catch_up = models.FloatField(
        default=0.0,
        help_text="Decayed device seconds added to usage when the share last became runnable (the level's "
        "virtual time), as of usage_at: counted for the order, never shown as used.",
    )
    usage_at = models.FloatField(default=0.0, help_text="Unix time usage and catch_up are given at.")
    queued = models.BooleanField(default=False, help_text="Had work pending at the last dispatch.")
    vtime = models.FloatField(default=0.0, help_text="Virtual time of this share's sessions.")

    class Meta:
        ordering = ["pool_id", "id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(user__isnull=False, group__isnull=True) | Q(user__isnull=True, group__isnull=False),
                name="scheduling_fairshare_user_or_group",
            ),
            models.CheckConstraint(condition=Q(weight__gt=0), name="scheduling_fairshare_weight_positive"),
            models.UniqueConstraint(fields=["pool", "user"], condition=Q(user__isnull=False), name="fairshare_user"),
            models.UniqueConstraint(fields=["pool", "group"], condition=Q(group__isnull=False), name="fairshare_group"),
        ]

    def __str__(self):
        return f"{'group ' + str(self.group) if self.group_id else self.user} on {self.pool}"


class DeviceRuntime(models.Model):
    """Measured device time of a device's completed jobs in one shots band (``band``: the
    number of decimal digits of ``shots`` minus one; -1 for every band together), for the ETA
    of pending jobs and the in-flight estimate of usage_fair. Running moments, their weight
    capped (``apps.scheduling.runtimes.WINDOW``) so that they follow a device that changes."""

    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="runtimes")
    band = models.SmallIntegerField()
    count = models.PositiveIntegerField(default=0)
    mean = models.FloatField(default=0.0, help_text="Seconds.")
    var = models.FloatField(default=0.0, help_text="Seconds squared.")

    class Meta:
        ordering = ["device_id", "band"]
        constraints = [models.UniqueConstraint(fields=["device", "band"], name="scheduling_deviceruntime_unique")]

    def __str__(self):
        return f"{self.device_id} band {self.band}: {self.mean:.1f}s over {self.count}"
