from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.cases.models import Campaign, Case, CaseEvent, CaseStatus
from apps.resources.models import ResourceClass
from apps.resources.selectors import visible_classes


class CaseSerializer(serializers.ModelSerializer):
    """The case payload of SPEC §7 (read)."""

    owner = serializers.CharField(source="owner.username", read_only=True)

    class Meta:
        model = Case
        fields = [
            "id",
            "name",
            "owner",
            "resource_class",
            "backend",
            "command",
            "launch_options",
            "observability_globs",
            "status",
            "remote_id",
            "progress",
            "execution_time",
            "cores",
            "launch_requested_at",
            "status_message",
            "remote_identity",
            "submitted_at",
            "started_at",
            "finished_at",
            "poll_failures",
            "last_error",
            "results_fetched",
        ]
        read_only_fields = fields


@extend_schema_field(OpenApiTypes.INT)
class VisibleClassField(serializers.PrimaryKeyRelatedField):
    """A class of a pool the caller may use; others read as "does not exist" (R-POOL-8)."""

    def get_queryset(self):
        request = self.context.get("request")
        if request is None:
            return ResourceClass.objects.none()
        return visible_classes(request.user)


@extend_schema_field(OpenApiTypes.UUID)
class OwnCampaignField(serializers.PrimaryKeyRelatedField):
    def get_queryset(self):
        request = self.context.get("request")
        if request is None:
            return Campaign.objects.none()
        if request.user.is_staff:
            return Campaign.objects.all()
        return Campaign.objects.filter(owner=request.user)


class CaseCreateSerializer(serializers.Serializer):
    """``POST /cases/`` as JSON, or multipart with ``inputs`` files (JSON fields as strings)."""

    name = serializers.CharField(max_length=200)
    resource_class = VisibleClassField()
    command = serializers.CharField()
    launch_options = serializers.JSONField(required=False, default=dict)
    observability_globs = serializers.JSONField(required=False, default=list)
    campaign = OwnCampaignField(required=False, allow_null=True, default=None)
    inputs = serializers.ListField(child=serializers.FileField(), required=False, default=list, write_only=True)


class InputsSerializer(serializers.Serializer):
    inputs = serializers.ListField(child=serializers.FileField(), allow_empty=False)


class UploadResultSerializer(serializers.Serializer):
    uploaded = serializers.ListField(child=serializers.CharField())


class LaunchSerializer(serializers.Serializer):
    launch_options = serializers.JSONField(required=False, default=None)


class CaseEventSerializer(serializers.ModelSerializer):
    # "" for events that are not transitions: declared so the schema's enum includes it.
    from_status = serializers.ChoiceField(choices=CaseStatus.choices, allow_blank=True, read_only=True)
    to_status = serializers.ChoiceField(choices=CaseStatus.choices, allow_blank=True, read_only=True)

    class Meta:
        model = CaseEvent
        fields = ["id", "at", "kind", "from_status", "to_status", "message", "options"]
        read_only_fields = fields


class FileEntrySerializer(serializers.Serializer):
    path = serializers.CharField()
    size = serializers.IntegerField()


class CampaignSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username", read_only=True)
    shared_files = serializers.SerializerMethodField()

    class Meta:
        model = Campaign
        fields = ["id", "name", "owner", "created_at", "shared_files"]
        read_only_fields = ["id", "owner", "created_at", "shared_files"]

    @extend_schema_field(FileEntrySerializer(many=True))
    def get_shared_files(self, obj):
        from apps.cases import workspace

        return workspace.list_files(workspace.campaign_shared_dir(obj.id))


class CampaignCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200)
    inputs = serializers.ListField(child=serializers.FileField(), required=False, default=list, write_only=True)
