#!/usr/bin/env python3
"""Open Cluster Scheduler (Grid Engine) load sensor for a Gridgate QPU pool (docs/qrmi.md).

Configure it as the global host's ``load_sensor`` (``qconf -mconf global``); OCS starts it once and
talks to it through stdin and stdout: each empty line asks for a report, ``quit`` ends it. Each
report is::

    begin
    global:qpu_slots:<free slots of the pool>
    global:qpu_ready:<1 when the pool takes work, else 0>
    end

read from the pool's QRMI routes ``qpu-slots`` and ``accessible``. It fails closed: when Gridgate
does not answer (or answers anything but the expected JSON) within the timeout, the report is
``qpu_slots 0`` and ``qpu_ready 0``, and the reason goes to stderr (OCS's execd log). Define the
complexes first (``qconf -mc``): ``qpu_slots qpu_slots INT <= YES YES 0 0`` and ``qpu_ready
qpu_ready BOOL == YES NO 0 0``; jobs then ask ``-l qpu_slots=2,qpu_ready=true``.

Standard library only: the OCS host needs Python 3 and, with ``--munge``, munge's client.
"""

import argparse
import json
import subprocess
import sys
import urllib.error
import urllib.request

PREFIX = "global"


def fetch(url: str, *, munge: bool, timeout: float) -> dict:
    headers = {"Accept": "application/json"}
    if munge:
        credential = subprocess.run(["munge", "-n"], capture_output=True, text=True, timeout=timeout, check=True)
        headers["X-Munge-Cred"] = credential.stdout.strip()
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 - an operator's https URL
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
        return json.loads(response.read().decode())


def report(base: str, *, munge: bool, timeout: float) -> tuple[int, int, str]:
    """(free slots, ready, why it is closed or "")."""
    try:
        slots = fetch(f"{base}/qpu-slots", munge=munge, timeout=timeout)
        accessible = fetch(f"{base}/accessible", munge=munge, timeout=timeout)
        free = slots["qpu_slots_available"]
        ready = accessible["is_accessible"]
        if not isinstance(free, int) or isinstance(free, bool) or free < 0 or not isinstance(ready, bool):
            raise ValueError(f"unexpected answer: {slots!r}, {accessible!r}")
    except (OSError, ValueError, KeyError, TypeError, subprocess.SubprocessError) as exc:
        return 0, 0, f"{type(exc).__name__}: {exc}"
    if not ready:
        return 0, 0, accessible.get("message") or "the pool is not accessible"
    return free, 1, ""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", help="the pool's QRMI base URL, e.g. https://gridgate.example.org/qrmi/fresnel")
    parser.add_argument(
        "--munge", action="store_true", help="sign each request with `munge -n` (a private pool answers its users only)"
    )
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per request (default 5)")
    args = parser.parse_args(argv)
    base = args.base.rstrip("/")
    for line in sys.stdin:
        if line.strip() == "quit":
            return 0
        free, ready, why = report(base, munge=args.munge, timeout=args.timeout)
        if why:
            print(f"ocs-load-sensor: {base}: closed: {why}", file=sys.stderr, flush=True)
        print(f"begin\n{PREFIX}:qpu_slots:{free}\n{PREFIX}:qpu_ready:{ready}\nend", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
