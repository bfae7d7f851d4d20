"""Run a command as a supervised child so that a stop request always ends it within a grace period,
and so that nothing it started outlives the supervisor.

Why: django-q2's cluster can deadlock inside its own SIGTERM handler (upstream django-q2 issue
#346: ``stop_event.set()`` and ``join()`` called from signal context) and then never exits, so
neither ``systemctl stop`` nor Ctrl-C of ``make run`` would end the worker. The supervisor starts
each command (the cluster, the ticker) in its own process group (a terminal's Ctrl-C reaches only
the supervisor), forwards the first SIGTERM/SIGINT to each as SIGTERM (its own clean stop), and
once the grace period has passed kills the groups with SIGKILL. Worker tasks are idempotent and
leased, so a task killed mid-way is retried, never lost (docs/operations.md, "Recovery").

**The lifeline.** A supervisor killed with SIGKILL (the OOM killer, ``systemctl kill -s KILL``
with the documented ``KillMode=process``) runs no code, and its children, each in a session of
its own, used to go on as orphans: a restart then ran a second cluster and ticker under the same
worker host name. Each child therefore holds the read end of a pipe whose only write end is the
supervisor's (``GRIDGATE_LIFELINE_FD``); a thread of the child (:func:`watch_lifeline`, started
when Django starts) reads it, and the end of file the kernel delivers when the supervisor is gone,
however it died, makes it SIGKILL its own process group: the cluster with every process it forked.
Not a parent-death signal: that reaches only the direct child, not the cluster's own workers.
"""

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

LIFELINE_ENV = "GRIDGATE_LIFELINE_FD"


def _kill_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass


def watch_lifeline() -> bool:
    """In a supervised child: SIGKILL this process group as soon as the supervisor is gone.

    Reads ``GRIDGATE_LIFELINE_FD`` once and removes it from the environment (processes this one
    starts are not supervised children; the cluster's forked workers share the group and die with
    it). False when this process was not started by :func:`supervise`. Standard library only."""
    raw = os.environ.pop(LIFELINE_ENV, None)
    if not raw:
        return False
    try:
        fd = int(raw)
        os.fstat(fd)
    except (ValueError, OSError):  # not ours to watch (a variable without its pipe)
        return False

    def watch():
        while True:
            try:
                if os.read(fd, 1):  # the supervisor never writes: only end of file comes
                    continue
            except InterruptedError:
                continue
            except OSError:
                return  # the descriptor was closed under us: nothing to watch
            break
        # The supervisor is gone (killed, crashed): nobody will stop this group now.
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="lifeline", daemon=True).start()
    return True


def supervise(
    *commands: list[str],
    grace: float,
    keep_fds: tuple[int, ...] = (),
    stop_when: Callable[[], str] | None = None,
) -> int:
    """Run ``commands`` side by side until one exits or a stop request's grace period ends.

    Each runs in its own process group, with the lifeline (module docstring) and ``keep_fds``
    (e.g. a lock its holders keep for as long as any of them lives). When one exits by itself (a
    crash), the others are stopped too (SIGTERM, then SIGKILL after ``grace``) and its exit code
    is returned, so the service manager restarts the worker whole: a ticker without its cluster,
    or the reverse, would report a live worker that does not run tasks. ``stop_when``, asked
    every loop, returns a reason to stop them all (the worker lost its host's lease): then 1.
    Returns 0 after a requested stop that all honoured, 1 if one had to be killed.
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
    # The lifeline: the children get the read end, this process alone keeps the write end (not
    # inheritable, so no child holds the pipe open against its own end of file).
    lifeline_read, lifeline_write = os.pipe()
    environment = {**os.environ, LIFELINE_ENV: str(lifeline_read)}
    try:
        for command in commands:
            children.append(
                subprocess.Popen(  # noqa: S603 - our argv
                    command, start_new_session=True, pass_fds=(lifeline_read, *keep_fds), env=environment
                )
            )
            if stop_requested_at:
                children[-1].send_signal(signal.SIGTERM)
    finally:
        os.close(lifeline_read)
    killed = False
    lost = False
    try:
        while any(child.poll() is None for child in children):
            if not stop_requested_at:
                ended = [child for child in children if child.poll() is not None]
                reason = stop_when() if stop_when is not None and not ended else ""
                if ended:
                    crashed.append(ended[0].returncode)
                    print(
                        f"supervise: {ended[0].args[-1]} exited ({ended[0].returncode}); stopping the others",
                        file=sys.stderr,
                        flush=True,
                    )
                    stop_all()
                elif reason:
                    lost = True
                    print(f"supervise: {reason}; stopping", file=sys.stderr, flush=True)
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
    os.close(lifeline_write)
    if crashed:
        return crashed[0] or 1
    if killed or lost:
        return 1
    codes = [child.returncode for child in children]
    if stop_requested_at and all(code in (0, -signal.SIGTERM) for code in codes):
        return 0
    return next((code for code in codes if code), 0)
