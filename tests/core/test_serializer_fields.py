"""Issue 15: the job and session responses are written out, and say what DRF's field-by-field
loop over the same fields says; the common bodies of a submission and an acquire (REST and QRMI)
are taken without DRF's field objects, and validate as DRF validates them."""

from datetime import UTC, datetime, timedelta, timezone

import pytest
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer

from apps.qrmi.api.serializers import AcquireSerializer, TaskSerializer
from apps.scheduling.api.serializers import JobSerializer, JobSubmitSerializer
from apps.scheduling.models import Job, JobStatus
from apps.sessions.api.serializers import SessionCreateSerializer, SessionSerializer
from apps.sessions.models import RevocationReason, Session, SessionStatus

pytestmark = pytest.mark.django_db

AT = datetime(2026, 12, 1, 8, 30, 15, 123456, tzinfo=UTC)
ELSEWHERE = timezone(timedelta(hours=5, minutes=30))  # a driver's aware time in another zone


def generic(serializer, instance) -> bytes:
    """DRF's own representation, as clients get it: every declared field, converted by its field
    object, rendered as JSON (so that 12 and 12.0, a UUID and its text, differ where they would)."""
    return JSONRenderer().render(serializers.Serializer.to_representation(serializer, instance))


def jobs(session):
    yield Job(session=session, pool_id=session.pool_id, user_id=session.user_id, payload={"sequence": "{}"}, shots=3)
    yield Job(
        pk=42,
        session=session,
        pool_id=session.pool_id,
        user_id=session.user_id,
        payload={"sequence": {"nested": [1, 2.5, None]}},
        shots=1000,
        status=JobStatus.COMPLETED,
        device_id=7,
        target_device_id=7,
        created_at=AT,
        scheduled_at=AT + timedelta(seconds=1),
        started_at=(AT + timedelta(seconds=2)).astimezone(ELSEWHERE),
        finished_at=AT + timedelta(minutes=3),
        cancel_requested_at=AT.replace(microsecond=0),
        result={"counts": {"01": 600, "10": 400}},
        error="",
        runtime_seconds=12,
    )
    yield Job(pk=43, session=session, payload={}, shots=1, status="failed", error="device said no", created_at=AT)


def sessions(open_session, local_pool, owner):
    active = open_session(local_pool, owner, slots=2, external_id="1234.5")
    yield active
    ended = Session.objects.get(pk=open_session(local_pool, owner).pk)
    ended.status, ended.revoked_at = SessionStatus.REVOKED, AT.astimezone(ELSEWHERE)
    ended.revocation_reason = RevocationReason.IDLE_TIMEOUT
    yield ended
    yield Session(user=owner, slots=1, created_at=AT, expires_at=AT, idle_expires_at=AT, launch_spec={})  # unsaved


def test_a_job_response_is_what_drf_gives_for_its_fields(open_session, local_pool, owner):
    session = open_session(local_pool, owner)
    for job in jobs(session):
        serializer = JobSerializer(job, context={"queue_info": {42: ("busy", 3)}})
        assert JSONRenderer().render(serializer.data) == generic(serializer, job)
        assert list(serializer.data) == JobSerializer.Meta.fields


def test_a_session_response_is_what_drf_gives_for_its_fields(open_session, local_pool, owner):
    for session in sessions(open_session, local_pool, owner):
        serializer = SessionSerializer(session)
        assert JSONRenderer().render(serializer.data) == generic(serializer, session)
        assert list(serializer.data) == SessionSerializer.Meta.fields


def test_a_list_of_jobs_answers_each_with_its_own_queue_info(open_session, local_pool, owner):
    session = open_session(local_pool, owner)
    first, second = (Job(pk=pk, session=session, payload={}, shots=1, created_at=AT) for pk in (1, 2))
    data = JobSerializer([first, second], many=True, context={"queue_info": {1: ("busy", 1), 2: ("waiting", 2)}}).data
    assert [(job["pending_reason"], job["queue_position"]) for job in data] == [("busy", 1), ("waiting", 2)]


def test_the_published_schema_does_not_describe_jobs_and_sessions_with_implementation_notes():
    """drf-spectacular takes a component's description from the serializer's docstrings."""
    from drf_spectacular.generators import SchemaGenerator

    schemas = SchemaGenerator().get_schema(request=None, public=True)["components"]["schemas"]
    for name in ("Job", "Session"):
        assert "issue 15" not in str(schemas[name]) and "field-by-field" not in str(schemas[name])


SEQUENCE = {"sequence": "{}"}
SUBMISSIONS = [
    {"payload": SEQUENCE, "shots": 10},
    {"payload": SEQUENCE, "shots": 1, "device": None},
    {"payload": SEQUENCE, "shots": 1_000_000, "other": "ignored"},
    {"payload": {}, "shots": 3, "device": 7},
    {"payload": SEQUENCE, "shots": 3, "device": "7"},
    {"payload": SEQUENCE, "shots": 3, "device": True},
    {"payload": SEQUENCE, "shots": 0},
    {"payload": SEQUENCE, "shots": 1_000_001},
    {"payload": SEQUENCE, "shots": -1},
    {"payload": SEQUENCE, "shots": True},
    {"payload": SEQUENCE, "shots": "10"},
    {"payload": SEQUENCE, "shots": 10.0},
    {"payload": SEQUENCE, "shots": None},
    {"payload": SEQUENCE, "shots": 10**1001},
    {"payload": SEQUENCE},
    {"payload": [], "shots": 1},
    {"payload": "text", "shots": 1},
    {"payload": None, "shots": 1},
    {"shots": 1},
    {},
    [],
    "text",
    None,
]
ACQUIRES = [
    {"resource_class": 1},
    {"resource_class": 1, "slots": 2, "other": "ignored"},
    {"resource_class": 2**63 - 1, "slots": 1_000_000},
    {"resource_class": 1, "external_id": "4242.0"},
    {"resource_class": 1, "external_id": "", "slurm_job_id": "4242"},
    {"resource_class": 1, "scheduler_job_id": "4242", "slurm_job_id": "4242"},
    {"resource_class": 1, "scheduler_job_id": "4242", "slurm_job_id": "4243"},
    {"resource_class": 1, "external_id": "a" * 128},
    {"resource_class": 1, "external_id": "a" * 129},
    {"resource_class": 1, "external_id": " padded "},
    {"resource_class": 1, "external_id": "tab\t"},
    {"resource_class": 1, "external_id": "caf\u00e9"},
    {"resource_class": 1, "external_id": "nul\x00"},
    {"resource_class": 1, "external_id": "\ud800"},
    {"resource_class": 1, "external_id": 12},
    {"resource_class": 1, "external_id": None},
    {"resource_class": 1, "user": "alice"},
    {"resource_class": 1, "user": ""},
    {"resource_class": 1, "user": " alice "},
    {"resource_class": 1, "user": "b" * 151},
    {"resource_class": 1, "slots": 0},
    {"resource_class": 1, "slots": 1_000_001},
    {"resource_class": 1, "slots": True},
    {"resource_class": 1, "slots": "2"},
    {"resource_class": 1, "slots": None},
    {"resource_class": 0},
    {"resource_class": True},
    {"resource_class": "1"},
    {"resource_class": 2**63},
    {"resource_class": 10**1001},
    {"slots": 1},
    [],
    None,
]

QRMI_ACQUIRES = [
    {"user_id": "1000"},
    {"user_id": "1000", "slurm_job_id": "4242", "qpu_slots": 2},
    {"user_id": "1000", "slurm_job_id": None, "scheduler_job_id": "4242", "other": "ignored"},
    {"user_id": "1000", "slurm_job_id": "4242", "scheduler_job_id": "4243"},
    {"user_id": "1000", "slurm_job_id": " 4242 ", "scheduler_job_id": "4242"},
    {"user_id": "1000", "slurm_job_id": "", "qpu_slots": 1_000_000},
    {"user_id": "1000", "slurm_job_id": "x" * 129},
    {"user_id": "1000", "slurm_job_id": 4242},
    {"user_id": "2147483647"},
    {"user_id": "2147483648"},
    {"user_id": "9999999999"},
    {"user_id": "12345678901"},
    {"user_id": ""},
    {"user_id": " 1000"},
    {"user_id": "1000\n"},
    {"user_id": "\u0661\u0662"},
    {"user_id": 1000},
    {"user_id": None},
    {"user_id": "1000", "qpu_slots": 0},
    {"user_id": "1000", "qpu_slots": True},
    {"user_id": "1000", "qpu_slots": None},
    {"slurm_job_id": "4242"},
    [],
]
TASKS = [
    {"sequence": "{}", "shots": 10},
    {"sequence": {"version": "1"}, "shots": 1_000_000, "other": "ignored"},
    {"sequence": "", "shots": 10},
    {"sequence": {}, "shots": 10},
    {"sequence": [1], "shots": 10},
    {"sequence": 3, "shots": 10},
    {"sequence": None, "shots": 10},
    {"sequence": "{}", "shots": 0},
    {"sequence": "{}", "shots": True},
    {"sequence": "{}", "shots": "10"},
    {"sequence": "{}"},
    {"shots": 1},
    "text",
]


def validated(serializer_class, body, run) -> tuple:
    """(validated data, errors) of ``body`` through ``run(serializer, body)``."""
    serializer = serializer_class(data=body)
    try:
        return dict(run(serializer, body)), None
    except serializers.ValidationError as exc:
        return None, exc.detail


@pytest.mark.parametrize(
    ("serializer_class", "body"),
    [(JobSubmitSerializer, body) for body in SUBMISSIONS]
    + [(SessionCreateSerializer, body) for body in ACQUIRES]
    + [(AcquireSerializer, body) for body in QRMI_ACQUIRES]
    + [(TaskSerializer, body) for body in TASKS],
)
def test_a_request_body_validates_as_drf_validates_it_field_by_field(serializer_class, body):
    ours = validated(serializer_class, body, lambda serializer, data: serializer.run_validation(data))
    drf = validated(
        serializer_class, body, lambda serializer, data: serializers.Serializer.run_validation(serializer, data)
    )
    assert ours == drf


@pytest.mark.parametrize(
    ("serializer_class", "body"),
    [
        (JobSubmitSerializer, {"payload": SEQUENCE, "shots": 10}),
        (JobSubmitSerializer, {"payload": SEQUENCE, "shots": 10, "device": None}),
        (SessionCreateSerializer, {"resource_class": 1, "slots": 2}),
        (SessionCreateSerializer, {"resource_class": 1, "slurm_job_id": "4242", "user": "alice"}),
        (AcquireSerializer, {"user_id": "1000", "slurm_job_id": "4242"}),
        (TaskSerializer, {"sequence": "{}", "shots": 10}),
    ],
)
def test_a_common_request_body_is_validated_without_drf_field_objects(serializer_class, body):
    serializer = serializer_class(data=body)
    assert serializer.is_valid(), serializer.errors
    assert "fields" not in serializer.__dict__  # DRF's cached_property: built and bound on first use


@pytest.mark.parametrize(
    ("serializer_class", "body"), [(SessionCreateSerializer, ACQUIRES[0]), (AcquireSerializer, QRMI_ACQUIRES[0])]
)
def test_a_common_body_refused_by_validate_gets_drfs_error_shape(serializer_class, body):
    """A message of ``validate`` that names no field is a ``non_field_errors`` one either way."""

    class Refusing(serializer_class):
        def validate(self, attrs):
            raise serializers.ValidationError("Refused as a whole.")

    ours = validated(Refusing, body, lambda serializer, data: serializer.run_validation(data))
    drf = validated(Refusing, body, lambda serializer, data: serializers.Serializer.run_validation(serializer, data))
    assert ours == drf == (None, {"non_field_errors": ["Refused as a whole."]})
