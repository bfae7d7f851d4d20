"""The ``fake`` driver: scripted states and injectable failures, for tests and demos.

Device ``config``:
- ``script``: states reported by successive polls, default ``["running", "completed"]``
  (the last state repeats);
- ``fail_submit``: ``"transient"`` or ``"permanent"`` makes submits fail that way;
  ``fail_submit_times``: only while the job has fewer than N recorded failures (default: always);
- ``fail_polls``: the first N polls raise a transient error;
- ``runtime_seconds``: device time reported at completion (default 1.0);
- ``result``: the result reported at completion (default ``{"counts": {"0": shots}}``).
"""

from django.db import transaction

from apps.scheduling.drivers.base import DeviceDriver, DriverState, PermanentDriverError, TransientDriverError
from apps.scheduling.models import DriverRun

KNOWN = {"script", "fail_submit", "fail_submit_times", "fail_polls", "runtime_seconds", "result"}
STATES = {"running", "completed", "failed", "cancelled"}


class FakeDriver(DeviceDriver):
    name = "fake"

    def validate_config(self, config):
        problems = [f"unknown key '{k}' for the fake driver" for k in config if k not in KNOWN]
        script = config.get("script", [])
        if not isinstance(script, list) or any(s not in STATES for s in script):
            problems.append(f"'script' must be a list of {sorted(STATES)}")
        if config.get("fail_submit") not in (None, "transient", "permanent"):
            problems.append("'fail_submit' must be 'transient' or 'permanent'")
        return problems

    def submit(self, device, job):
        remote_id = f"fake-{job.pk}"
        config = device.config or {}
        mode = config.get("fail_submit")
        # job.attempts counts the transient failures the scheduler already recorded for it.
        if mode and job.attempts < config.get("fail_submit_times", 10**9):
            error = TransientDriverError if mode == "transient" else PermanentDriverError
            raise error(f"fake device refused the job ({mode})")
        DriverRun.objects.get_or_create(  # idempotent: a retried submit adopts the existing run
            remote_id=remote_id,
            defaults={"device": device, "payload": job.payload, "shots": job.shots, "status": "running"},
        )
        return remote_id

    def poll(self, device, remote_id):
        config = device.config or {}
        with transaction.atomic():
            run = DriverRun.objects.select_for_update().get(remote_id=remote_id)
            run.polls += 1
            run.save(update_fields=["polls"])
        if run.polls <= config.get("fail_polls", 0):
            raise TransientDriverError(f"fake device unreachable (poll {run.polls})")
        if run.cancel_requested:
            return DriverState("cancelled", logs="cancelled on request\n", started=True)
        script = config.get("script") or ["running", "completed"]
        state = script[min(run.polls - 1, len(script) - 1)]
        if state == "completed":
            result = config.get("result") or {"counts": {"0": run.shots}}
            return DriverState(
                "completed",
                result=result,
                runtime_seconds=float(config.get("runtime_seconds", 1.0)),
                logs="done\n",
                started=True,
            )
        if state == "failed":
            return DriverState("failed", error="fake device reported a failure", started=True)
        return DriverState(state, started=True)

    def cancel(self, device, remote_id):
        DriverRun.objects.filter(remote_id=remote_id).update(cancel_requested=True)

    def specs(self, device):
        return {"driver": "fake", "script": (device.config or {}).get("script", ["running", "completed"])}
