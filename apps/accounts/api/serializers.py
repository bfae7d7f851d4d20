from django.contrib.auth import get_user_model
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.accounts.models import ApiToken

_username = get_user_model()._meta.get_field(get_user_model().USERNAME_FIELD)
# The bounds are the service's (services.issue_token), which names the field when it refuses.
EXPIRES_IN_DAYS_HELP = (
    "How many days the token lasts: GRIDGATE_TOKEN_DAYS (default 90) when absent; from 1 to "
    "GRIDGATE_TOKEN_MAX_DAYS (default 365)."
)


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
    expires_in_days = serializers.IntegerField(required=False, help_text=EXPIRES_IN_DAYS_HELP)


class TokenResponseSerializer(serializers.Serializer):
    id = serializers.IntegerField(help_text="The token's `id`: `DELETE /auth/tokens/{id}/` revokes it (logging out).")
    token = serializers.CharField(help_text="The key, shown this once: send it as `Authorization: Token <key>`.")
    expires_at = serializers.DateTimeField(help_text="After this, log in again for a new token.")


class ApiTokenSerializer(serializers.ModelSerializer):
    """A token as its holder sees it in the list: never its key (not stored) nor its digest."""

    expired = serializers.BooleanField(read_only=True, help_text="Past `expires_at`: it answers 401 now.")

    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "created_at", "expires_at", "last_used_at", "expired"]
        read_only_fields = fields
        extra_kwargs = {
            "prefix": {"help_text": "The key's first 8 characters, to tell which token a client holds."},
            "last_used_at": {"help_text": "When a request last authenticated with it, to the minute; null: never."},
        }


class ApiTokenCreateSerializer(serializers.Serializer):
    name = serializers.CharField(
        max_length=ApiToken._meta.get_field("name").max_length,
        help_text="What the token is for (a host, a script): shown in your list and to operators.",
    )
    expires_in_days = serializers.IntegerField(required=False, help_text=EXPIRES_IN_DAYS_HELP)


class ApiTokenCreatedSerializer(serializers.ModelSerializer):
    """A token just issued, with its key (``context["key"]``): the only answer that ever holds it."""

    token = serializers.SerializerMethodField()

    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "created_at", "expires_at", "token"]
        read_only_fields = fields

    @extend_schema_field(
        serializers.CharField(help_text="The key, shown this once: send it as `Authorization: Token <key>`.")
    )
    def get_token(self, obj) -> str:
        return self.context["key"]
