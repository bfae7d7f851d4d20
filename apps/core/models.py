from django.db import models


class WorkerHeartbeat(models.Model):
    """Last time a worker cluster ran the heartbeat task; read by ``GET /api/v1/health/``."""

    name = models.CharField(max_length=100, primary_key=True)
    seen_at = models.DateTimeField()

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return f"{self.name} @ {self.seen_at:%Y-%m-%d %H:%M:%S}"
