"""Requests at the same moment, for the concurrency tests on PostgreSQL."""

import threading


def meet(barrier: threading.Barrier, timeout: float = 30.0) -> None:
    """Wait at ``barrier`` for the other threads, or go on alone once ``timeout`` has passed: the
    others may be held at the lock the test proves."""
    try:
        barrier.wait(timeout=timeout)
    except threading.BrokenBarrierError:
        pass


def held_together(monkeypatch, owner, name: str, *, after: bool = False, timeout: float = 5.0) -> None:
    """Make two calls of ``owner.name`` meet just before it runs (``after``: just after it
    returns). Where nothing serializes the two requests, both get there and go on together, the
    interleaving a race needs; where a lock does, the second waits at the lock and the first goes
    on alone after ``timeout``. The outcome never depends on the timeout, only how long it takes."""
    original = getattr(owner, name)
    both = threading.Barrier(2)

    def held(*args, **kwargs):
        if not after:
            meet(both, timeout)
        result = original(*args, **kwargs)
        if after:
            meet(both, timeout)
        return result

    monkeypatch.setattr(owner, name, held)
