"""django-q2 entry points for scheduling (thin; the work is in services)."""

from django.conf import settings
from django.db import transaction

from apps.core.tasks import run_ticker
from apps.scheduling import services
from apps.scheduling.drivers import emulator
from apps.scheduling.models import DriverRun


def run_pool(pool_id: int) -> dict:
    """Event task: a job was submitted or finished, a device came online, a cancel was asked."""
    return services.run_pool(pool_id)


def sweep() -> dict:
    return services.sweep()


def tick() -> int:
    """Minutely schedule: ~55 s of sweeps every GRIDGATE_DISPATCH_TICK seconds, one loop across
    all clusters (lease), so polls and dispatch keep a sub-minute cadence between events."""
    return run_ticker("scheduling.tick", services.sweep, interval=settings.GRIDGATE_DISPATCH_TICK, duration=55)


def run_emulation(remote_id: str) -> str:
    """Execute one emulator run, then poll and dispatch its pool at once (a device was freed)."""
    with transaction.atomic():
        run = DriverRun.objects.select_for_update().select_related("device").filter(remote_id=remote_id).first()
        if run is None or run.status != "queued":
            return "skipped"  # already executed (task retried) or cancelled before it started
        run.status = "running"
        run.save(update_fields=["status"])
    emulator.execute(run)  # minutes of CPU at most; no transaction held
    with transaction.atomic():
        cancelled = DriverRun.objects.select_for_update().values_list("cancel_requested", flat=True).get(pk=run.pk)
        if cancelled:
            run.status, run.result, run.error = "cancelled", None, "cancelled while running"
        run.save(update_fields=["status", "result", "error", "logs", "runtime_seconds"])
    services.run_pool(run.device.pool_id)
    return run.status
