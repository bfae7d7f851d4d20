"""The link between a Django user and a Unix account (SPEC §7b, R-QRMI-2)."""

from django.conf import settings
from django.db import models
from django.utils import timezone


class UnixAccount(models.Model):
    """A user's Unix identity on the cluster: MUNGE credentials carry a uid, this maps it to the
    user. One uid belongs to at most one user (unique); users without a cluster account have no
    row or an empty uid."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="unix_account")
    unix_uid = models.PositiveIntegerField(
        "Unix uid",
        null=True,
        blank=True,
        unique=True,
        help_text="The user's numeric uid on the cluster (what MUNGE credentials from their jobs carry).",
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "Unix account"
        ordering = ["unix_uid", "id"]

    def __str__(self):
        return f"{self.user} (uid {self.unix_uid if self.unix_uid is not None else '-'})"
