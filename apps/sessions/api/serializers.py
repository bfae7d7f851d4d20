from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.allocations.api.serializers import AllocationRemainingSerializer
from apps.core.api.serializers import times
from apps.sessions.models import RevocationReason, Session

EXTERNAL_ID_ALIASES = ("external_id", "scheduler_job_id", "slurm_job_id")


class NextJobSerializer(serializers.Serializer):
    """A waiting session's next job: when the session gets a device next (R-JOB-5)."""

    job = serializers.IntegerField()
    pending_code = serializers.CharField()
    pending_reason = serializers.CharField()
    queue_position = serializers.IntegerField()
    eta_seconds = serializers.FloatField(allow_null=True)
    eta_error_seconds = serializers.FloatField(allow_null=True)
    eta_p90_seconds = serializers.FloatField(allow_null=True)


class RevocationNoticeSerializer(serializers.Serializer):
    """R-RES-1: the session is in the way of a reservation starting soon and is revoked then
    (newest first) unless others end first."""

    reason = serializers.CharField()
    at = serializers.DateTimeField()
    until = serializers.DateTimeField()
    title = serializers.CharField()
    message = serializers.CharField()


class SessionSerializer(serializers.ModelSerializer):
    user = serializers.SlugRelatedField(slug_field="username", read_only=True)
    # Null when nothing of the session is pending, and in the answer to opening one.
    next_job = serializers.SerializerMethodField()
    # R-RES-1: set while a reservation starting soon would revoke it (lists and reads).
    revocation_notice = serializers.SerializerMethodField()
    # "" while the session is active: declared so the schema's enum includes it.
    revocation_reason = serializers.ChoiceField(choices=RevocationReason.choices, allow_blank=True, read_only=True)
    # R-ALLOC-1: the allocation its jobs spend (null: not limited) and what is left of it now.
    allocation_remaining = serializers.SerializerMethodField()

    class Meta:
        model = Session
        fields = [
            "id",
            "user",
            "resource_class",
            "pool",
            "slots",
            "external_id",
            "status",
            "created_at",
            "expires_at",
            "idle_expires_at",
            "revoked_at",
            "revocation_reason",
            "launch_spec",
            "next_job",
            "revocation_notice",
            "allocation",
            "allocation_remaining",
        ]
        read_only_fields = fields

    @extend_schema_field(NextJobSerializer(allow_null=True))
    def get_next_job(self, session) -> dict | None:
        found = (self.context.get("session_waits") or {}).get(session.pk)
        if found is None:
            return None
        job_id, waiting = found
        return {
            "job": job_id,
            "pending_code": waiting.code,
            "pending_reason": waiting.reason,
            "queue_position": waiting.position,
            "eta_seconds": waiting.eta_seconds,
            "eta_error_seconds": waiting.eta_error_seconds,
            "eta_p90_seconds": waiting.eta_p90_seconds,
        }

    @extend_schema_field(RevocationNoticeSerializer(allow_null=True))
    def get_revocation_notice(self, session) -> dict | None:
        notice = (self.context.get("revocation_notices") or {}).get(session.pk)
        if notice is None:
            return None
        at, until = times(notice["at"], notice["until"])
        return {**notice, "at": at, "until": until}

    @extend_schema_field(AllocationRemainingSerializer(allow_null=True))
    def get_allocation_remaining(self, session) -> dict | None:
        return (self.context.get("allocation_remaining") or {}).get(session.allocation_id)

    def to_representation(self, session):
        """What DRF's field-by-field loop gives for ``fields`` (tests/core/test_serializer_fields.py
        compares the two), written out, as ``JobSerializer``'s: DRF's loop cost every acquire's
        response far more than writing it out."""
        created_at, expires_at, idle_expires_at, revoked_at = times(
            session.created_at, session.expires_at, session.idle_expires_at, session.revoked_at
        )
        return {
            "id": str(session.pk),
            "user": session.user.username,
            "resource_class": session.resource_class_id,
            "pool": session.pool_id,
            "slots": session.slots,
            "external_id": session.external_id,
            "status": str(session.status),
            "created_at": created_at,
            "expires_at": expires_at,
            "idle_expires_at": idle_expires_at,
            "revoked_at": revoked_at,
            "revocation_reason": str(session.revocation_reason),
            "launch_spec": session.launch_spec,
            "next_job": self.get_next_job(session),
            "revocation_notice": self.get_revocation_notice(session),
            "allocation": session.allocation_id,
            "allocation_remaining": self.get_allocation_remaining(session),
        }


MAX_SLOTS = 1_000_000


class SessionCreateSerializer(serializers.Serializer):
    """``POST /sessions/``: ``resource_class``, ``slots``, ``external_id`` (or its aliases
    ``scheduler_job_id`` / ``slurm_job_id``), and ``user`` for service principals."""

    resource_class = serializers.IntegerField(min_value=1)
    slots = serializers.IntegerField(min_value=1, max_value=MAX_SLOTS, default=1)
    external_id = serializers.CharField(max_length=128, required=False, allow_blank=True)
    scheduler_job_id = serializers.CharField(max_length=128, required=False, allow_blank=True)
    slurm_job_id = serializers.CharField(max_length=128, required=False, allow_blank=True)
    user = serializers.CharField(max_length=150, required=False, help_text="Username (service principals only).")
    allocation = serializers.IntegerField(
        min_value=1,
        max_value=2**63 - 1,
        required=False,
        help_text="The allocation (project) its jobs spend; default: the user's own on the pool, else a group's.",
    )

    def validate(self, attrs):
        given = {attrs.pop(name).strip() for name in EXTERNAL_ID_ALIASES if attrs.get(name, "").strip()}
        for name in EXTERNAL_ID_ALIASES:
            attrs.pop(name, None)
        if len(given) > 1:
            raise serializers.ValidationError(
                {"external_id": ["external_id, scheduler_job_id and slurm_job_id disagree; send one."]}
            )
        attrs["external_id"] = given.pop() if given else ""
        return attrs


class SlotsSerializer(serializers.Serializer):
    slots_total = serializers.IntegerField()
    slots_used = serializers.IntegerField()
    slots_available = serializers.IntegerField()
