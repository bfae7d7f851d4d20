"""The shared serializer base: model rules run once, in ``Model.clean()``, for admin and API."""

from django.db import models, transaction
from rest_framework import serializers

_DATETIME = serializers.DateTimeField()


def times(*values) -> list:
    """``values`` (datetimes or None) as the API gives every date and time: DRF's own
    ``DateTimeField`` representation (ISO 8601 in the current time zone, UTC as ``Z``)."""
    return [None if value is None else _DATETIME.to_representation(value) for value in values]


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
        return self._clean_and_save(self.Meta.model(**validated_data), m2m)

    def update(self, instance, validated_data):
        m2m = self._split_m2m(validated_data)
        for field, value in validated_data.items():
            setattr(instance, field, value)
        return self._clean_and_save(instance, m2m)

    def _clean_and_save(self, instance, m2m: dict):
        """Clean and save ``instance`` and set its many-to-many values, in one transaction."""
        with transaction.atomic():
            self.full_clean(instance)
            instance.save()
            for field, value in m2m.items():
                getattr(instance, field).set(value)
        return instance


def model_choices(field: models.Field) -> list[str]:
    return [value for value, _ in field.choices]
