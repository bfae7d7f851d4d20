from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.core.api.serializers import ValidatedModelSerializer, times
from apps.resources.models import ResourcePool
from apps.scheduling.devices import validate_driver_settings
from apps.scheduling.models import Device, Job


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
    queue_position = serializers.SerializerMethodField()

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
            "queue_position",
        ]
        read_only_fields = fields

    def _info(self, obj):
        return (self.context.get("queue_info") or {}).get(obj.pk, (None, None))

    def to_representation(self, job):
        """What DRF's field-by-field loop gives for ``fields`` (tests/core/test_serializer_fields.py
        compares the two), written out: DRF built and bound a field object per field of every
        job and then walked them, for every job submission's response and every job in a list,
        which cost far more than writing them out."""
        reason, position = self._info(job)
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
            "pending_reason": reason,
            "queue_position": position,
        }

    # Null once the job left the queue: declared, or the schema says non-nullable.
    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_pending_reason(self, obj) -> str | None:
        return self._info(obj)[0]

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_queue_position(self, obj) -> int | None:
        return self._info(obj)[1]


MAX_SHOTS = 1_000_000


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


class JobLogsSerializer(serializers.Serializer):
    logs = serializers.CharField()
