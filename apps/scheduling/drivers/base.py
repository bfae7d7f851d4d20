"""The contract every device driver implements, and what drivers raise and return.

The scheduler calls ``submit``, ``poll`` and ``cancel`` outside any database transaction
(R-SCHED-4) and never reads a driver's own state names.
"""

import json
from dataclasses import dataclass


class DriverError(Exception):
    """Base of the errors a driver raises."""


class TransientDriverError(DriverError):
    """Try again later: the job goes back to the queue and the session is not charged (R-JOB-3)."""


class PermanentDriverError(DriverError):
    """The job cannot run: it fails with this message (R-JOB-3)."""


class UndecidedSubmission(PermanentDriverError):
    """The submission's answer was lost and the provider cannot tell whether it created the job:
    the job ends ``unknown`` for an operator, never submitted a second time."""


class SubmissionPending(DriverError):
    """The submission's answer was lost and the provider may still be creating the job: the job
    keeps its device (a second job sent there meanwhile could be dropped by the late one, or run
    beside it) and its hand-over is asked again at ``retry_at``, when the driver looks once more.
    Neither a failure nor a retry of the send."""

    def __init__(self, message: str, *, retry_at):
        super().__init__(message)
        self.retry_at = retry_at


class InvalidPayload(DriverError):
    """Refused at submission with a 400 and this message."""


@dataclass
class DriverState:
    """What a poll says. ``status`` is one of running, completed, failed, cancelled (or unknown:
    the job's fate cannot be known, see ``UndecidedSubmission``)."""

    status: str
    result: dict | None = None
    error: str = ""
    logs: str = ""
    runtime_seconds: float | None = None
    started: bool = False


@dataclass
class ProviderStatus:
    """What a real device's provider says about it (the worker's status pass, never a request):
    ``status`` is ``up``, ``down`` or ``unreachable``; ``specs`` its Pulser device when known."""

    status: str
    message: str = ""
    specs: dict | None = None
    specs_text: str = ""  # the specs exactly as the provider sent them (key order included)


class DeviceDriver:
    name = ""
    # A device of a driver with a provider is online only while the provider says it is up, and
    # its specs come from the provider (SPEC §5); the worker asks it through ``check_status``.
    has_provider = False
    # The most jobs the device may run at once, whatever its ``max_concurrent_jobs`` (None: no cap).
    max_concurrency: int | None = None

    def validate_config(self, config: dict) -> list[str]:
        return []

    def validate_payload(self, device, payload: dict, shots: int) -> None:
        """Raise InvalidPayload when the job could never run on this device."""

    def submit(self, device, job) -> str:
        """Start the job; return its remote id. Must be idempotent per job: a retried submit of
        the same job returns the existing remote id instead of starting it twice."""
        raise NotImplementedError

    def poll(self, device, remote_id: str) -> DriverState:
        raise NotImplementedError

    def cancel(self, device, remote_id: str) -> None:
        raise NotImplementedError

    def specs(self, device) -> dict:
        return {"driver": self.name}

    def specs_text(self, device) -> str:
        """The specs as a JSON string (QRMI ``target()``): a provider's own text where it sent one."""
        return json.dumps(self.specs(device))

    def check_status(self, device) -> ProviderStatus | None:
        """Ask the provider whether the device is operational (worker only; may be slow)."""
        return None
