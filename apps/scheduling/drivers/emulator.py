"""The ``emulator`` driver: runs Pulser sequences with pulser-simulation (QutipEmulator).

A submission becomes a ``DriverRun`` and a worker task (``apps.scheduling.tasks.run_emulation``)
that simulates the sequence and samples ``shots`` bitstrings; polls read the run. So the
emulator behaves like a remote QPU with its own queue, and a worker restart loses nothing that
was accepted.

Device ``config``: ``pulser_device`` (the Pulser device it emulates, default ``AnalogDevice``;
sequences built for another device are refused), ``max_atoms`` (default 10: the state space
doubles per atom).
"""

import json
import logging
import time
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from apps.scheduling.drivers import DeviceDriver, DriverState, PermanentDriverError
from apps.scheduling.drivers.sequences import load_sequence, validate_sequence
from apps.scheduling.models import DriverRun

log = logging.getLogger(__name__)

KNOWN = {"pulser_device", "max_atoms"}
# Longer than django-q2's task timeout (GRIDGATE_Q_TIMEOUT): a run "running" for longer has lost
# its worker.
STALE_RUN = timedelta(seconds=settings.Q_CLUSTER["timeout"] + 60)
DEFAULT_DEVICE = "AnalogDevice"


def pulser_device(name: str):
    import pulser.devices

    device = getattr(pulser.devices, name, None)
    if device is None or not hasattr(device, "to_abstract_repr"):
        return None
    return device


def available_devices() -> list[str]:
    import pulser.devices

    return sorted(
        name
        for name in dir(pulser.devices)
        if not name.startswith("_") and hasattr(getattr(pulser.devices, name), "to_abstract_repr")
    )


class EmulatorDriver(DeviceDriver):
    name = "emulator"

    def validate_config(self, config):
        problems = [f"unknown key '{k}' for the emulator driver" for k in config if k not in KNOWN]
        name = config.get("pulser_device", DEFAULT_DEVICE)
        if not isinstance(name, str) or pulser_device(name) is None:
            problems.append(f"'pulser_device' must be one of {', '.join(available_devices())}")
        max_atoms = config.get("max_atoms", 10)
        if isinstance(max_atoms, bool) or not isinstance(max_atoms, int) or not 1 <= max_atoms <= 16:
            problems.append("'max_atoms' must be a whole number from 1 to 16")
        return problems

    def validate_payload(self, device, payload, shots):
        """R-DEV-1 against the emulated Pulser device, plus the emulator's own ``max_atoms``."""
        config = device.config or {}
        emulated = pulser_device(config.get("pulser_device", DEFAULT_DEVICE))
        validate_sequence(
            payload,
            shots,
            emulated,
            where=f"device '{device.name}' (emulator)",
            max_atoms=config.get("max_atoms", 10),
        )

    def submit(self, device, job):
        from apps.core.tasks import enqueue

        remote_id = f"emu-{job.pk}"
        run, created = DriverRun.objects.get_or_create(
            remote_id=remote_id,
            defaults={"device": device, "payload": job.payload, "shots": job.shots, "status": "queued"},
        )
        if created or run.status == "queued":
            # A retried submit of a run still queued re-enqueues it (the first enqueue may have
            # been lost with its worker); run_emulation starts a queued run only once.
            enqueue("apps.scheduling.tasks.run_emulation", remote_id)
        return remote_id

    def poll(self, device, remote_id):
        run = DriverRun.objects.filter(remote_id=remote_id).first()
        if run is None:
            raise PermanentDriverError(f"The emulator has no run {remote_id}.")
        if run.status == "completed":
            return DriverState(
                "completed", result=run.result, runtime_seconds=run.runtime_seconds, logs=run.logs, started=True
            )
        if run.status == "running" and run.started_at and timezone.now() - run.started_at > STALE_RUN:
            # Its worker died mid-simulation (killed, or past the task timeout): nothing will
            # ever finish it. Fail it, so the device's capacity comes back.
            DriverRun.objects.filter(pk=run.pk, status="running").update(
                status="failed", error="The emulation's worker stopped before it finished.", finished_at=timezone.now()
            )
            return DriverState("failed", error="The emulation's worker stopped before it finished.", started=True)
        if run.status in ("failed", "cancelled"):
            return DriverState(
                run.status, error=run.error, logs=run.logs, runtime_seconds=run.runtime_seconds, started=True
            )
        return DriverState("running", started=run.status == "running")

    def cancel(self, device, remote_id):
        # A queued run is dropped before it starts; a simulation in progress finishes (QutipEmulator
        # cannot be interrupted) and its result is discarded.
        DriverRun.objects.filter(remote_id=remote_id, status__in=["queued", "running"]).update(cancel_requested=True)
        DriverRun.objects.filter(remote_id=remote_id, status="queued").update(status="cancelled", error="cancelled")

    def specs(self, device):
        name = (device.config or {}).get("pulser_device", DEFAULT_DEVICE)
        return json.loads(pulser_device(name).to_abstract_repr())


def execute(run: DriverRun) -> None:
    """Simulate ``run`` and store its outcome (called by the worker task)."""
    import warnings

    from pulser_simulation import QutipEmulator

    started = time.monotonic()
    try:
        sequence = load_sequence(run.payload)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            results = QutipEmulator.from_sequence(sequence).run()
        counts = results.sample_final_state(N_samples=run.shots)
        run.result = {"counts": {str(k): int(v) for k, v in sorted(counts.items())}}
        run.status = "completed"
        run.logs = f"simulated {len(sequence.register.qubit_ids)} atoms, {run.shots} shots\n"
    except Exception as exc:
        log.exception("emulation %s failed", run.remote_id)
        run.status, run.error = "failed", f"{type(exc).__name__}: {exc}"[:2000]
    run.runtime_seconds = time.monotonic() - started
