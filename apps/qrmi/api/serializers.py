from rest_framework import serializers
from rest_framework.fields import empty

from apps.core.api.serializers import plain_int, plain_text, validate_as_drf
from apps.scheduling.api.serializers import MAX_SHOTS
from apps.sessions.api.serializers import MAX_SLOTS

MAX_UID = 2**31 - 1


class AcquireSerializer(serializers.Serializer):
    """``POST sessions``: qrmi 0.26.4 sends ``user_id`` and ``slurm_job_id``; newer clients send
    ``scheduler_job_id`` and ``qpu_slots`` (R-QRMI-1)."""

    # ASCII digits only, whole string: ``\d`` would take Arabic-Indic digits and ``$`` a trailing
    # newline, and CharField would trim it (issue 16, item 8). Bounded like ``UnixAccount.unix_uid``.
    user_id = serializers.RegexField(
        r"\A[0-9]{1,10}\Z",
        trim_whitespace=False,
        help_text="The Unix uid of the job's user, as a string of ASCII digits.",
        error_messages={"invalid": 'A Unix uid: ASCII digits only, e.g. "1000".'},
    )
    slurm_job_id = serializers.CharField(max_length=128, required=False, allow_blank=True, allow_null=True)
    scheduler_job_id = serializers.CharField(max_length=128, required=False, allow_blank=True, allow_null=True)
    qpu_slots = serializers.IntegerField(min_value=1, max_value=MAX_SLOTS, default=1)

    def run_validation(self, data=empty):
        """The common body (a uid of ASCII digits, job ids that need no trimming or null, slots
        within bounds or none) taken as it is, then ``validate``; anything else goes through
        DRF's field-by-field validation, which gives that same result for it
        (tests/core/test_serializer_fields.py compares the two) and its messages for the rest:
        DRF built and bound the four field objects for every acquire (issue 15)."""
        if type(data) is dict and _plain_uid(data.get("user_id")) and plain_int(data.get("qpu_slots", 1), 1, MAX_SLOTS):
            ids = [data.get(name) for name in ("slurm_job_id", "scheduler_job_id")]
            limit = self._declared_fields["slurm_job_id"].max_length  # scheduler_job_id's too
            if all(value is None or plain_text(value, limit) for value in ids):
                return validate_as_drf(
                    self,
                    {
                        "user_id": data["user_id"],
                        "slurm_job_id": ids[0],
                        "scheduler_job_id": ids[1],
                        "qpu_slots": data.get("qpu_slots", 1),
                    },
                )
        return super().run_validation(data)

    def validate_user_id(self, value):
        if int(value) > MAX_UID:
            raise serializers.ValidationError("A Unix uid: at most 2147483647.")
        return value

    def validate(self, attrs):
        given = {(attrs.get(name) or "").strip() for name in ("slurm_job_id", "scheduler_job_id")} - {""}
        if len(given) > 1:
            raise serializers.ValidationError({"scheduler_job_id": ["slurm_job_id and scheduler_job_id disagree."]})
        return {"uid": int(attrs["user_id"]), "external_id": given.pop() if given else "", "slots": attrs["qpu_slots"]}


class TaskSerializer(serializers.Serializer):
    """``POST jobs``: the Pulser sequence's abstract representation (a JSON string) and the runs."""

    sequence = serializers.JSONField()
    shots = serializers.IntegerField(min_value=1, max_value=MAX_SHOTS)

    def run_validation(self, data=empty):
        """The common body (a sequence as a non-empty string or object, shots within bounds)
        taken as it is; anything else goes through DRF's field-by-field validation, which gives
        that same result for it (tests/core/test_serializer_fields.py compares the two) and its
        messages for the rest: DRF built and bound the two field objects for every job (issue 15)."""
        sequence = data.get("sequence") if type(data) is dict else None
        if type(sequence) in (str, dict) and sequence and plain_int(data.get("shots"), 1, MAX_SHOTS):
            return {"sequence": sequence, "shots": data["shots"]}
        return super().run_validation(data)

    def validate_sequence(self, value):
        if not isinstance(value, (str, dict)) or not value:
            raise serializers.ValidationError("Must be a Pulser sequence's abstract representation (a JSON string).")
        return value


def _plain_uid(value) -> bool:
    """Whether ``AcquireSerializer``'s ``user_id`` takes ``value`` as it is: 1 to 10 ASCII
    digits, at most ``MAX_UID``."""
    return (
        type(value) is str and 1 <= len(value) <= 10 and value.isascii() and value.isdigit() and int(value) <= MAX_UID
    )
