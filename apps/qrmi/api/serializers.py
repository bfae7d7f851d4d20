from rest_framework import serializers

from apps.scheduling.api.serializers import MAX_SHOTS
from apps.sessions.api.serializers import MAX_SLOTS

MAX_UID = 2**31 - 1


class AcquireSerializer(serializers.Serializer):
    """``POST sessions``: qrmi 0.26.4 sends ``user_id`` and ``slurm_job_id``; newer clients send
    ``scheduler_job_id`` and ``qpu_slots`` (R-QRMI-1)."""

    # ASCII digits only, whole string: ``\d`` would take Arabic-Indic digits and ``$`` a trailing
    # newline, and CharField would trim it. Bounded like ``UnixAccount.unix_uid``.
    user_id = serializers.RegexField(
        r"\A[0-9]{1,10}\Z",
        trim_whitespace=False,
        help_text="The Unix uid of the job's user, as a string of ASCII digits.",
        error_messages={"invalid": 'A Unix uid: ASCII digits only, e.g. "1000".'},
    )
    slurm_job_id = serializers.CharField(max_length=128, required=False, allow_blank=True, allow_null=True)
    scheduler_job_id = serializers.CharField(max_length=128, required=False, allow_blank=True, allow_null=True)
    qpu_slots = serializers.IntegerField(min_value=1, max_value=MAX_SLOTS, default=1)

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

    def validate_sequence(self, value):
        if not isinstance(value, (str, dict)) or not value:
            raise serializers.ValidationError("Must be a Pulser sequence's abstract representation (a JSON string).")
        if _is_cudaq_ahs(value):
            raise serializers.ValidationError(
                "A CUDA-Q analog (AHS) program is not accepted here: send the Pulser sequence's abstract "
                "representation (build it with Pulser for the device of qpu/specs, e.g. with "
                "pulser's converters from AHS programs) (docs/qrmi.md)."
            )
        return value


def _is_cudaq_ahs(value) -> bool:
    """A CUDA-Q AHS program (``setup.ahs_register`` and ``hamiltonian``), which Warden converts
    to Pulser with the QPU's specs: told apart without parsing the whole string."""
    if isinstance(value, dict):
        return "hamiltonian" in value and "setup" in value
    return '"hamiltonian"' in value and '"ahs_register"' in value
