from types import SimpleNamespace

from rest_framework import serializers

from apps.backends import registry
from apps.backends.remote import provider


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


#: what a connection's fields read when the caller has none to the pool
NOT_CONNECTED = SimpleNamespace(
    state="not_connected", subject="", connected_at=None, last_refreshed_at=None, failed_at=None, failure=""
)


class ConnectionSerializer(serializers.Serializer):
    """A pool that runs cases under each user's own credentials, and the caller's connection to it.
    Never carries the credential (it is not a field of anything the API returns)."""

    pool = serializers.IntegerField(source="pool.pk")
    pool_name = serializers.CharField(source="pool.name")
    kind = serializers.CharField(source="pool.kind")
    state = serializers.ChoiceField(
        source="connection.state",
        choices=["not_connected", "connected", "failed"],
        help_text="failed: the provider refused the stored credential (expired or revoked): reconnect.",
    )
    subject = serializers.CharField(
        source="connection.subject",
        allow_blank=True,
        help_text="The provider's identity of the connected account (its subject or e-mail).",
    )
    connected_at = serializers.DateTimeField(source="connection.connected_at", allow_null=True)
    last_refreshed_at = serializers.DateTimeField(source="connection.last_refreshed_at", allow_null=True)
    failed_at = serializers.DateTimeField(source="connection.failed_at", allow_null=True)
    failure = serializers.CharField(source="connection.failure", allow_blank=True)
    connect_url = serializers.CharField(help_text="The page where the user connects (a browser flow).")

    def to_representation(self, row):
        return super().to_representation({**row, "connection": row["connection"] or NOT_CONNECTED})


class DisconnectedSerializer(serializers.Serializer):
    """``DELETE /connections/{pool}/``: the credential is forgotten; ``revoked`` says what became of
    the grant at the provider (true: revoked; false: it could not be, ``detail`` says why and what
    to do; null: nothing to revoke, a pasted API token or access key stays the user's own)."""

    revoked = serializers.BooleanField(allow_null=True)
    detail = serializers.CharField()


class ConnectionCredentialSerializer(serializers.Serializer):
    """``PUT /connections/{pool}/``: the credential a pool of that kind takes from its user, checked
    with the provider before it is kept (sealed): the fields its provider's ``paste`` names,
    Qarnot's API ``token``, or Run:AI's access key (``client_id`` and ``client_secret``). FirecREST
    connects in the browser (``connect_url``)."""

    def get_fields(self):
        fields = {}
        for name in registry.BACKENDS:
            paste = getattr(provider(name), "paste", None)
            for field, label, _secret in paste.fields if paste else ():
                fields.setdefault(
                    field,
                    serializers.CharField(required=False, write_only=True, max_length=paste.limit, help_text=label),
                )
        return fields
