from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models


class KeepsWorkerColumns:
    """A model some of whose columns only a worker, a pass or a service's UPDATE writes (a
    counter, a status, a rotated token): a full ``save()`` of an existing row (an edit in the
    admin or the API, which read the row earlier) leaves them out, so it never writes back what
    was written since it read. ``save(update_fields=...)`` and inserts are unchanged."""

    #: the columns a full save of an existing row leaves out
    WORKER_COLUMNS: tuple[str, ...] = ()

    def kept_columns(self) -> set[str]:
        return set(self.WORKER_COLUMNS)

    def save(self, *args, **kwargs):
        if not self._state.adding and kwargs.get("update_fields") is None:
            kept = self.kept_columns()
            kwargs["update_fields"] = [
                f.attname for f in self._meta.concrete_fields if not f.primary_key and f.attname not in kept
            ]
        super().save(*args, **kwargs)


class WorkerHeartbeat(models.Model):
    """Last time a worker cluster ran the heartbeat task; read by ``GET /api/v1/health/``."""

    name = models.CharField(max_length=100, primary_key=True)
    seen_at = models.DateTimeField()

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return f"{self.name} @ {self.seen_at:%Y-%m-%d %H:%M:%S}"


class IdempotencyKey(models.Model):
    """A POST answered once per (user, Idempotency-Key) (SPEC §7, ``apps.core.idempotency``).

    Usually inserted in the same transaction as the work and its stored response, so it is never
    seen in flight. Endpoints whose work commits on its own (a case launch) commit the row first with
    ``locked_until``: ``response_status`` null and ``locked_until`` past means its request died, and
    the next retry takes the key over. Only successful (2xx) responses are kept.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=64, help_text="SHA-256 of method, path and body.")
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    response_body = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder)
    locked_until = models.DateTimeField(
        null=True, blank=True, help_text="While in flight (leased keys only): until when a repeat must wait."
    )
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "id"]
        constraints = [models.UniqueConstraint(fields=["user", "key"], name="core_idempotency_user_key")]

    def __str__(self):
        return f"{self.user_id}:{self.key}"


class Lease(models.Model):
    """A named, expiring claim: one ticker loop per kind across all worker clusters."""

    name = models.CharField(max_length=100, primary_key=True)
    owner = models.CharField(max_length=200)
    expires_at = models.DateTimeField()

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return f"{self.name} held by {self.owner} until {self.expires_at:%H:%M:%S}"
