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


def row_locked(model, pk) -> bool:
    """Whether another transaction holds ``model``'s row ``pk`` against an update (a lock for
    update or share): asked with NOWAIT on this thread's own connection, so it never waits."""
    from django.db import DatabaseError, transaction

    try:
        with transaction.atomic():
            list(model.objects.select_for_update(nowait=True, no_key=True).filter(pk=pk).values_list("pk"))
    except DatabaseError:
        return True
    return False


def locked_while(monkeypatch, owner, name: str, operation, rows) -> dict:
    """Run ``operation`` in a thread, hold it inside ``owner.name`` (called within the
    transaction under test) and answer, for each ``(model, pk)`` of ``rows``, whether that row is
    locked then; the operation's result is under ``"result"``."""
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connection

    inside, done = threading.Event(), threading.Event()
    original = getattr(owner, name)

    def held(*args, **kwargs):
        inside.set()
        done.wait(timeout=30)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, held)

    def run():
        try:
            return operation()
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=1) as executor:
        future = executor.submit(run)
        assert inside.wait(timeout=30), "the operation never reached the point under test"
        answers = {(model.__name__, pk): row_locked(model, pk) for model, pk in rows}
        done.set()
        answers["result"] = future.result()
    return answers
