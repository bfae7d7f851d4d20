"""Issue 15: the hot responses' serializers derive their fields from the model once per class."""

from unittest import mock

from rest_framework import serializers

from apps.scheduling.api.serializers import JobSerializer
from apps.scheduling.models import Job
from apps.sessions.api.serializers import SessionSerializer


def test_the_fields_are_derived_from_the_model_once_per_class_not_per_response():
    for serializer in (JobSerializer, SessionSerializer):
        assert serializer().fields  # built here, or by an earlier test
    with mock.patch.object(serializers.ModelSerializer, "build_field", side_effect=AssertionError("rebuilt")):
        for serializer in (JobSerializer, SessionSerializer):
            assert serializer().fields and serializer().fields


def test_each_response_has_its_own_fields_bound_to_it_with_its_own_context():
    """A SerializerMethodField calls its parent's method with the parent's context: fields
    shared between two serializers would answer one request with another's queue info."""
    job = Job(pk=7, shots=1, payload={})
    first = JobSerializer(job, context={"queue_info": {7: ("busy", 1)}})
    second = JobSerializer(job, context={"queue_info": {7: ("waiting", 2)}})
    assert first.fields["queue_position"] is not second.fields["queue_position"]
    assert first.fields["queue_position"].parent is first
    assert (first.data["pending_reason"], first.data["queue_position"]) == ("busy", 1)
    assert (second.data["pending_reason"], second.data["queue_position"]) == ("waiting", 2)
    assert first.fields["status"].parent is first and second.fields["status"].parent is second


def test_the_published_schema_does_not_describe_jobs_and_sessions_with_the_mixins_notes():
    """drf-spectacular takes a serializer's description from the first docstring in its MRO."""
    from drf_spectacular.generators import SchemaGenerator

    schemas = SchemaGenerator().get_schema(request=None, public=True)["components"]["schemas"]
    for name in ("Job", "Session"):
        assert "FieldsBuiltOnce" not in str(schemas[name]) and "py-spy" not in str(schemas[name])
