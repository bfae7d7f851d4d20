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
import threading
import time
from datetime import timedelta

from django.utils import timezone

from apps.scheduling.drivers import DeviceDriver, DriverState, PermanentDriverError
from apps.scheduling.drivers.sequences import load_sequence, validate_sequence
from apps.scheduling.models import DriverRun

log = logging.getLogger(__name__)

KNOWN = {"pulser_device", "max_atoms"}
# A running simulation's worker writes ``heartbeat_at`` every HEARTBEAT_SECONDS; a run whose last
# sign of life is older than DEAD_AFTER has lost its worker (killed, or stopped at django-q2's task
# timeout) and is failed at the next poll, freeing its device within about 30 s instead of the task
# timeout + 60 s it took before (issue 16, item 9).
HEARTBEAT_SECONDS = 5.0
DEAD_AFTER = timedelta(seconds=30)
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
        if run.status == "running" and is_dead(run):
            # Its worker died mid-simulation: nothing will ever finish it. Fail it, so the
            # device's capacity comes back. Compare-and-set: a heartbeat that just arrived wins.
            DriverRun.objects.filter(pk=run.pk, status="running", heartbeat_at=run.heartbeat_at).update(
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


def is_dead(run: DriverRun) -> bool:
    last_sign = run.heartbeat_at or run.started_at
    return last_sign is not None and timezone.now() - last_sign > DEAD_AFTER


class Heartbeat:
    """While a simulation runs (CPU-bound, in the worker's main thread), a thread with its own
    database connection stamps ``heartbeat_at`` every HEARTBEAT_SECONDS. The simulation releases
    the GIL often enough (numpy/scipy) for it to keep time."""

    def __init__(self, run_pk: str):
        self.run_pk = run_pk
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, name=f"heartbeat-{run_pk}", daemon=True)

    def _beat(self) -> None:
        from django.db import connection

        try:
            while not self.stop.wait(HEARTBEAT_SECONDS):
                DriverRun.objects.filter(pk=self.run_pk, status="running").update(heartbeat_at=timezone.now())
        except Exception:  # a missed beat is retried at the next; never kill the simulation
            log.exception("emulation %s: heartbeat failed", self.run_pk)
        finally:
            connection.close()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc_info):
        self.stop.set()
        self.thread.join()


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
