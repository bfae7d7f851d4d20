from django.conf import settings
from django.db import models
from django.utils import timezone

from apps.core.models import KeepsWorkerColumns


class ApiToken(models.Model):
    """A key for ``Authorization: Token <key>``, stored only as its SHA-256 digest.

    The key is shown once, in the response that creates it (``services.issue_token``): whoever
    reads the database (a backup, a replica, the admin) holds nothing that authenticates. A plain
    SHA-256 is enough here, unlike for passwords: a key is 256 random bits, not something a person
    chose, so there is nothing to guess, and a fast hash keeps the lookup every API request makes
    to one indexed equality match. Tokens expire (``expires_at``, GRIDGATE_TOKEN_DAYS after they
    were issued unless the holder chose another term up to GRIDGATE_TOKEN_MAX_DAYS, never extended
    by use) and all of a user's go when their password changes (``receivers``). ``last_used_at`` is
    written at most once a minute per token (``services.note_use``), not on every request.
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
    # To the minute (services.LAST_USED_RESOLUTION): a write per request would double the
    # statements of every API call for a figure people read in minutes or days.
    last_used_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="When a request last authenticated with it (to the minute)."
    )

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


class Identity(KeepsWorkerColumns, models.Model):
    """A user's account at the centre's identity provider: the (issuer, subject) pair its tokens
    carry. Browser sign-in and API bearer tokens find the user by it, never by a username or an
    e-mail a provider could reassign (apps/accounts/oidc.py)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="identities")
    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)
    last_login_at = models.DateTimeField(null=True, blank=True, help_text="The last browser sign-in.")
    note = models.CharField(
        max_length=200,
        blank=True,
        help_text="Why an operator linked it (a service account's client, a merged account), for the next operator.",
    )
    # The refresh token of the last browser sign-in, sealed (GRIDGATE_CREDENTIALS_KEY): the
    # worker's recheck trades it at the provider every GRIDGATE_OIDC_RECHECK_SECONDS, and a refusal
    # (the user signed out there, disabled, deleted) ends the user's API tokens. Never shown.
    sealed_refresh_token = models.TextField(blank=True, default="", editable=False)
    checked_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="When the provider last confirmed the sign-in."
    )

    class Meta:
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="accounts_identity_unique")]
        ordering = ["issuer", "subject", "id"]
        indexes = [
            # The recheck pass: identities whose sign-in is due to be confirmed again.
            models.Index(fields=["checked_at"], name="accounts_identity_checked"),
        ]
        verbose_name_plural = "identities"

    def __str__(self):
        return f"{self.subject} at {self.issuer}"

    #: kept by sign-ins and the worker's recheck (``apps/accounts/oidc.py``): an edit never writes
    #: back the refresh token it read (rotated since, the old one traded again would end the
    #: user's API tokens)
    WORKER_COLUMNS = ("last_login_at", "sealed_refresh_token", "checked_at")


class LoginRate(models.Model):
    """How many logins one client address attempted in the current window, whatever the
    usernames (``lockout.LoginRateBackend``): one row per address, its window restarted in place.
    In the database, like django-axes' counts, so every web process and host counts the same."""

    address = models.GenericIPAddressField(unique=True)
    window_start = models.DateTimeField()
    attempts = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-window_start", "-id"]
        indexes = [
            # manage.py cleanup: DELETE ... WHERE window_start < an hour ago.
            models.Index(fields=["window_start"], name="accounts_loginrate_window"),
        ]

    def __str__(self):
        return f"{self.address}: {self.attempts} since {self.window_start:%H:%M:%S}"
