"""Run a command as a supervised child so that a stop request always ends it within a grace period.

Why: django-q2's cluster can deadlock inside its own SIGTERM handler (upstream django-q2 issue
#346: ``stop_event.set()`` and ``join()`` called from signal context) and then never exits, so
neither ``systemctl stop`` nor Ctrl-C of ``make run`` would end the worker. The supervisor starts
each command (the cluster, the ticker) in its own process group (a terminal's Ctrl-C reaches only
the supervisor), forwards the first SIGTERM/SIGINT to each as SIGTERM (its own clean stop), and
once the grace period has passed kills the groups with SIGKILL. Worker tasks are idempotent and
leased, so a task killed mid-way is retried, never lost (docs/operations.md, "Recovery").
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


def supervise(*commands: list[str], grace: float) -> int:
    """Run ``commands`` side by side until one exits or a stop request's grace period ends.

    Each runs in its own process group. When one exits by itself (a crash), the others are
    stopped too (SIGTERM, then SIGKILL after ``grace``) and its exit code is returned, so the
    service manager restarts the worker whole: a ticker without its cluster, or the reverse,
    would report a live worker that does not run tasks. Returns 0 after a requested stop that all
    honoured, 1 if one had to be killed.
    """
    children: list[subprocess.Popen] = []
    stop_requested_at: list[float] = []
    crashed: list[int] = []

    def stop_all():
        if not stop_requested_at:
            stop_requested_at.append(time.monotonic())
            for child in children:
                child.send_signal(signal.SIGTERM)  # a no-op if it already exited

    def request_stop(signum, frame):
        stop_all()

    # Handlers first: a stop asked while the children start still reaches each of them (a child
    # started after it is stopped at once), instead of killing the supervisor and orphaning them.
    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    for command in commands:
        children.append(subprocess.Popen(command, start_new_session=True))  # noqa: S603 - our argv
        if stop_requested_at:
            children[-1].send_signal(signal.SIGTERM)
    killed = False
    try:
        while any(child.poll() is None for child in children):
            if not stop_requested_at:
                ended = [child for child in children if child.poll() is not None]
                if ended:
                    crashed.append(ended[0].returncode)
                    print(
                        f"supervise: {ended[0].args[-1]} exited ({ended[0].returncode}); stopping the others",
                        file=sys.stderr,
                        flush=True,
                    )
                    stop_all()
            elif time.monotonic() - stop_requested_at[0] >= grace:
                for child in children:
                    if child.poll() is None:
                        print(
                            f"supervise: {child.args[-1]} did not stop within {grace:g} s; killing its process group",
                            file=sys.stderr,
                            flush=True,
                        )
                        _kill_group(child.pid, signal.SIGKILL)
                        child.wait()
                        killed = True
                break
            time.sleep(0.2)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    # Whatever a command left behind (a cluster's worker processes) goes with it.
    for child in children:
        _kill_group(child.pid, signal.SIGKILL)
        child.wait()
    if crashed:
        return crashed[0] or 1
    if killed:
        return 1
    codes = [child.returncode for child in children]
    if stop_requested_at and all(code in (0, -signal.SIGTERM) for code in codes):
        return 0
    return next((code for code in codes if code), 0)
