from django.contrib.auth import get_user_model
from rest_framework import serializers

from apps.accounts.models import ApiToken

_username = get_user_model()._meta.get_field(get_user_model().USERNAME_FIELD)


class TokenRequestSerializer(serializers.Serializer):
    # The model's limit: a longer name cannot exist, and django-axes records the name tried.
    username = serializers.CharField(max_length=_username.max_length)
    password = serializers.CharField(trim_whitespace=False, style={"input_type": "password"})
    name = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=ApiToken._meta.get_field("name").max_length,
        help_text="What the token is for (a host, a tool): shown to operators next to it.",
    )


class TokenResponseSerializer(serializers.Serializer):
    token = serializers.CharField(help_text="The key, shown this once: send it as `Authorization: Token <key>`.")
    expires_at = serializers.DateTimeField(help_text="After this, log in again for a new token.")
