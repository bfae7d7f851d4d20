"""django-q2 entry points for scheduling (thin; the work is in passes)."""

import logging
import os

from django.conf import settings
from django.db import InterfaceError, OperationalError, transaction
from django.utils import timezone

from apps.core.retry import once_the_database_answers
from apps.scheduling import device_status, passes
from apps.scheduling.drivers import emulator, pasqal_cloud
from apps.scheduling.models import Device, DriverRun, Job, JobStatus

log = logging.getLogger(__name__)


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

    A database that goes away meanwhile (a restart, this worker's connections terminated) costs
    seconds, not the result or the device: the start and the recording of the outcome are tried
    again once it answers (``once_the_database_answers``), the heartbeat going on meanwhile, so
    the finished simulation is recorded by its own worker as soon as the database is back. It
    used to fail the task, leaving the run ``running`` (and its job holding the device) until
    ``recover_runs`` judged the worker dead and ran the simulation again.
    """
    patience = settings.Q_CLUSTER["timeout"]  # the task cannot outlive it anyway
    run = once_the_database_answers(lambda: _start(remote_id), within=patience, what=f"emulation {remote_id}")
    if run is None:
        return "skipped"  # already started (a duplicate delivery) or cancelled before it started
    with emulator.heartbeat(run.pk, run.attempts):  # a killed worker stops beating: recover_runs re-runs it
        emulator.execute(run)  # minutes of CPU at most; no transaction held
        outcome = (run.status, run.result, run.error)
        recorded = once_the_database_answers(
            lambda: _record(run, outcome), within=patience, what=f"emulation {remote_id}: recording its outcome"
        )
    if not recorded:
        return "superseded"  # presumed dead meanwhile: re-run or failed by recover_runs
    try:
        # The device is free now: poll this job at once (not at its next scheduled poll) and refill.
        Job.objects.filter(remote_id=run.remote_id, status=JobStatus.RUNNING).update(next_poll_at=None)
        passes.run_pool(run.device.pool_id)
    except (OperationalError, InterfaceError):  # recorded; the sweep polls and refills within a second
        log.warning("emulation %s: recorded; its pool is left to the sweep (the database is away)", remote_id)
    return run.status


def _start(remote_id: str) -> DriverRun | None:
    """Claim the run (compare-and-set from ``queued``), or None when it is not ours to run."""
    with transaction.atomic():
        run = (
            DriverRun.objects.select_for_update(of=("self",))
            .select_related("device")
            .filter(remote_id=remote_id)
            .first()
        )
        if run is None or run.status != "queued":
            return None
        run.status, run.started_at = "running", timezone.now()
        run.heartbeat_at = run.started_at
        run.attempts += 1
        run.worker = f"{settings.GRIDGATE_WORKER_HOST}:{os.getpid()}"[:100]
        run.save(update_fields=["status", "started_at", "heartbeat_at", "attempts", "worker"])
    return run


def _record(run: DriverRun, outcome: tuple) -> bool:
    """Write the simulation's outcome if this start is still the run's current one; False if it
    is not (superseded, or already ended: also what a second attempt finds after a first whose
    commit went through and whose answer was lost; the sweep then does the rest)."""
    status, result, error = outcome
    with transaction.atomic():
        cancel = (
            DriverRun.objects.select_for_update()
            .filter(pk=run.pk, status="running", attempts=run.attempts)
            .values_list("cancel_requested", flat=True)
            .first()
        )
        if cancel is None:
            return False
        if cancel:
            status, result, error = "cancelled", None, "cancelled while running"
        run.status, run.result, run.error = status, result, error
        run.finished_at = timezone.now()
        run.save(update_fields=["status", "result", "error", "logs", "runtime_seconds", "finished_at"])
    return True
