from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.allocations.api.serializers import AllocationRemainingSerializer
from apps.core.api.serializers import ValidatedModelSerializer, times
from apps.resources.models import ResourcePool
from apps.scheduling.devices import validate_driver_settings
from apps.scheduling.models import Device, Job
from apps.scheduling.selectors import NOT_WAITING, REASONS


class DeviceSerializer(ValidatedModelSerializer):
    pool = serializers.PrimaryKeyRelatedField(queryset=ResourcePool.objects.all())
    running_jobs = serializers.IntegerField(read_only=True)
    pending_jobs = serializers.IntegerField(read_only=True)

    class Meta:
        model = Device
        fields = [
            "id",
            "pool",
            "name",
            "driver",
            "config",
            "online",
            "paused_reason",
            "max_concurrent_jobs",
            "provider_status",
            "provider_message",
            "provider_checked_at",
            "running_jobs",
            "pending_jobs",
        ]
        # Written by the worker's status pass for real QPUs (pasqal_qpu, pasqal_cloud).
        read_only_fields = ["provider_status", "provider_message", "provider_checked_at"]
        validators = []  # (pool, name) uniqueness: the model's full_clean reports it

    def validate(self, attrs):
        validate_driver_settings(attrs, self.instance or Device())
        return attrs

    def to_representation(self, instance):
        data = super().to_representation(instance)
        data.setdefault("running_jobs", getattr(instance, "running_jobs", 0))
        data.setdefault("pending_jobs", getattr(instance, "pending_jobs", 0))
        return data


class JobSerializer(serializers.ModelSerializer):
    pending_reason = serializers.SerializerMethodField()
    pending_code = serializers.SerializerMethodField()
    queue_position = serializers.SerializerMethodField()
    eta_seconds = serializers.SerializerMethodField()
    eta_error_seconds = serializers.SerializerMethodField()
    eta_p90_seconds = serializers.SerializerMethodField()

    class Meta:
        model = Job
        fields = [
            "id",
            "session",
            "status",
            "device",
            "target_device",
            "payload",
            "shots",
            "created_at",
            "scheduled_at",
            "started_at",
            "finished_at",
            "cancel_requested_at",
            "result",
            "error",
            "runtime_seconds",
            "pending_reason",
            "pending_code",
            "queue_position",
            "eta_seconds",
            "eta_error_seconds",
            "eta_p90_seconds",
        ]
        read_only_fields = fields

    def _info(self, obj):
        return (self.context.get("queue_info") or {}).get(obj.pk, NOT_WAITING)

    def to_representation(self, job):
        """What DRF's field-by-field loop gives for ``fields`` (tests/core/test_serializer_fields.py
        compares the two), written out: DRF built and bound a field object per field of every
        job and then walked them, for every job submission's response and every job in a list,
        which cost far more than writing them out."""
        waiting = self._info(job)
        created_at, scheduled_at, started_at, finished_at, cancel_requested_at = times(
            job.created_at, job.scheduled_at, job.started_at, job.finished_at, job.cancel_requested_at
        )
        return {
            "id": job.pk,
            "session": job.session_id,
            "status": str(job.status),
            "device": job.device_id,
            "target_device": job.target_device_id,
            "payload": job.payload,
            "shots": job.shots,
            "created_at": created_at,
            "scheduled_at": scheduled_at,
            "started_at": started_at,
            "finished_at": finished_at,
            "cancel_requested_at": cancel_requested_at,
            "result": job.result,
            "error": job.error,
            "runtime_seconds": None if job.runtime_seconds is None else float(job.runtime_seconds),
            "pending_reason": waiting.reason,
            "pending_code": waiting.code,
            "queue_position": waiting.position,
            "eta_seconds": waiting.eta_seconds,
            "eta_error_seconds": waiting.eta_error_seconds,
            "eta_p90_seconds": waiting.eta_p90_seconds,
        }

    # Null once the job left the queue: declared, or the schema says non-nullable.
    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_pending_reason(self, obj) -> str | None:
        return self._info(obj).reason

    @extend_schema_field(serializers.ChoiceField(choices=sorted(REASONS), allow_null=True))
    def get_pending_code(self, obj) -> str | None:
        return self._info(obj).code

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_queue_position(self, obj) -> int | None:
        return self._info(obj).position

    @extend_schema_field(serializers.FloatField(allow_null=True))
    def get_eta_seconds(self, obj) -> float | None:
        """Expected seconds until it starts (R-JOB-5), the median: as likely before as after;
        null when no device can run it now."""
        return self._info(obj).eta_seconds

    @extend_schema_field(serializers.FloatField(allow_null=True))
    def get_eta_error_seconds(self, obj) -> float | None:
        """One standard deviation of ``eta_seconds``."""
        return self._info(obj).eta_error_seconds

    @extend_schema_field(serializers.FloatField(allow_null=True))
    def get_eta_p90_seconds(self, obj) -> float | None:
        """Seconds within which it starts 9 times in 10 (R-JOB-5): calibrated on the pool's last
        starts; null when no device can run it now."""
        return self._info(obj).eta_p90_seconds


MAX_SHOTS = 1_000_000


class SubmittedJobSerializer(JobSerializer):
    """The answer to a submission: the job, and what is left of its session's allocation
    (R-ALLOC-1; null when the session spends none: not limited)."""

    allocation_remaining = AllocationRemainingSerializer(allow_null=True, read_only=True)

    class Meta(JobSerializer.Meta):
        fields = [*JobSerializer.Meta.fields, "allocation_remaining"]
        read_only_fields = fields


class JobSubmitSerializer(serializers.Serializer):
    """``payload`` (for the emulator: ``{"sequence": <Pulser abstract representation>}``),
    ``shots``, optional ``device`` (a device of the session's pool)."""

    payload = serializers.JSONField()
    shots = serializers.IntegerField(min_value=1, max_value=MAX_SHOTS)
    device = serializers.IntegerField(required=False, allow_null=True)

    def validate_payload(self, value):
        if not isinstance(value, dict):
            raise serializers.ValidationError("Must be a JSON object.")
        return value


class JobResultSerializer(serializers.Serializer):
    """A completed job's result (``GET /jobs/{id}/result/``): the counts in bitstring order."""

    job = serializers.IntegerField()
    status = serializers.CharField()
    shots = serializers.IntegerField()
    device = serializers.IntegerField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    counts = serializers.DictField(child=serializers.IntegerField(), help_text="Bitstring → times measured.")
    probabilities = serializers.DictField(child=serializers.FloatField(), help_text="Bitstring → count / total.")


class JobLogsSerializer(serializers.Serializer):
    logs = serializers.CharField()


class ShareSerializer(serializers.Serializer):
    """A user's or group's share of a usage_fair pool (R-SCHED-6)."""

    principal = serializers.ChoiceField(choices=["user", "group"])
    name = serializers.CharField()
    weight = serializers.FloatField()
    usage_seconds = serializers.FloatField(help_text="Device time used, decayed to now.")
    entitled_share = serializers.FloatField(
        help_text="Its weight over the weights of the users or groups with jobs in the pool (0–1); 0 without jobs."
    )
    usage_share = serializers.FloatField(help_text="Its part of the pool's decayed device time (0–1).")
    position = serializers.IntegerField(
        allow_null=True, help_text="1: served next among those with jobs pending; null: none pending."
    )
    waiting_shares = serializers.IntegerField(help_text="Users or groups with jobs pending.")
    pending_jobs = serializers.IntegerField()
    running_jobs = serializers.IntegerField()

    def to_representation(self, view):
        share = view.share
        return {
            "principal": "group" if share.group_id else "user",
            "name": share.group.name if share.group_id else share.user.get_username(),
            "weight": share.weight,
            "usage_seconds": view.usage,
            "entitled_share": view.entitled,
            "usage_share": view.used,
            "position": view.position,
            "waiting_shares": view.waiting,
            "pending_jobs": view.pending_jobs,
            "running_jobs": view.running_jobs,
        }
