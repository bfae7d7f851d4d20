"""A finished job's result as a download: JSON for programs, CSV for spreadsheets and shell tools.

One shape for the API (``GET /jobs/{id}/result/``), the job page's download links and the
``gridgate job result`` command: the counts in bitstring order, each with its probability, and
what a reader needs to interpret them (shots, device, when it finished).
"""

from __future__ import annotations

from apps.core.csvfiles import write_csv
from apps.core.exceptions import Conflict
from apps.scheduling.models import Job, JobStatus

CSV_HEADER = ("bitstring", "count", "probability")


def result_of(job: Job) -> dict:
    """``{"job", "status", "shots", "device", "finished_at", "counts", "probabilities"}`` of a
    completed job; a job without a result (still pending or running, failed, cancelled) is a 409
    naming its status, so a script that asks too early learns why and what to wait for."""
    counts = (job.result or {}).get("counts") if isinstance(job.result, dict) else None
    if job.status != JobStatus.COMPLETED or not isinstance(counts, dict):
        if job.status == JobStatus.FAILED:
            why = f"it failed: {job.error or 'no error recorded'}"
        elif job.status == JobStatus.CANCELLED:
            why = "it was cancelled"
        elif job.status == JobStatus.COMPLETED:
            why = "its device returned no counts"
        else:
            why = f"it is {job.status}; wait until it is completed"
        raise Conflict(f"Job {job.pk} has no result: {why}.", status=str(job.status))
    ordered = {str(bits): int(n) for bits, n in sorted(counts.items())}
    total = sum(ordered.values())
    return {
        "job": job.pk,
        "status": str(job.status),
        "shots": job.shots,
        "device": job.device_id,
        "finished_at": job.finished_at,
        "counts": ordered,
        "probabilities": {bits: (n / total if total else 0.0) for bits, n in ordered.items()},
    }


def as_csv(result: dict) -> str:
    """``bitstring,count,probability`` rows, one per measured bitstring, in bitstring order.
    Bitstrings are written as text ("0011"): a spreadsheet that drops leading zeros is told by
    the header, and ``csv``/``pandas.read_csv(dtype=str)`` read them back unchanged."""
    rows = ((bits, count, f"{result['probabilities'][bits]:.6g}") for bits, count in result["counts"].items())
    # A format programs read back (the CLI, pandas): written as is, no spreadsheet quoting.
    return write_csv(CSV_HEADER, rows, for_spreadsheets=False)
