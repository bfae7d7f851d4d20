"""django-q2 entry points for scheduling (thin; the work is in passes)."""

import os

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.scheduling import device_status, passes
from apps.scheduling.drivers import emulator, pasqal_cloud
from apps.scheduling.models import Device, DriverRun, Job, JobStatus


def run_pool(pool_id: int) -> dict:
    """Event task: a job was submitted or finished, a device came online, a cancel was asked."""
    return passes.run_pool(pool_id)


def sweep() -> dict:
    return passes.sweep()


def check_device_status(device_id: int) -> str:
    """Ask one device's provider whether it is operational (enqueued by the status pass)."""
    device = Device.objects.filter(pk=device_id).first()
    return device_status.check_device(device) if device else "gone"


def close_open_batches() -> int:
    """Close the Pasqal Cloud batches of sessions that ended (enqueued by the tick)."""
    return pasqal_cloud.close_ended_batches()


def run_emulation(remote_id: str) -> str:
    """Execute one emulator run, then poll and dispatch its pool at once (a device was freed).

    Duplicate deliveries are harmless (the broker's retry, a copy sent by
    ``emulator.recover_runs``, Redis handing a task out twice): the start is a compare-and-set
    on ``queued`` under the row lock, so one delivery runs it and the others skip. The outcome is
    written only if this start is still the run's current one (``attempts``): a worker presumed
    dead whose run was started again elsewhere discards its result.
    """
    with transaction.atomic():
        run = DriverRun.objects.select_for_update().select_related("device").filter(remote_id=remote_id).first()
        if run is None or run.status != "queued":
            return "skipped"  # already started (a duplicate delivery) or cancelled before it started
        run.status, run.started_at = "running", timezone.now()
        run.heartbeat_at = run.started_at
        run.attempts += 1
        run.worker = f"{settings.GRIDGATE_WORKER_HOST}:{os.getpid()}"[:100]
        run.save(update_fields=["status", "started_at", "heartbeat_at", "attempts", "worker"])
    with emulator.Heartbeat(run.pk, run.attempts):  # a killed worker stops beating: recover_runs re-runs it
        emulator.execute(run)  # minutes of CPU at most; no transaction held
    with transaction.atomic():
        current = (
            DriverRun.objects.select_for_update()
            .filter(pk=run.pk, status="running", attempts=run.attempts)
            .values_list("cancel_requested", flat=True)
            .first()
        )
        if current is None:
            return "superseded"  # presumed dead meanwhile: re-run or failed by recover_runs
        if current:
            run.status, run.result, run.error = "cancelled", None, "cancelled while running"
        run.finished_at = timezone.now()
        run.save(update_fields=["status", "result", "error", "logs", "runtime_seconds", "finished_at"])
    # The device is free now: poll this job at once (not at its next scheduled poll) and refill.
    Job.objects.filter(remote_id=run.remote_id, status=JobStatus.RUNNING).update(next_poll_at=None)
    passes.run_pool(run.device.pool_id)
    return run.status
