"""Run a command as a supervised child so that a stop request always ends it within a grace period.

Why: django-q2's cluster can deadlock inside its own SIGTERM handler (upstream django-q2 issue
#346: ``stop_event.set()`` and ``join()`` called from signal context) and then never exits, so
neither ``systemctl stop`` nor Ctrl-C of ``make run`` would end the worker. The supervisor starts
the command in its own process group (a terminal's Ctrl-C reaches only the supervisor), forwards
the first SIGTERM/SIGINT to the command as SIGTERM (its own clean stop), and once the grace period
has passed kills the whole group with SIGKILL. Worker tasks are idempotent and leased, so a task
killed mid-way is retried, never lost (docs/operations.md).
"""

import os
import signal
import subprocess
import sys
import time


def _kill_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass


def supervise(command: list[str], grace: float) -> int:
    """Run ``command`` until it exits or a stop request's grace period ends; return its exit code
    (0 after a requested stop that it honoured, 1 if it had to be killed)."""
    child = subprocess.Popen(command, start_new_session=True)  # noqa: S603 - our own argv
    stop_requested_at: list[float] = []

    def request_stop(signum, frame):
        if not stop_requested_at:
            stop_requested_at.append(time.monotonic())
            child.send_signal(signal.SIGTERM)  # a no-op if it already exited

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            try:
                code = child.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                if stop_requested_at and time.monotonic() - stop_requested_at[0] >= grace:
                    print(
                        f"supervise: {command[-1]} did not stop within {grace:g} s; killing its process group",
                        file=sys.stderr,
                        flush=True,
                    )
                    _kill_group(child.pid, signal.SIGKILL)
                    child.wait()
                    return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    # Whatever the command left behind (a cluster's worker processes) goes with it.
    _kill_group(child.pid, signal.SIGKILL)
    return 0 if stop_requested_at and code in (0, -signal.SIGTERM) else code
