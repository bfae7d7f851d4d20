from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.core.api.serializers import FieldsBuiltOnce, ValidatedModelSerializer
from apps.resources.models import ResourcePool
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

    def to_representation(self, instance):
        data = super().to_representation(instance)
        data.setdefault("running_jobs", getattr(instance, "running_jobs", 0))
        data.setdefault("pending_jobs", getattr(instance, "pending_jobs", 0))
        return data


class JobSerializer(FieldsBuiltOnce, serializers.ModelSerializer):
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

    # Null once the job left the queue (issue 16: the schema said non-nullable).
    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_pending_reason(self, obj) -> str | None:
        return self._info(obj)[0]

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_queue_position(self, obj) -> int | None:
        return self._info(obj)[1]


class JobSubmitSerializer(serializers.Serializer):
    """``payload`` (for the emulator: ``{"sequence": <Pulser abstract representation>}``),
    ``shots``, optional ``device`` (a device of the session's pool)."""

    payload = serializers.JSONField()
    shots = serializers.IntegerField(min_value=1, max_value=1_000_000)
    device = serializers.IntegerField(required=False, allow_null=True)

    def validate_payload(self, value):
        if not isinstance(value, dict):
            raise serializers.ValidationError("Must be a JSON object.")
        return value


class JobLogsSerializer(serializers.Serializer):
    logs = serializers.CharField()
