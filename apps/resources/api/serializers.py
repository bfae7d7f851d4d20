from decimal import Decimal

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.backends.readiness import user_readiness
from apps.core.api.serializers import ValidatedModelSerializer
from apps.resources import services
from apps.resources.launch import launch_spec
from apps.resources.models import ResourceClass, ResourcePool


@extend_schema_field(OpenApiTypes.NUMBER)
class CpuField(serializers.DecimalField):
    """CPU as a JSON number: whole values as integers (2, not 2.0 or "2.000")."""

    def __init__(self, **kwargs):
        kwargs.setdefault("max_digits", 8)
        kwargs.setdefault("decimal_places", 3)
        kwargs.setdefault("coerce_to_string", False)
        super().__init__(**kwargs)

    def to_representation(self, value):
        value = Decimal(value)
        if value == value.to_integral_value():
            return int(value)
        return float(value.normalize())


class ClassRemoteSerializer(serializers.Serializer):
    """Documentation shape of a class override (validated by the model)."""

    system_name = serializers.CharField(required=False)
    partition = serializers.CharField(required=False)
    forward_resource_values = serializers.BooleanField(required=False)


class ResourceClassSerializer(ValidatedModelSerializer):
    kind = serializers.CharField(read_only=True, help_text="The pool's kind (derived).")
    cpu = CpuField()
    remote = serializers.JSONField(required=False, allow_null=True)
    matching = serializers.SerializerMethodField()

    class Meta:
        model = ResourceClass
        fields = [
            "id",
            "pool",
            "kind",
            "name",
            "cpu",
            "memory",
            "gpu",
            "max_storage",
            "default_storage",
            "max_tasks",
            "wall_time",
            "max_wall_time",
            "default",
            "remote",
            "matching",
        ]
        read_only_fields = ["id", "pool", "kind", "matching"]
        # Uniqueness is checked by the model (full_clean) with the admin's messages; the
        # default-class switch must not be refused by DRF's own unique validator.
        validators = []

    @extend_schema_field(OpenApiTypes.BOOL)
    def get_matching(self, obj) -> bool:
        wanted = self.context.get("wanted") or {}
        return all(getattr(obj, dim) >= value for dim, value in wanted.items())

    def create(self, validated_data):
        validated_data["pool"] = self.context["pool"]
        return super().create(validated_data)


class ClassEntrySerializer(serializers.Serializer):
    """A class inside a pool write: with ``id`` it patches that class, without it creates one."""

    id = serializers.IntegerField(required=False)
    name = serializers.CharField(required=False, max_length=64)
    cpu = CpuField(required=False)
    memory = serializers.IntegerField(required=False)
    gpu = serializers.IntegerField(required=False)
    max_storage = serializers.IntegerField(required=False)
    default_storage = serializers.IntegerField(required=False)
    default = serializers.BooleanField(required=False)
    remote = serializers.JSONField(required=False, allow_null=True)


class QuotaSerializer(serializers.Serializer):
    cpu = CpuField()
    memory = serializers.IntegerField()
    gpu = serializers.IntegerField(required=False, default=0)


class ResourcePoolSerializer(serializers.ModelSerializer):
    quota = QuotaSerializer(required=False, allow_null=True)
    remote = serializers.JSONField(required=False, allow_null=True)
    users = serializers.SlugRelatedField(
        many=True, required=False, slug_field="username", queryset=get_user_model().objects.all()
    )
    groups = serializers.SlugRelatedField(many=True, required=False, slug_field="name", queryset=Group.objects.all())
    classes = ResourceClassSerializer(many=True, read_only=True)
    runs = serializers.SerializerMethodField(
        help_text="What the pool takes: `jobs` (it has devices), `cases` (its kind has a case backend) or `` (nothing)."
    )
    usable = serializers.SerializerMethodField(
        help_text="Whether the pool would accept your work now: sessions and jobs, or case launches "
        "(the backend set up here, your linked Unix account, your own provider credential)."
    )
    unusable_reason = serializers.SerializerMethodField(
        help_text="Why it would refuse your work and what to do (null when `usable`)."
    )

    class Meta:
        model = ResourcePool
        fields = [
            "id",
            "name",
            "kind",
            "public",
            "default",
            "quota",
            "remote",
            "slots_total",
            "slurm_licence",
            "strategy",
            "share_by",
            "usage_half_life",
            "idle_timeout",
            "max_lifetime",
            "is_accessible",
            "accessibility_message",
            "paused_reason",
            "sandbox_unlinked",
            "trusted",
            "network",
            "allowed_networks",
            "users",
            "groups",
            "classes",
            "runs",
            "usable",
            "unusable_reason",
        ]
        validators = []
        extra_kwargs = {"name": {"validators": []}, "default": {"validators": []}}

    def _usability(self, pool):
        """The requesting user's readiness on ``pool``: computed for a whole page by the view
        (``context["readiness"]``, constant queries), else for this pool alone (a write's answer)."""
        readiness = self.context.get("readiness")
        if readiness is None or pool.pk not in readiness:
            request = self.context.get("request")
            readiness = user_readiness(getattr(request, "user", None), [pool])
            self.context["readiness"] = {**(self.context.get("readiness") or {}), **readiness}
        return readiness[pool.pk]

    @extend_schema_field(serializers.ChoiceField(choices=["jobs", "cases", ""]))
    def get_runs(self, pool) -> str:
        return self._usability(pool).runs

    @extend_schema_field(OpenApiTypes.BOOL)
    def get_usable(self, pool) -> bool:
        return self._usability(pool).usable

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_unusable_reason(self, pool) -> str | None:
        usability = self._usability(pool)
        return None if usability.usable else usability.reason

    def to_internal_value(self, data):
        validated = super().to_internal_value(data)
        raw_classes = data.get("classes") if hasattr(data, "get") else None
        if raw_classes is not None:
            entries = ClassEntrySerializer(data=raw_classes, many=True)
            if not entries.is_valid():
                raise serializers.ValidationError({"classes": entries.errors})
            validated["classes"] = entries.validated_data
        return validated

    def validate_quota(self, value):
        """A PATCH may carry part of a quota (``{"quota": {"memory": 4}}``): it is merged into the
        pool's current quota; what is still missing (a pool without one) is a 400 naming the
        field, never a KeyError 500. PUT and POST give the whole quota."""
        if value is None:
            return None
        current = self.instance.quota if self.partial and self.instance is not None else None
        merged = {**(current or {}), **value}
        missing = [key for key in ("cpu", "memory") if merged.get(key) is None]
        if missing:
            raise serializers.ValidationError(
                {key: ["This field is required (the pool has no quota to complete)."] for key in missing}
            )
        merged.setdefault("gpu", 0)
        return merged

    def _save(self, instance, validated_data):
        classes = validated_data.pop("classes", None)
        users = validated_data.pop("users", None)
        groups = validated_data.pop("groups", None)
        if "quota" in validated_data:
            quota = validated_data.pop("quota")
            validated_data["quota_cpu"] = quota["cpu"] if quota else None
            validated_data["quota_memory"] = quota["memory"] if quota else None
            validated_data["quota_gpu"] = quota["gpu"] if quota else None
        if "remote" in validated_data and validated_data["remote"] is None:
            validated_data["remote"] = {}
        request = self.context.get("request")
        return services.save_pool(
            pool=instance,
            fields=validated_data,
            users=users,
            groups=groups,
            classes=classes,
            actor=request.user if request is not None else None,
        )

    def create(self, validated_data):
        return self._save(None, validated_data)

    def update(self, instance, validated_data):
        return self._save(instance, validated_data)

    def to_representation(self, instance):
        data = super().to_representation(instance)
        request = self.context.get("request")
        if request is None or not request.user.is_staff:
            # Who else is granted a private pool is the operators' business, not its users'.
            data["users"], data["groups"] = [], []
        # By name: the database returns the grants in no set order.
        data["users"], data["groups"] = sorted(data["users"]), sorted(data["groups"])
        data["quota"] = QuotaSerializer(instance.quota).data if instance.quota is not None else None
        return data


class AccessibilitySerializer(serializers.Serializer):
    is_accessible = serializers.BooleanField()
    message = serializers.CharField(allow_blank=True, required=False, default="", max_length=500)


class LaunchSpecSerializer(serializers.Serializer):
    resources = serializers.DictField()
    environment = serializers.DictField(child=serializers.CharField())
    batch_directives = serializers.ListField(child=serializers.CharField())

    @classmethod
    def for_class(cls, resource_class: ResourceClass):
        return cls(launch_spec(resource_class))
