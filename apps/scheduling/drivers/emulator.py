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
from django.db.models import F, Q
from django.utils import timezone

from apps.core import leases
from apps.core.exceptions import Unavailable
from apps.scheduling.drivers.base import DeviceDriver, DriverState, PermanentDriverError
from apps.scheduling.drivers.sequences import load_sequence, validate_sequence
from apps.scheduling.models import DriverRun

log = logging.getLogger(__name__)

KNOWN = {"pulser_device", "max_atoms"}
DEFAULT_DEVICE = "AnalogDevice"


def pulser_device(name: str):
    """The Pulser device ``pulser.devices.<name>`` (AnalogDevice, MockDevice, …), or None. Only a
    device: the module also holds the classes ``Device`` and ``VirtualDevice``, which have a
    ``to_abstract_repr`` too, and a driver configured with one failed every submission with a 500."""
    import pulser.devices

    device = getattr(pulser.devices, name, None)
    return device if isinstance(device, pulser.devices.Device | pulser.devices.VirtualDevice) else None


def configured_device(device, name):
    """The Pulser device a Gridgate device's config names; 503 for a config saved before its name
    was checked (it names no Pulser device): the administrator fixes it, the client is not at fault."""
    emulated = pulser_device(name) if isinstance(name, str) else None
    if emulated is None:
        raise Unavailable(f"Device '{device.name}' names no Pulser device ({name!r}): ask an administrator to fix it.")
    return emulated


def available_devices() -> list[str]:
    import pulser.devices

    return sorted(name for name in dir(pulser.devices) if not name.startswith("_") and pulser_device(name) is not None)


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
        emulated = configured_device(device, config.get("pulser_device", DEFAULT_DEVICE))
        validate_sequence(
            payload,
            shots,
            emulated,
            where=f"device '{device.name}' (emulator)",
            max_atoms=config.get("max_atoms", 10),
        )

    def submit(self, device, job):
        remote_id = f"emu-{job.pk}"
        run, created = DriverRun.objects.get_or_create(
            remote_id=remote_id,
            defaults={"device": device, "payload": job.payload, "shots": job.shots, "status": "queued"},
        )
        if created or run.status == "queued":
            # A retried submit of a run still queued re-enqueues it (the first enqueue may have
            # been lost with its worker); run_emulation starts a queued run only once.
            _send(remote_id)
        return remote_id

    def poll(self, device, remote_id):
        # A run whose worker died is not decided here: recover_runs (the tick loop) re-runs it,
        # and meanwhile it is simply not finished.
        run = DriverRun.objects.filter(remote_id=remote_id).first()
        if run is None:
            raise PermanentDriverError(f"The emulator has no run {remote_id}.")
        if run.status == "completed":
            return DriverState(
                "completed", result=run.result, runtime_seconds=run.runtime_seconds, logs=run.logs, started=True
            )
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
        return json.loads(self.specs_text(device))

    def specs_text(self, device):
        name = (device.config or {}).get("pulser_device", DEFAULT_DEVICE)
        return configured_device(device, name).to_abstract_repr()  # Pulser's own text


def dead_after() -> timedelta:
    return timedelta(seconds=settings.GRIDGATE_EMULATOR_DEAD_AFTER)


def _send(remote_id: str) -> None:
    """Send the run's task (after commit) and note when, for :func:`recover_runs`."""
    from apps.core.tasks import enqueue

    DriverRun.objects.filter(remote_id=remote_id, status="queued").update(
        enqueued_at=timezone.now(), enqueues=F("enqueues") + 1
    )
    enqueue("apps.scheduling.tasks.run_emulation", remote_id)


def requeue_delay(enqueues: int) -> timedelta:
    """How long a queued run waits for a worker before its task is sent again: REQUEUE seconds,
    doubling with each send (at most 5 minutes). A run may wait legitimately behind long
    simulations when every worker is busy; the doubling keeps that from filling the broker with
    copies (each copy is harmless: run_emulation starts a queued run once)."""
    base = settings.GRIDGATE_EMULATOR_REQUEUE_SECONDS
    return timedelta(seconds=min(base * 2 ** max(enqueues - 1, 0), max(base, 300)))


RECOVERY_BATCH = 200


def recover_runs(now=None) -> dict:
    """No emulator run is lost or failed because a worker died. Called by the tick loop
    (``scheduling.emulator_recovery``) every few seconds; safe to run anywhere, any time (every
    change is a compare-and-set).

    - A **running** run whose heartbeat is older than ``GRIDGATE_EMULATOR_DEAD_AFTER`` lost its
      worker (killed, OOM, django-q2's task timeout): it goes back to ``queued`` and its task is
      sent again; its job stays running on its device and completes when the re-run does. This is
      judged only once this process has had database contact for DEAD_AFTER
      (``ticker.database_contact_seconds``): during a database outage no worker can beat, so every
      live run looks dead when the database comes back; the workers reconnect and beat within
      GRIDGATE_EMULATOR_HEARTBEAT_SECONDS (settings require DEAD_AFTER ≥ 2 × HEARTBEAT). After
      ``GRIDGATE_EMULATOR_MAX_ATTEMPTS`` starts that all died, the run fails with the count
      (poison-pill protection: a sequence that kills its worker must not kill them all in turn).
      A dead run whose cancel was requested is cancelled.
    - A **queued** run that no worker started within :func:`requeue_delay` of its last send
      (the broker lost the task: Redis hands tasks out without acknowledgement, a killed
      cluster's prefetched tasks die with it) is sent again.
    """
    from apps.core.ticker import database_contact_seconds

    now = now or timezone.now()
    outcome = {"rerun": 0, "failed": 0, "cancelled": 0, "resent": 0}
    emulator_runs = DriverRun.objects.filter(device__driver="emulator")
    cutoff = now - dead_after()
    dead = (
        emulator_runs.filter(status="running")
        .filter(Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True, started_at__lt=cutoff))
        .values_list("remote_id", "attempts", "heartbeat_at", "cancel_requested")[:RECOVERY_BATCH]
    )
    if database_contact_seconds() < settings.GRIDGATE_EMULATOR_DEAD_AFTER:
        dead = []  # back from a database outage (or just started): the live runs have not beaten yet
    limit = settings.GRIDGATE_EMULATOR_MAX_ATTEMPTS
    for remote_id, attempts, beat, cancel in dead:
        # Compare-and-set on the beat we judged: a heartbeat that arrived meanwhile wins.
        same = DriverRun.objects.filter(remote_id=remote_id, status="running", attempts=attempts, heartbeat_at=beat)
        if cancel:
            outcome["cancelled"] += same.update(status="cancelled", error="cancelled", finished_at=now)
        elif attempts >= limit:
            error = (
                f"The emulation's worker died {attempts} times while running it; not retried again "
                "(the run itself may be what kills its worker)."
            )
            if same.update(status="failed", error=error, finished_at=now):
                log.warning("emulation %s: %s", remote_id, error)
                outcome["failed"] += 1
        elif same.update(status="queued", started_at=None, heartbeat_at=None, enqueues=0):
            log.warning("emulation %s: its worker died (start %s of %s); running it again", remote_id, attempts, limit)
            _send(remote_id)
            outcome["rerun"] += 1
    waiting = (
        emulator_runs.filter(status="queued", cancel_requested=False)
        .filter(Q(enqueued_at__isnull=True) | Q(enqueued_at__lt=now - requeue_delay(1)))
        .values_list("remote_id", "enqueued_at", "enqueues")[:RECOVERY_BATCH]
    )
    for remote_id, sent_at, enqueues in waiting:
        if sent_at is not None and sent_at >= now - requeue_delay(enqueues):
            continue
        # Compare-and-set on the send we judged: of two tick loops, one sends.
        if DriverRun.objects.filter(remote_id=remote_id, status="queued", enqueued_at=sent_at).update(
            enqueued_at=now, enqueues=F("enqueues") + 1
        ):
            from apps.core.tasks import enqueue

            log.info("emulation %s: queued but not started after %s sends; sending it again", remote_id, enqueues)
            enqueue("apps.scheduling.tasks.run_emulation", remote_id)
            outcome["resent"] += 1
    return outcome


def heartbeat(run_pk: str, attempt: int) -> leases.Heartbeat:
    """While a simulation runs (CPU-bound, in the worker's main thread; numpy/scipy release the
    GIL often enough), a thread stamps ``heartbeat_at`` every ``GRIDGATE_EMULATOR_HEARTBEAT_SECONDS``
    (a missed beat is retried at the next). It stamps only its own attempt: a worker presumed dead
    whose run was started again elsewhere does not keep the new attempt alive."""
    mine = DriverRun.objects.filter(pk=run_pk, status="running", attempts=attempt)
    return leases.Heartbeat(
        lambda: mine.update(heartbeat_at=timezone.now()),
        every=lambda: settings.GRIDGATE_EMULATOR_HEARTBEAT_SECONDS,
        name=f"heartbeat-{run_pk}",
        what=f"emulation {run_pk}: heartbeat",
    )


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
