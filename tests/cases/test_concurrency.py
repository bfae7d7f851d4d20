"""Several workers running passes at once on PostgreSQL (R-CASE-1, R-CASE-2, SPEC §8 scale-out)."""

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
import time_machine
from django.db import connection
from django.utils import timezone

from apps.backends.fake import FakeBackend
from apps.cases import passes
from apps.cases.models import Case, CaseEvent, CaseStatus
from tests.cases.conftest import launched

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def in_threads(function, workers: int, rounds: int):
    barrier = threading.Barrier(workers)

    def work(_):
        try:
            barrier.wait()
            return [function() for _ in range(rounds)]
        finally:
            connection.close()  # each thread has its own connection

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(work, range(workers)))


def test_r_case_2_two_workers_polling_at_once_never_double_finalize(make_case):
    FakeBackend.script = ("succeeded",)  # every job is finished at the provider: all finalize now
    cases = [launched(make_case(name=f"c{i}")) for i in range(40)]
    Case.objects.update(next_poll_at=timezone.now() - timedelta(seconds=1))

    reports = in_threads(lambda: passes.poll_pass(batch=7), workers=2, rounds=8)

    assert Case.objects.filter(status=CaseStatus.DONE).count() == len(cases)
    assert FakeBackend.calls["fetch_final"] == len(cases)  # each case finalized exactly once
    done_events = Counter(CaseEvent.objects.filter(to_status=CaseStatus.DONE).values_list("case_id", flat=True))
    assert set(done_events.values()) == {1}
    recorded = [report.recorded for thread in reports for report in thread]
    assert sum(recorded) == len(cases)
    assert not Case.objects.exclude(lease_owner="").exists()


def test_r_case_1_concurrent_launches_and_submit_passes_never_double_submit(make_case):
    cases = [make_case(name=f"c{i}") for i in range(12)]
    outcomes = Counter()
    lock = threading.Lock()

    def launch_all():
        for case in cases:
            try:
                launched(case)
                result = "launched"
            except Exception as exc:
                result = type(exc).__name__
            with lock:
                outcomes[result] += 1
        passes.submit_pass()

    in_threads(launch_all, workers=3, rounds=1)

    assert FakeBackend.calls["submit"] == len(cases)
    assert len(FakeBackend.jobs) == len(cases)
    assert outcomes["launched"] == len(cases)
    assert outcomes["Conflict"] == 2 * len(cases)
    assert Case.objects.filter(status=CaseStatus.PENDING).count() == len(cases)


def test_r_case_2_a_killed_workers_cases_are_resumed_after_its_lease_expires(make_case, settings):
    settings.GRIDGATE_CASE_LEASE_SECONDS = 120
    FakeBackend.script = ("succeeded",)
    case = launched(make_case())
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        # A worker claims the case, then dies before recording anything.
        claimed = passes.claim("poll", now=timezone.now(), owner="killed-worker", batch=10)
        assert claimed == [case.id]
        assert passes.poll_pass().claimed == 0  # the live lease keeps others off
    with time_machine.travel(start + timedelta(seconds=60), tick=False):
        assert passes.poll_pass().claimed == 0
    with time_machine.travel(start + timedelta(seconds=121), tick=False):
        report = passes.poll_pass()
    case.refresh_from_db()
    assert report.claimed == 1 and report.recorded == 1
    assert case.status == CaseStatus.DONE and case.lease_owner == ""


def test_r_case_2_late_write_back_of_a_worker_that_lost_its_lease_is_dropped(make_case, monkeypatch):
    """A slow worker whose lease expired and was taken over must not overwrite the new owner."""
    case = launched(make_case())
    original = FakeBackend.poll_many

    def slow_poll(self, jobs):
        answers = original(self, jobs)
        # Meanwhile another worker took the expired lease over.
        Case.objects.filter(pk=case.pk).update(lease_owner="other-worker")
        return answers

    monkeypatch.setattr(FakeBackend, "poll_many", slow_poll)
    report = passes.poll_pass(case_ids=[case.id])
    assert report.skipped == 1 and report.recorded == 0
    case.refresh_from_db()
    assert case.lease_owner == "other-worker" and case.last_polled_at is None
