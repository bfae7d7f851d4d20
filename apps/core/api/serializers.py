"""The shared serializer base: model rules run once, in ``Model.clean()``, for admin and API."""

import copy

from django.db import models, transaction
from rest_framework import serializers


# FieldsBuiltOnce, for a ModelSerializer: the fields DRF derives from the model are derived once
# per class, and each instance gets its own copy of them. ModelSerializer rebuilds every field
# from the model's metadata for each instance it makes: 0.4-0.65 ms per response of an acquire or
# a submission, about 8 % of their server CPU (py-spy on bench/http_load.py). Each copy is a
# shallow one, bound to its own serializer as DRF binds them (field name, parent, so a
# SerializerMethodField reads its own request's context). A deep copy rebuilt every field from
# its arguments: a job response took 0.16 ms with deep copies, 0.09 with shallow ones. The
# copies share what DRF never changes after building a field (validators, choices, error
# messages); a field with a child field or serializer is deep-copied, as the child's parent
# would otherwise be shared. Only for serializers whose fields depend on nothing but their class
# (not on the instance, the request or the context). (A comment, not a docstring:
# drf-spectacular would publish a mixin's docstring as the description of every serializer
# without one of its own.)
class FieldsBuiltOnce:
    def get_fields(self):
        built = type(self).__dict__.get("_built_fields")
        if built is None:  # two threads may both build it: the same fields, either one is kept
            built = super().get_fields()
            type(self)._built_fields = built
        return {name: _own_copy(field) for name, field in built.items()}


def _own_copy(field):
    if isinstance(field, serializers.BaseSerializer) or hasattr(field, "child") or hasattr(field, "child_relation"):
        return copy.deepcopy(field)
    return copy.copy(field)


class ValidatedModelSerializer(serializers.ModelSerializer):
    """A ModelSerializer that calls ``full_clean()`` before saving.

    DRF does not call ``Model.clean()``; without this, the API would accept what the admin
    refuses. Django ``ValidationError``s propagate and the API's exception handler turns them into
    a 400 keyed by field, with the same messages the admin shows.
    """

    def _split_m2m(self, validated_data):
        m2m = {}
        for field in list(validated_data):
            model_field = self._model_field(field)
            if model_field is not None and model_field.many_to_many:
                m2m[field] = validated_data.pop(field)
        return m2m

    def _model_field(self, name):
        try:
            return self.Meta.model._meta.get_field(name)
        except Exception:
            return None

    def full_clean(self, instance):
        instance.full_clean()

    def create(self, validated_data):
        m2m = self._split_m2m(validated_data)
        instance = self.Meta.model(**validated_data)
        with transaction.atomic():
            self.full_clean(instance)
            instance.save()
            for field, value in m2m.items():
                getattr(instance, field).set(value)
        return instance

    def update(self, instance, validated_data):
        m2m = self._split_m2m(validated_data)
        for field, value in validated_data.items():
            setattr(instance, field, value)
        with transaction.atomic():
            self.full_clean(instance)
            instance.save()
            for field, value in m2m.items():
                getattr(instance, field).set(value)
        return instance


def model_choices(field: models.Field) -> list[str]:
    return [value for value, _ in field.choices]
