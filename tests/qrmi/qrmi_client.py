"""The unmodified ``qrmi`` client, run in a subprocess by test_real_client.py (SPEC §7b).

Usage: ``python qrmi_client.py accessible|acquire|run|release`` with the QRMI environment set as
a Slurm job would (``<R>_QRMI_WARDEN_URL``, ``QRMI_JOB_UID``, ``QRMI_JOB_ID``,
``<R>_QRMI_JOB_ACQUISITION_TOKEN``, ``QRMI_JOB_QPU_RESOURCES``/``TYPES``). Prints one JSON line.
``acquire``/``release`` run as root (the SPANK plugin); ``run`` runs as the job's user.
Not a test module (no ``test_`` prefix): pytest does not collect it.
"""

import json
import os
import sys


def resource():
    from qrmi import QuantumResource, ResourceType

    return QuantumResource(os.environ["QRMI_JOB_QPU_RESOURCES"], ResourceType.PasqalLocal)


def run(runs: int) -> dict:
    import pulser.devices
    from pulser import Pulse, QPUBackend, Sequence
    from qrmi.pulser import PulserQRMIConnection

    device = pulser.devices.AnalogDevice  # what GET qpu/specs announces for this pool
    # A QPU (and QPUBackend's mimic_qpu check) wants registers drawn from a calibrated layout.
    register = device.pre_calibrated_layouts[0].define_register(0, 1, qubit_ids=["q0", "q1"])
    sequence = Sequence(register, device)
    sequence.declare_channel("rydberg", "rydberg_global")
    sequence.add(Pulse.ConstantPulse(500, 2.0, 0.0, 0.0), "rydberg")
    sequence.measure("ground-rydberg")
    connection = PulserQRMIConnection()  # the resource of this job, found through the environment
    results = QPUBackend(sequence, connection=connection).run(job_params=[{"runs": runs}], wait=True)
    counts = {str(k): int(v) for k, v in results[0].final_bitstrings.items()}
    return {
        "counts": counts,
        "devices": sorted(connection.fetch_available_devices()),
        "batch_id": results.batch_id,
        "logs": list(connection.get_batch_logs()),
    }


def main(mode: str) -> dict:
    if mode == "accessible":
        return {"accessible": resource().is_accessible()}
    if mode == "acquire":
        return {"token": resource().acquire()}
    if mode == "release":
        resource().release(os.environ.get(f"{os.environ['QRMI_JOB_QPU_RESOURCES']}_QRMI_JOB_ACQUISITION_TOKEN", ""))
        return {"released": True}
    if mode == "run":
        return run(int(os.environ.get("RUNS", "100")))
    raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
