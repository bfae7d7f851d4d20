from rest_framework import serializers


class BackendSerializer(serializers.Serializer):
    name = serializers.CharField()
    kinds = serializers.ListField(child=serializers.CharField(), help_text="Pool kinds this backend serves here.")


class ChoiceSerializer(serializers.Serializer):
    value = serializers.CharField()
    label = serializers.CharField()


class LaunchOptionSerializer(serializers.Serializer):
    key = serializers.CharField()
    label = serializers.CharField()
    choices = ChoiceSerializer(many=True, help_text="The allowed values (empty for a range option).")
    default = serializers.CharField(allow_null=True)
    minimum = serializers.IntegerField(allow_null=True, help_text="Range options: the smallest whole number allowed.")
    maximum = serializers.IntegerField(allow_null=True, help_text="Range options: the largest whole number allowed.")


class LaunchOptionsSerializer(serializers.Serializer):
    backend = serializers.CharField(allow_null=True)
    options = LaunchOptionSerializer(many=True)
    degraded = serializers.BooleanField()
    message = serializers.CharField(allow_blank=True)
