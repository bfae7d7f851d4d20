"""The per-user remote credential, kept sealed (docs/backends.md, "Per-user credentials"; how it is
made, used and ended: ``apps.credentials.services``; how it is sealed: ``apps.credentials.sealing``)."""

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _


class ConnectionState(models.TextChoices):
    CONNECTED = "connected", "Connected"
    #: the provider refused the stored credential (invalid_grant, 401): the user must reconnect
    FAILED = "failed", "Failed: reconnect"


class RemoteConnection(models.Model):
    """One user's own credential for one pool's provider.

    ``sealed_secret`` holds the Fernet token of the refresh token (FirecREST) or API token
    (Qarnot): ciphertext only, never shown, returned, logged or put in a form. ``subject`` is the
    provider's name for the account the credential belongs to (the token's ``sub``, Qarnot's
    account e-mail): what the user's cases record as the identity they ran under.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="remote_connections")
    pool = models.ForeignKey("resources.ResourcePool", on_delete=models.CASCADE, related_name="remote_connections")
    state = models.CharField(max_length=16, choices=ConnectionState.choices, default=ConnectionState.CONNECTED)
    sealed_secret = models.TextField(
        editable=False, help_text=_("Fernet ciphertext under GRIDGATE_CREDENTIALS_KEY; never shown.")
    )
    subject = models.CharField(
        max_length=255, blank=True, default="", help_text=_("The provider's subject (sub) or account.")
    )
    provider_username = models.CharField(max_length=255, blank=True, default="")
    issuer = models.CharField(max_length=255, blank=True, default="", help_text=_("The token's issuer (iss)."))
    connected_at = models.DateTimeField()
    last_refreshed_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    failure = models.CharField(
        max_length=500, blank=True, default="", help_text=_("Why the provider refused it (no secret).")
    )
    #: bumped whenever the sealed credential changes: an access token a process cached for an
    #: older generation (before a reconnect) is not used again
    generation = models.PositiveIntegerField(default=1, editable=False)
    #: the pool's provider URLs when the user connected (``services.provider_urls``): the
    #: credential is never sent anywhere else; a pool moved to other URLs needs a reconnect
    provider_urls = models.JSONField(default=dict, blank=True, editable=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "backends_remoteconnection"  # made by the backends app, which held the model first
        ordering = ["user_id", "pool_id", "id"]
        constraints = [
            models.UniqueConstraint(fields=["user", "pool"], name="backends_connection_one_per_pool"),
            models.CheckConstraint(
                condition=~Q(sealed_secret=""),
                name="backends_connection_sealed",
                violation_error_message="A connection holds its sealed credential.",
            ),
        ]
        # The unique constraint's index (user, pool) serves the ordering and every lookup: a case's
        # owner and pool, the user's page, the pass's bulk read of its owners' connections.

    def __str__(self):
        return f"{self.user} on {self.pool} ({self.state})"

    @property
    def is_connected(self) -> bool:
        return self.state == ConnectionState.CONNECTED
