from django.conf import settings
from django.db import models
from django.utils import timezone


class ApiToken(models.Model):
    """A key for ``Authorization: Token <key>``, stored only as its SHA-256 digest.

    The key is shown once, in the response that creates it (``services.issue_token``): whoever
    reads the database (a backup, a replica, the admin) holds nothing that authenticates. A plain
    SHA-256 is enough here, unlike for passwords: a key is 256 random bits, not something a person
    chose, so there is nothing to guess, and a fast hash keeps the lookup every API request makes
    to one indexed equality match. Tokens expire (``expires_at``, GRIDGATE_TOKEN_DAYS after they
    were issued, never extended by use: no write per request) and all of a user's go when their
    password changes (``receivers``).
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    digest = models.CharField(max_length=64, unique=True, editable=False, help_text="SHA-256 (hex) of the key.")
    prefix = models.CharField(
        max_length=8, editable=False, help_text="The key's first characters, to tell which token a client holds."
    )
    name = models.CharField(max_length=100, blank=True, help_text="What the token is for, as its client named it.")
    # A default rather than auto_now_add: the migration of DRF's tokens keeps their creation time.
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    expires_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            # The admin's list, newest first.
            models.Index(fields=["-created_at", "-id"], name="accounts_token_recent"),
            # manage.py cleanup: DELETE ... WHERE expires_at <= now.
            models.Index(fields=["expires_at"], name="accounts_token_expires"),
        ]
        verbose_name = "API token"

    def __str__(self):
        return f"{self.prefix}… ({self.name})" if self.name else f"{self.prefix}…"

    @property
    def expired(self) -> bool:
        return self.expires_at <= timezone.now()
