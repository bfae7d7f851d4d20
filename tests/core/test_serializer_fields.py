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


def test_binding_a_copy_leaves_the_class_fields_unbound_and_a_child_field_gets_its_own_copy():
    """The per-response copies are shallow: binding one must not bind the fields every later
    response copies, and a field holding a child (ListField, nested serializers) is copied
    whole, or one response's child would answer to another's parent."""
    from apps.core.api.serializers import FieldsBuiltOnce

    class WithChild(FieldsBuiltOnce, serializers.ModelSerializer):
        tags = serializers.ListField(child=serializers.CharField(), read_only=True, source="payload")

        class Meta:
            model = Job
            fields = ["id", "status", "tags"]

    first, second = WithChild(Job(pk=1)).fields, WithChild(Job(pk=2)).fields
    assert first["status"] is not second["status"] and first["status"].field_name == "status"
    assert all(field.parent is None and field.field_name is None for field in WithChild._built_fields.values())
    assert first["tags"].child is not second["tags"].child
    assert first["tags"].child.parent is first["tags"] and second["tags"].child.parent is second["tags"]


def test_the_published_schema_does_not_describe_jobs_and_sessions_with_the_mixins_notes():
    """drf-spectacular takes a serializer's description from the first docstring in its MRO."""
    from drf_spectacular.generators import SchemaGenerator

    schemas = SchemaGenerator().get_schema(request=None, public=True)["components"]["schemas"]
    for name in ("Job", "Session"):
        assert "FieldsBuiltOnce" not in str(schemas[name]) and "py-spy" not in str(schemas[name])
