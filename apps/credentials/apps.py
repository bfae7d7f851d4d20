from django.apps import AppConfig


class CredentialsConfig(AppConfig):
    """Per-user remote credentials: connecting, sealing, refreshing, disconnecting (docs/backends.md,
    "Per-user credentials"). Backends ask it for a case's :class:`RemoteIdentity` and never read a
    stored credential themselves."""

    name = "apps.credentials"
    label = "credentials"
    verbose_name = "Remote credentials"
