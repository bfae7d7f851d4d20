"""Campaigns, cases and case events (SPEC §6)."""

import uuid

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _


class CaseStatus(models.TextChoices):
    PREPARED = "prepared", "Prepared"
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


#: statuses a pass watches (remote job exists, not finished)
ACTIVE = frozenset({CaseStatus.PENDING, CaseStatus.RUNNING})
TERMINAL = frozenset({CaseStatus.DONE, CaseStatus.FAILED, CaseStatus.CANCELLED})
#: not finished: the partial index ``cases_case_unfinished`` holds these
UNFINISHED = [CaseStatus.PREPARED, CaseStatus.PENDING, CaseStatus.RUNNING]


class Campaign(models.Model):
    """A group of cases sharing input files uploaded once (seen as ``shared/`` by each case)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=200)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="campaigns")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "id"]
        indexes = [models.Index(fields=["owner", "-created_at", "id"], name="cases_campaign_owner_list")]

    def __str__(self):
        return self.name

    def clean(self):
        if self.name is not None:
            self.name = self.name.strip()
        if not self.name:
            raise ValidationError({"name": _("A campaign needs a name.")})


#: cases that have, or are about to have, a job at a provider: submitting (launch asked for, not yet
#: submitted), pending or running. Their rows poll, cancel and charge that job.
IN_FLIGHT = Q(status__in=sorted(ACTIVE)) | Q(status=CaseStatus.PREPARED, launch_requested_at__isnull=False)


class CaseQuerySet(models.QuerySet):
    def launched(self):
        """Cases whose launch was asked for, or that left ``prepared`` (see ``Case.is_launched``)."""
        return self.filter(~Q(status=CaseStatus.PREPARED) | Q(launch_requested_at__isnull=False))

    def in_flight(self):
        return self.filter(IN_FLIGHT)


class Case(models.Model):
    """One simulation run on an execution backend. Its workspace is ``GRIDGATE_CASES_ROOT/<id>/``.

    Pass bookkeeping (``next_poll_at``, ``next_sync_at``, ``lease_*``) is internal: workers claim
    cases with a lease so several workers share the work and a dead worker's cases are resumed
    when its lease expires (R-CASE-2).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="cases")
    name = models.CharField(max_length=200)
    campaign = models.ForeignKey(Campaign, null=True, blank=True, on_delete=models.PROTECT, related_name="cases")
    resource_class = models.ForeignKey("resources.ResourceClass", on_delete=models.PROTECT, related_name="cases")
    command = models.TextField(help_text=_("Shell command line, run in the case's working directory."))
    launch_options = models.JSONField(default=dict, blank=True)
    observability_globs = models.JSONField(default=list, blank=True)
    status = models.CharField(max_length=16, choices=CaseStatus.choices, default=CaseStatus.PREPARED)
    backend = models.CharField(max_length=32, blank=True, default="")
    remote_id = models.CharField(max_length=200, blank=True, default="")
    progress = models.FloatField(null=True, blank=True)
    execution_time = models.FloatField(null=True, blank=True, help_text=_("Seconds, as the backend reports it."))
    cores = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    launch_requested_at = models.DateTimeField(null=True, blank=True)
    submitted_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    last_polled_at = models.DateTimeField(null=True, blank=True)
    last_synced_at = models.DateTimeField(null=True, blank=True)
    last_refresh_at = models.DateTimeField(null=True, blank=True)
    poll_failures = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    log_gap = models.JSONField(
        default=dict,
        blank=True,
        help_text=_(
            "Output a full cases disk kept out of the logs (when, and per log how many lines and bytes), noted in "
            "the logs once there is room again."
        ),
    )
    status_message = models.CharField(
        max_length=500,
        blank=True,
        default="",
        help_text=_("The provider's word on a waiting or running case, e.g. Slurm's pending reason (JobHeldAdmin)."),
    )
    remote_identity = models.CharField(
        max_length=300,
        blank=True,
        default="",
        help_text=_(
            "Whose provider account the remote job runs under: the owner's own (per-user credentials) or the "
            "pool's service account. Set at submission."
        ),
    )
    results_fetched = models.BooleanField(default=False)
    #: set by ``manage.py cleanup`` once the provider side (buckets, run directory) is purged
    remote_purged_at = models.DateTimeField(null=True, blank=True)
    # -- pass bookkeeping (R-CASE-2) --
    next_poll_at = models.DateTimeField(null=True, blank=True)
    next_sync_at = models.DateTimeField(null=True, blank=True)
    lease_owner = models.CharField(max_length=100, blank=True, default="")
    lease_until = models.DateTimeField(null=True, blank=True)
    # -- host affinity: a host-bound backend's case (local: a process on one machine)
    # is pinned to the worker host that starts it; only that host's workers claim it afterwards.
    run_host = models.CharField(
        max_length=60,
        blank=True,
        default="",
        help_text=_("Worker host (GRIDGATE_WORKER_HOST) running a local case's process; empty for remote backends."),
    )
    #: a cancel asked on another host than ``run_host``: the run host's next poll stops the process
    cancel_requested_at = models.DateTimeField(null=True, blank=True)

    objects = CaseQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "id"]
        indexes = [
            models.Index(fields=["owner", "-created_at", "id"], name="cases_case_owner_list"),
            models.Index(fields=["-created_at", "id"], name="cases_case_list"),
            # Poll pass claim: status IN (pending, running) AND next_poll_at <= now ORDER BY next_poll_at.
            models.Index(
                fields=["next_poll_at"], condition=Q(status__in=["pending", "running"]), name="cases_case_poll_due"
            ),
            # Sync pass claim: status = running AND next_sync_at <= now ORDER BY next_sync_at.
            models.Index(fields=["next_sync_at"], condition=Q(status="running"), name="cases_case_sync_due"),
            # Submit recovery: status = prepared AND launch_requested_at IS NOT NULL (lease expired).
            models.Index(
                fields=["launch_requested_at"],
                condition=Q(status="prepared", launch_requested_at__isnull=False),
                name="cases_case_launch_due",
            ),
            # Orphan cancel claim: status = cancelled AND cancel_requested_at IS NOT NULL AND
            # remote_id = '' ORDER BY cancel_requested_at: a handful of rows, never the history.
            models.Index(
                fields=["cancel_requested_at"],
                condition=Q(status="cancelled", cancel_requested_at__isnull=False, remote_id=""),
                name="cases_case_orphan_cancel",
            ),
            # /metrics: unfinished cases per pool and state (apps.metrics.collector); the cost of a
            # scrape follows the unfinished cases, never the finished history.
            models.Index(
                fields=["resource_class", "status"],
                condition=Q(status__in=UNFINISHED),
                name="cases_case_unfinished",
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(progress__isnull=True) | Q(progress__gte=0, progress__lte=1),
                name="cases_case_progress_range",
                violation_error_message="progress is between 0 and 1.",
            ),
            # R-CASE-4: done only with the results on disk.
            models.CheckConstraint(
                condition=~Q(status="done") | Q(results_fetched=True),
                name="cases_case_done_has_results",
                violation_error_message="A case is done only once its results are fetched (R-CASE-4).",
            ),
        ]

    def __str__(self):
        return f"{self.name} ({self.status})"

    @property
    def is_submitting(self) -> bool:
        """Launch requested, not yet submitted: a worker uploads and submits it (R-CASE-1)."""
        return self.status == CaseStatus.PREPARED and self.launch_requested_at is not None

    @property
    def is_launched(self) -> bool:
        """Its launch asked for, or past ``prepared`` (a prepared case cancelled too): its inputs
        are frozen and what it ran with (owner, class, command, options) is history."""
        return self.status != CaseStatus.PREPARED or self.launch_requested_at is not None

    @property
    def display_status(self) -> str:
        """What the user pages show: "submitting" between the launch and the submission."""
        return "submitting" if self.is_submitting else self.status

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL

    def clean(self):
        errors = {}
        if self.name is not None:
            self.name = self.name.strip()
        if not self.name:
            errors["name"] = [_("A case needs a name.")]
        if not (self.command or "").strip():
            errors["command"] = [_("A case needs a command to run.")]
        if not isinstance(self.launch_options, dict):
            errors["launch_options"] = [_("Must be a JSON object.")]
        globs = self.observability_globs
        if not isinstance(globs, list) or not all(isinstance(g, str) and g for g in globs):
            errors["observability_globs"] = [_("Must be a list of glob patterns (strings).")]
        elif any(g.startswith("/") or ".." in g.split("/") for g in globs):
            errors["observability_globs"] = [_("Globs are relative to the working directory: no '/' prefix, no '..'.")]
        if self.campaign_id and self.owner_id and self.campaign.owner_id != self.owner_id:
            errors["campaign"] = [_("The campaign belongs to another user.")]
        if errors:
            raise ValidationError(errors)


class CaseEvent(models.Model):
    """Every transition and every launch of a case: when, from, to, why, options asked for."""

    class Kind(models.TextChoices):
        TRANSITION = "transition", "Transition"
        LAUNCH = "launch", "Launch"
        CANCEL = "cancel", "Cancel request"
        ERROR = "error", "Error"
        NOTE = "note", "Provider note"

    case = models.ForeignKey(Case, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField()
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.TRANSITION)
    from_status = models.CharField(max_length=16, choices=CaseStatus.choices, blank=True, default="")
    to_status = models.CharField(max_length=16, choices=CaseStatus.choices, blank=True, default="")
    message = models.TextField(blank=True, default="")
    options = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["at", "id"]
        indexes = [models.Index(fields=["case", "at", "id"], name="cases_event_case_time")]

    def __str__(self):
        if self.from_status or self.to_status:
            return f"{self.at:%Y-%m-%d %H:%M:%S} {self.from_status or '-'} → {self.to_status or '-'}"
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.kind}"
