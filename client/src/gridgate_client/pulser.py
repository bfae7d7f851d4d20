"""Pulser's remote-backend interface on Gridgate: ``QPUBackend(seq, connection=GridgateConnection(
url, token, pool="qpu")).run(job_params=[{"runs": 500}])`` as with Pasqal Cloud or QRMI.

- A Pulser **batch** is a Gridgate **session** on the pool's class (its id is the batch id); each
  job of the batch is a Gridgate job in it (its id, as text, is the job id).
- ``run()`` without an open batch opens a session for its jobs and releases it once they have all
  ended (when ``wait=True``: before ``run`` returns; otherwise when a status or result query
  first sees them ended, or at :meth:`GridgateConnection.close`).
- ``with backend.open_batch():`` opens the session at the start; jobs submitted inside go to it;
  leaving the block closes the batch: it waits for the batch's jobs to end, then releases the
  session (releasing earlier would cancel the jobs still queued, R-SESS-4).
- Devices are the pool's devices, from their specs (``GET /devices/{id}/specs/``), so
  ``QPUBackend``'s ``mimic_qpu`` checks run against what Gridgate validates against.
"""

from __future__ import annotations

import json
import time
import typing
from collections.abc import Mapping
from typing import Any

import pulser
from pulser.abstract_repr import deserialize_device
from pulser.backend.remote import BatchStatus, JobStatus, RemoteConnection, RemoteResults, RemoteResultsError
from pulser.backend.results import Results
from pulser.devices import Device

from gridgate_client.api import JOB_DONE, Backoff, Client

STATUS = {
    "pending": JobStatus.PENDING,
    "running": JobStatus.RUNNING,
    "completed": JobStatus.DONE,
    "failed": JobStatus.ERROR,
    "cancelled": JobStatus.CANCELED,
    "unknown": JobStatus.ERROR,
}


class GridgateConnection(RemoteConnection):
    """A Pulser ``RemoteConnection`` to a Gridgate pool with devices (an emulator or a QPU).

    ``url`` and ``token`` default to ``GRIDGATE_URL``/``GRIDGATE_TOKEN`` and then to what
    ``gridgate login`` stored; ``pool`` is the pool's name (or id), ``resource_class`` one of its
    classes (default: its default class), ``slots`` the session's slots."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        pool: str | int,
        resource_class: str | None = None,
        slots: int = 1,
        client: Client | None = None,
    ):
        self._api = client or Client(url, token)
        self._pool = self._api.pool(pool)
        self._class = self._api.class_of(self._pool, resource_class)
        self._slots = slots
        self._sequences: dict[str, pulser.Sequence] = {}
        self._closed_batches: set[str] = set()  # our own batches (sessions), to release once ended
        self._open_batches: set[str] = set()

    # -- batches --------------------------------------------------------------------------------
    def supports_open_batch(self) -> bool:
        return True

    def _open_session(self) -> str:
        return self._api.open_session(resource_class=self._class["id"], slots=self._slots)["id"]

    def submit(
        self,
        sequence: pulser.Sequence,
        wait: bool = False,
        open: bool = False,  # noqa: A002 - Pulser's own keyword
        batch_id: str | None = None,
        **kwargs: Any,
    ) -> RemoteResults:
        job_params = pulser.json.utils.make_json_compatible(kwargs.get("job_params") or [])
        if open:
            batch_id = self._open_session()
            self._open_batches.add(batch_id)
            return RemoteResults(batch_id, self, job_ids=[])
        sequence = self._add_measurement_to_sequence(sequence)
        if not job_params:
            raise ValueError("Gridgate jobs need job_params with 'runs' (the shots of each job).")
        own = batch_id is None
        if own:
            batch_id = self._open_session()
        job_ids = []
        try:
            for params in job_params:
                built = sequence
                if sequence.is_parametrized() or sequence.is_register_mappable():
                    built = sequence.build(**params.get("variables", {}))
                payload = {"sequence": built.to_abstract_repr()}
                job = self._api.submit_job(batch_id, payload, int(params["runs"]))
                self._sequences[str(job["id"])] = built
                job_ids.append(str(job["id"]))
        except BaseException:
            if own:  # nothing of it may run on without its caller: end what was started
                self._api.close_session(batch_id)
            raise
        if own:
            self._closed_batches.add(batch_id)
        if wait:
            for job_id in job_ids:
                self._api.wait_job(job_id)
            self._release_if_ended(batch_id)
        return RemoteResults(batch_id, self, job_ids=job_ids)

    def _close_batch(self, batch_id: str) -> None:
        """Leaving ``open_batch()``: no more jobs; the session is released once its jobs ended."""
        self._open_batches.discard(batch_id)
        self._closed_batches.add(batch_id)
        backoff = Backoff()
        while not self._release_if_ended(batch_id):
            time.sleep(backoff.next())

    def _release_if_ended(self, batch_id: str, jobs: list[dict] | None = None) -> bool:
        """Release our closed batch's session once every job of it has ended; True when released
        (or not ours to release)."""
        if batch_id not in self._closed_batches:
            return batch_id not in self._open_batches
        jobs = jobs if jobs is not None else self._api.session_jobs(batch_id)
        if any(job["status"] not in JOB_DONE for job in jobs):
            return False
        self._api.close_session(batch_id)
        self._closed_batches.discard(batch_id)
        return True

    def close(self) -> None:
        """Release every session this connection opened and still holds (their queued jobs are
        cancelled), and close its HTTP connections."""
        for batch_id in list(self._closed_batches | self._open_batches):
            self._api.close_session(batch_id)
        self._closed_batches.clear()
        self._open_batches.clear()
        self._api.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- status and results ------------------------------------------------------------------
    def _get_job_ids(self, batch_id: str) -> list[str]:
        return [str(job["id"]) for job in self._api.session_jobs(batch_id)]

    def _jobs(self, batch_id: str) -> list[dict]:
        jobs = self._api.session_jobs(batch_id)
        self._release_if_ended(batch_id, jobs)
        return jobs

    def _get_batch_status(self, batch_id: str) -> BatchStatus:
        statuses = [STATUS.get(job["status"], JobStatus.ERROR) for job in self._jobs(batch_id)]
        if batch_id in self._open_batches and not statuses:
            return BatchStatus.PENDING
        if not statuses or all(status == JobStatus.PENDING for status in statuses):
            return BatchStatus.PENDING
        if all(status == JobStatus.CANCELED for status in statuses):
            return BatchStatus.CANCELED
        if all(status == JobStatus.ERROR for status in statuses):
            return BatchStatus.ERROR
        if all(status not in (JobStatus.PENDING, JobStatus.RUNNING) for status in statuses):
            return BatchStatus.DONE
        return BatchStatus.RUNNING

    def _query_job_progress(self, batch_id: str) -> Mapping[str, tuple[JobStatus, Results | None]]:
        progress = {}
        for job in self._jobs(batch_id):
            status = STATUS.get(job["status"], JobStatus.ERROR)
            progress[str(job["id"])] = (status, self._results(job) if status == JobStatus.DONE else None)
        return progress

    def _fetch_result(self, batch_id: str, job_ids: list[str] | None) -> typing.Sequence[Results]:
        progress = self._query_job_progress(batch_id)
        out = []
        for job_id in job_ids if job_ids is not None else list(progress):
            if job_id not in progress:
                raise RemoteResultsError(f"Job {job_id!r} is not in batch {batch_id!r}.")
            status, result = progress[job_id]
            if result is None:
                raise RemoteResultsError(f"Job {job_id} has no result: it is {status.name.lower()}.")
            out.append(result)
        return tuple(out)

    def _results(self, job: dict) -> Results | None:
        counts = (job.get("result") or {}).get("counts")
        if not isinstance(counts, dict):
            return None
        sequence = self._sequences.get(str(job["id"]))
        if sequence is None:  # submitted elsewhere (another process): its payload says
            raw = (job.get("payload") or {}).get("sequence")
            sequence = pulser.Sequence.from_abstract_repr(raw if isinstance(raw, str) else json.dumps(raw))
        return Results.from_final_bitstrings(
            atom_order=sequence.get_register(include_mappable=True).qubit_ids,
            total_duration=sequence.get_duration(),
            final_bitstrings={str(bits): int(n) for bits, n in counts.items()},
        )

    # -- devices ------------------------------------------------------------------------------
    def fetch_available_devices(self) -> dict[str, Device]:
        """The pool's devices that describe a Pulser device, by Gridgate device name."""
        devices = {}
        for device in self._api.devices(self._pool["id"]):
            try:
                specs = self._api.device_specs(device["id"])
                devices[device["name"]] = deserialize_device(json.dumps(specs))
            except Exception:  # noqa: S112 - a device without Pulser specs (yet) is simply not offered
                continue
        return devices
