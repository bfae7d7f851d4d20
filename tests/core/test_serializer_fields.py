"""The job and session responses are written out (``to_representation``), and say what DRF's
field-by-field loop over the same declared fields says: those declarations are what the
published schema describes."""

import re
from datetime import UTC, datetime, timedelta, timezone

import pytest
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer

from apps.scheduling.api.serializers import JobSerializer
from apps.scheduling.models import Job, JobStatus
from apps.scheduling.selectors import Waiting
from apps.sessions.api.serializers import SessionSerializer
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
        serializer = JobSerializer(job, context={"queue_info": {42: Waiting("device_busy", 3, 12.5, 4.0)}})
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
    info = {1: Waiting("device_busy", 1, 0.0, 1.0), 2: Waiting("share_exhausted", 2, 60.0, 5.0)}
    data = JobSerializer([first, second], many=True, context={"queue_info": info}).data
    assert [(job["pending_code"], job["queue_position"], job["eta_seconds"]) for job in data] == [
        ("device_busy", 1, 0.0),
        ("share_exhausted", 2, 60.0),
    ]


def test_the_published_schema_does_not_describe_jobs_and_sessions_with_implementation_notes():
    """drf-spectacular takes a component's description from the serializer's docstrings."""
    from drf_spectacular.generators import SchemaGenerator

    schemas = SchemaGenerator().get_schema(request=None, public=True)["components"]["schemas"]
    for name in ("Job", "Session"):
        assert not re.search(r"\bissue \d", str(schemas[name]), re.IGNORECASE)
        assert "field-by-field" not in str(schemas[name])
