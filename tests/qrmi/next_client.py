"""The next qrmi client's ``pasqal-local`` requests (after 0.26.4, unreleased), run in a subprocess
by test_next_client.py (SPEC §7b).

That client is not on PyPI, so this file sends its requests as its source sends them
(../shared/reference/WARDEN-NEXT.md §2): a JSON content type on every request, a fresh
``x-munge-cred`` per call except on ``accessible`` and ``qpu-slots`` (which it sends without
any), acquire with ``{user_id, scheduler_job_id, qpu_slots}`` (``QRMI_JOB_QPU_SLOTS`` ≥ 1, else
an invalid configuration), ``X-Warden-Session`` on ``POST jobs`` and on the revoke
(``DELETE sessions``), ``GET jobs`` for the caller's jobs. Only the standard library and Pulser.

Usage: ``python next_client.py status|acquire|run|submit|wait|release`` with the environment a Slurm job's
prolog gives (``<R>_QRMI_WARDEN_URL``, ``QRMI_JOB_UID``, ``QRMI_JOB_ID``, ``QRMI_JOB_QPU_SLOTS``,
``<R>_QRMI_JOB_ACQUISITION_TOKEN``, ``QRMI_JOB_QPU_RESOURCES``). Prints one JSON line.
Not a test module (no ``test_`` prefix): pytest does not collect it.
"""

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

RESOURCE = os.environ["QRMI_JOB_QPU_RESOURCES"]
BASE = os.environ[f"{RESOURCE}_QRMI_WARDEN_URL"].rstrip("/")
TOKEN = os.environ.get(f"{RESOURCE}_QRMI_JOB_ACQUISITION_TOKEN", "")


def call(method: str, path: str, body=None, *, signed: bool = True, session: str = "") -> tuple[int, object]:
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if signed:  # a fresh credential per call, as the client makes one each time
        headers["x-munge-cred"] = subprocess.run(
            ["munge", "--no-input"], capture_output=True, text=True, check=True
        ).stdout.strip()
    if session:
        headers["X-Warden-Session"] = session
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{BASE}/{path}", data=data, method=method, headers=headers)  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:  # noqa: S310 - the loopback server
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as error:
        raw = error.read().decode()
        try:
            return error.code, json.loads(raw)
        except ValueError:
            return error.code, raw


def qpu_slots() -> int:
    slots = int(os.environ.get("QRMI_JOB_QPU_SLOTS", "1"))
    if slots < 1:
        raise SystemExit("InvalidConfig: QRMI_JOB_QPU_SLOTS must be at least 1")
    return slots


def status() -> dict:
    """``status()`` and ``get_qpu_slots()``: the open routes, no credential."""
    code, accessible = call("GET", "accessible", signed=False)
    slots_code, slots = call("GET", "qpu-slots", signed=False)
    return {"accessible": [code, accessible], "qpu_slots": [slots_code, slots]}


def acquire() -> dict:
    body = {"user_id": os.environ["QRMI_JOB_UID"], "scheduler_job_id": os.environ["QRMI_JOB_ID"]}
    code, session = call("POST", "sessions", body | {"qpu_slots": qpu_slots()})
    return {"code": code, "session": session}


def sequence_json() -> str:
    import pulser.devices
    from pulser import Pulse, Sequence

    device = pulser.devices.AnalogDevice
    register = device.pre_calibrated_layouts[0].define_register(0, 1, qubit_ids=["q0", "q1"])
    sequence = Sequence(register, device)
    sequence.declare_channel("rydberg", "rydberg_global")
    sequence.add(Pulse.ConstantPulse(500, 2.0, 0.0, 0.0), "rydberg")
    sequence.measure("ground-rydberg")
    return sequence.to_abstract_repr()


def submit(shots: int) -> dict:
    code, job = call("POST", "jobs", {"sequence": sequence_json(), "shots": shots}, session=TOKEN)
    return {"code": code, "job": job}


def wait(job_id) -> tuple[dict, list[str]]:
    """The job's status, read until it ends (as ``task_status`` is polled), and the statuses seen."""
    seen = []
    for _ in range(900):
        _, job = call("GET", f"jobs/{job_id}")
        if not seen or seen[-1] != job["status"]:
            seen.append(job["status"])
        if job["status"] in ("DONE", "ERROR", "CANCELED"):
            break
        time.sleep(0.2)
    return job, seen


def run(shots: int) -> dict:
    """The user's part: specs, a job, its status until it ends, its logs, the caller's jobs, and
    a body the server cannot take (whose 422 is returned raw, to look for the session id)."""
    specs_code, _ = call("GET", "qpu/specs", signed=False)
    submitted = submit(shots)
    if submitted["code"] != 200:
        return {"submitted": submitted}
    job, seen = wait(submitted["job"]["id"])
    _, logs = call("GET", f"jobs/{job['id']}/logs")
    _, jobs = call("GET", "jobs")
    refused_code, refused = call("POST", "jobs", {"sequence": "", "shots": -1}, session=TOKEN)
    return {
        "specs": specs_code,
        "job": job,
        "statuses": seen,
        "logs": logs,
        "jobs": [j["id"] for j in jobs],
        "refused": [refused_code, refused],
    }


def release() -> dict:
    code, session = call("DELETE", "sessions", session=TOKEN)
    return {"code": code, "session": session}


if __name__ == "__main__":
    runs = int(os.environ.get("RUNS", "100"))
    print(
        json.dumps(
            {
                "status": status,
                "acquire": acquire,
                "release": release,
                "run": lambda: run(runs),
                "submit": lambda: submit(runs),
                "wait": lambda: dict(zip(("job", "statuses"), wait(os.environ["JOB"]), strict=True)),
            }[sys.argv[1]]()
        )
    )
