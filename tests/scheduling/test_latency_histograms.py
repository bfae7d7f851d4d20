"""The queue-wait and dispatch-latency histograms are counted when the job is dispatched and handed
over (apps.scheduling.latency), per pool, monotonic."""

from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from apps.scheduling import latency, passes, services
from apps.scheduling.drivers import TransientDriverError
from apps.scheduling.drivers.fake import FakeDriver
from apps.scheduling.models import JobLatencyBucket, LatencyKind

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def counts(pool, kind) -> dict:
    return {
        le: (count, total)
        for le, count, total in JobLatencyBucket.objects.filter(pool=pool, kind=kind).values_list("le", "count", "sum")
    }


def test_dispatch_observes_the_queue_wait_and_the_hand_over(qpu_pool, fake_device, open_session, owner):
    with time_machine.travel(T0, tick=False) as clock:
        session = open_session(qpu_pool, owner)
        services.submit_job(user=owner, session_id=session.pk, payload={}, shots=1)
        clock.move_to(T0 + timedelta(seconds=7))
        job = passes.dispatch_once(qpu_pool.pk)
        clock.move_to(T0 + timedelta(seconds=7.2))
        passes.submit_claimed(job)
    assert counts(qpu_pool, LatencyKind.QUEUE_WAIT) == {10: (1, 7.0)}
    ((le, (n, total)),) = counts(qpu_pool, LatencyKind.DISPATCH).items()
    assert (le, n) == (0.25, 1) and total == pytest.approx(0.2)


def test_a_failed_hand_over_is_not_a_dispatch_latency(qpu_pool, fake_device, open_session, owner, monkeypatch):
    def refuse(*args, **kwargs):
        raise TransientDriverError("device busy")

    monkeypatch.setattr(FakeDriver, "submit", refuse)
    session = open_session(qpu_pool, owner)
    services.submit_job(user=owner, session_id=session.pk, payload={}, shots=1)
    passes.submit_claimed(passes.dispatch_once(qpu_pool.pk))  # requeued
    assert counts(qpu_pool, LatencyKind.DISPATCH) == {}
    assert sum(n for n, _ in counts(qpu_pool, LatencyKind.QUEUE_WAIT).values()) == 1


def test_a_hand_over_recorded_by_another_worker_is_counted_by_that_worker_only(
    qpu_pool, fake_device, open_session, owner, monkeypatch
):
    """Two workers submitting one recovered claim: only the one whose compare-and-set records the
    remote id observes the hand-over."""
    from apps.scheduling.models import Job

    original = FakeDriver.submit

    def submit_and_lose_the_race(self, device, job):
        remote_id = original(self, device, job)
        Job.objects.filter(pk=job.pk).update(remote_id=remote_id)  # the other worker recorded it first
        return remote_id

    monkeypatch.setattr(FakeDriver, "submit", submit_and_lose_the_race)
    session = open_session(qpu_pool, owner)
    services.submit_job(user=owner, session_id=session.pk, payload={}, shots=1)
    passes.submit_claimed(passes.dispatch_once(qpu_pool.pk))
    assert counts(qpu_pool, LatencyKind.DISPATCH) == {}


def test_observations_accumulate_in_one_row_per_bucket(qpu_pool):
    for seconds in (0.2, 0.4, 0.5, 3, -1):  # a negative wait (two hosts' clocks) counts as 0
        latency.observe(qpu_pool.pk, LatencyKind.QUEUE_WAIT, seconds)
    assert counts(qpu_pool, LatencyKind.QUEUE_WAIT) == {
        0.1: (1, 0.0),
        0.5: (3, pytest.approx(1.1)),
        5: (1, 3.0),
    }
    latency.observe(qpu_pool.pk, LatencyKind.QUEUE_WAIT, 10**9)
    assert counts(qpu_pool, LatencyKind.QUEUE_WAIT)[float("inf")] == (1, 10**9)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_first_observations_of_a_bucket_all_count(qpu_pool):
    """Many workers handing over jobs of one pool at once: the bucket row is created once and
    every observation lands on it (the losers of the insert race count on the winner's row)."""
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connection

    def observe(_):
        try:
            latency.observe(qpu_pool.pk, LatencyKind.DISPATCH, 0.3)
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(observe, range(48)))
    assert counts(qpu_pool, LatencyKind.DISPATCH) == {0.5: (48, pytest.approx(14.4))}
