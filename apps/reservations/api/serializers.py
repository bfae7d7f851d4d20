from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from rest_framework import serializers

from apps.core.api.serializers import ValidatedModelSerializer
from apps.reservations.models import Reservation, WindowKind
from apps.reservations.services import save_reservation
from apps.resources.models import ResourcePool
from apps.scheduling.models import Device


class ReservationSerializer(ValidatedModelSerializer):
    """A calendar window (SPEC §11, R-RES-1/2). Holders are usernames and group names."""

    pool = serializers.PrimaryKeyRelatedField(queryset=ResourcePool.objects.all())
    device = serializers.PrimaryKeyRelatedField(queryset=Device.objects.all(), allow_null=True, required=False)
    kind = serializers.ChoiceField(choices=WindowKind.choices, default=WindowKind.RESERVATION)
    slots = serializers.IntegerField(min_value=0, max_value=1_000_000, default=0)
    users = serializers.SlugRelatedField(
        slug_field="username", queryset=get_user_model().objects.all(), many=True, required=False
    )
    groups = serializers.SlugRelatedField(slug_field="name", queryset=Group.objects.all(), many=True, required=False)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    slurm_reservation = serializers.SerializerMethodField(
        help_text="The Slurm reservation that mirrors it when the pool has a Slurm licence (sbatch --reservation)."
    )

    class Meta:
        model = Reservation
        fields = [
            "id",
            "pool",
            "device",
            "kind",
            "start",
            "end",
            "slots",
            "users",
            "groups",
            "title",
            "created_by",
            "created_at",
            "cancelled_at",
            "slurm_reservation",
        ]
        read_only_fields = ["id", "created_by", "created_at", "cancelled_at"]

    def to_representation(self, instance):
        """Who else holds a window (and so works on its pool) is the operators' business, as for
        a pool's own grants (``ResourcePoolSerializer``): others see the holders they are, their
        username and their groups, not the rest. Holders are listed by name (the database returns
        a window's holders in no set order)."""
        data = super().to_representation(instance)
        data["users"], data["groups"] = sorted(data["users"]), sorted(data["groups"])
        request = self.context.get("request")
        if request is not None and not request.user.is_staff:
            user = request.user
            if "holder_groups" not in self.context:  # once per list: the context is shared
                self.context["holder_groups"] = set(user.groups.values_list("name", flat=True))
            data["users"] = [name for name in data["users"] if name == user.get_username()]
            data["groups"] = [name for name in data["groups"] if name in self.context["holder_groups"]]
        return data

    def get_slurm_reservation(self, obj) -> str | None:
        return obj.slurm_name if obj.pool.slurm_licence else None

    def create(self, validated_data):
        users, groups = validated_data.pop("users", []), validated_data.pop("groups", [])
        request = self.context.get("request")
        return save_reservation(
            Reservation(**validated_data), users=users, groups=groups, actor=request.user if request else None
        )

    def update(self, instance, validated_data):
        users, groups = validated_data.pop("users", None), validated_data.pop("groups", None)
        for name, value in validated_data.items():
            setattr(instance, name, value)
        return save_reservation(instance, users=users, groups=groups)


class ScheduleSlotSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=["reservation", "maintenance", "open"])
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    slots = serializers.IntegerField(
        allow_null=True, help_text="Reservation: slots held; maintenance: 0; open: the pool's slots_total."
    )
    title = serializers.CharField()
    device = serializers.IntegerField(allow_null=True, help_text="The device it covers; null for the whole pool.")
    mine = serializers.BooleanField(help_text="You hold this reservation (directly or through a group).")
    reservation = serializers.IntegerField(allow_null=True)


class ScheduleSerializer(serializers.Serializer):
    """R-RES-4: ``{"pool", "from", "to", "slots", "ics_url"}``."""

    pool = serializers.IntegerField()
    locals()["from"] = serializers.DateTimeField()  # a Python keyword, a field name of the API
    to = serializers.DateTimeField()
    slots = ScheduleSlotSerializer(many=True)
    ics_url = serializers.CharField(
        help_text="This schedule as an iCalendar feed (schedule.ics), with your personal feed token: "
        "add it to your calendar application. It reads schedules only; changing your password revokes it."
    )
