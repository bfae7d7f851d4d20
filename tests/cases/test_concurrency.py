"""Several workers running passes at once on PostgreSQL (R-CASE-1, R-CASE-2, SPEC §8 scale-out)."""

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
import time_machine
from django.db import connection, transaction
from django.utils import timezone

from apps.backends.fake import FakeBackend
from apps.cases import passes
from apps.cases.models import Case, CaseEvent, CaseStatus
from tests.cases.conftest import drive, launched

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


def test_r_case_2_a_claim_skips_the_rows_another_worker_is_claiming_instead_of_sharing_them(make_case):
    """Worker A is inside its claim (rows locked, lease written, not committed yet) when worker B
    claims: B must take the other cases at once, never the ones A is taking (no double claim)
    and never wait for A (skip_locked)."""
    cases = [launched(make_case(name=f"c{i}")) for i in range(4)]
    Case.objects.update(next_poll_at=timezone.now() - timedelta(seconds=1))
    a_claimed, a_holds, release = [], threading.Event(), threading.Event()

    def worker_a():
        try:
            with transaction.atomic():  # A's claim transaction stays open until released
                a_claimed.extend(passes.claim("poll", now=timezone.now(), owner="worker-a", batch=2))
                a_holds.set()
                release.wait(timeout=60)
        finally:
            connection.close()

    b_claimed = []

    def worker_b():
        try:
            b_claimed.extend(passes.claim("poll", now=timezone.now(), owner="worker-b", batch=10))
        finally:
            connection.close()

    a = threading.Thread(target=worker_a)
    a.start()
    assert a_holds.wait(timeout=30)
    b = threading.Thread(target=worker_b)
    b.start()
    b.join(timeout=30)
    b_finished_while_a_held = not b.is_alive()
    release.set()
    a.join()
    b.join()
    assert len(a_claimed) == 2
    assert b_finished_while_a_held, "worker B waited for worker A's claim instead of skipping its rows"
    assert set(a_claimed).isdisjoint(b_claimed), "a case was claimed by two workers"
    assert set(a_claimed) | set(b_claimed) == {case.id for case in cases}
    owners = dict(Case.objects.values_list("id", "lease_owner"))
    assert all(owners[i] == "worker-a" for i in a_claimed) and all(owners[i] == "worker-b" for i in b_claimed)


def test_r_case_2_a_pass_outliving_its_lease_keeps_it_and_is_not_duplicated(make_case, settings, monkeypatch):
    """One fetch_final longer than the whole lease: the pass's heartbeat renews the lease, so a
    second worker polling meanwhile does not take the case and fetch (and finalize) it again."""
    settings.GRIDGATE_CASE_LEASE_SECONDS = 2  # renewed every 0.5 s by the heartbeat
    FakeBackend.script = ("succeeded",)
    case = launched(make_case())
    Case.objects.filter(pk=case.pk).update(next_poll_at=timezone.now() - timedelta(seconds=1))
    inside, finish = threading.Event(), threading.Event()
    original = FakeBackend.fetch_final

    def long_fetch(self, job_ref):
        inside.set()
        finish.wait(timeout=60)  # a big download
        return original(self, job_ref)

    monkeypatch.setattr(FakeBackend, "fetch_final", long_fetch)
    reports = []

    def worker_a():
        try:
            reports.append(passes.poll_pass(owner="worker-a"))
        finally:
            connection.close()

    a = threading.Thread(target=worker_a)
    a.start()
    try:
        assert inside.wait(timeout=30)
        time.sleep(3 * settings.GRIDGATE_CASE_LEASE_SECONDS)  # well past the lease A took
        second = passes.poll_pass(owner="worker-b")  # another worker's pass meanwhile
    finally:
        finish.set()
        a.join()
    case.refresh_from_db()
    assert second.claimed == 0
    assert reports[0].recorded == 1 and case.status == CaseStatus.DONE
    assert FakeBackend.calls["fetch_final"] == 1
    assert case.events.filter(to_status=CaseStatus.DONE).count() == 1


def test_r_case_2_a_sync_outliving_its_lease_keeps_it(make_case, settings, monkeypatch):
    settings.GRIDGATE_CASE_LEASE_SECONDS = 2
    FakeBackend.script = ("running",)
    case = drive(launched(make_case()), until=CaseStatus.RUNNING)
    Case.objects.filter(pk=case.pk).update(next_sync_at=timezone.now() - timedelta(seconds=1))
    inside, finish = threading.Event(), threading.Event()
    original = FakeBackend.sync

    def long_sync(self, job_ref, globs):
        inside.set()
        finish.wait(timeout=60)
        return original(self, job_ref, globs)

    monkeypatch.setattr(FakeBackend, "sync", long_sync)

    def worker_a():
        try:
            passes.sync_pass(owner="worker-a")
        finally:
            connection.close()

    a = threading.Thread(target=worker_a)
    a.start()
    try:
        assert inside.wait(timeout=30)
        time.sleep(3 * settings.GRIDGATE_CASE_LEASE_SECONDS)
        second = passes.sync_pass(owner="worker-b", case_ids=[case.id])
    finally:
        finish.set()
        a.join()
    assert second.claimed == 0 and FakeBackend.calls["sync"] == 1
    case.refresh_from_db()
    assert case.last_synced_at is not None and case.lease_owner == ""


@pytest.mark.parametrize("shared", [True, False], ids=["campaign-shared", "case-inputs"])
def test_r_case_7_a_launch_is_never_recorded_while_its_inputs_are_being_written(owner, make_case, monkeypatch, shared):
    """An upload checks that no launch was requested, then writes its files; a launch request
    meanwhile would let the worker submit a half-written input. The upload holds the campaign's
    (or the case's) row lock, which the launch takes too: either the upload was complete when the
    launch was recorded, or the upload came second and was refused. Without the lock the launch
    is recorded while the upload waits at its write."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    from apps.cases import services, workspace
    from tests.concurrency import meet

    campaign = services.create_campaign(owner=owner, name="sweep") if shared else None
    case = make_case(campaign=campaign)
    target = workspace.campaign_shared_dir(campaign.id) if shared else workspace.case_dir(case.id) / "inputs"
    both = threading.Barrier(2)
    seen = {}
    save_uploads, enqueue_submit = workspace.save_uploads, passes.enqueue_submit

    def writing(dest, uploads):
        meet(both, timeout=5)  # the launch would be recorded now, were nothing holding it
        return save_uploads(dest, uploads)

    def recorded(ids):
        seen["complete"] = (target / "mesh.msh").exists()
        meet(both, timeout=5)
        return enqueue_submit(ids)

    monkeypatch.setattr(workspace, "save_uploads", writing)
    monkeypatch.setattr(passes, "enqueue_submit", recorded)

    def upload():
        add = services.add_campaign_inputs if shared else services.add_inputs
        try:
            add(campaign if shared else case, [SimpleUploadedFile("mesh.msh", b"mesh")])
            return "uploaded"
        except Exception as exc:  # Conflict: the launch went first
            return type(exc).__name__
        finally:
            connection.close()

    def launch():
        try:
            services.launch_case(Case.objects.get(pk=case.pk))
            return "launched"
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=2) as executor:
        uploaded, launch_result = executor.submit(upload), executor.submit(launch)
        outcome = uploaded.result()
    assert launch_result.result() == "launched"
    assert (outcome == "uploaded" and seen["complete"]) or (outcome == "Conflict" and not seen["complete"]), (
        outcome,
        seen,
    )


def test_a_launch_locks_its_case_row_and_never_its_class_or_pool(owner, make_case, local_pool, monkeypatch):
    """The launch's row lock, taken with its class and pool joined in, locked their rows as well
    until it committed: launches in one pool went one at a time, and every insert naming the pool
    or the class (a case created, a session admitted) waited for them."""
    from apps.cases import services
    from apps.resources.models import ResourceClass, ResourcePool
    from tests.concurrency import locked_while

    case = make_case()
    klass = case.resource_class
    answers = locked_while(
        monkeypatch,
        passes,
        "enqueue_submit",
        lambda: services.launch_case(Case.objects.get(pk=case.pk)).launch_requested_at is not None,
        [(Case, case.pk), (ResourceClass, klass.pk), (ResourcePool, klass.pool_id)],
    )
    assert answers == {
        ("Case", case.pk): True,
        ("ResourceClass", klass.pk): False,
        ("ResourcePool", klass.pool_id): False,
        "result": True,
    }


def test_launches_of_one_campaigns_cases_never_wait_on_each_other(owner, make_case, monkeypatch):
    """A launch holds its campaign's row in share mode only: two launches in one campaign are
    both inside their transaction at once (they meet at a barrier there), where a lock for update
    would make the second wait for the first to commit and the barrier break."""
    from apps.cases import services

    campaign = services.create_campaign(owner=owner, name="sweep")
    cases = [make_case(campaign=campaign, name=f"c{i}") for i in range(2)]
    both, met = threading.Barrier(2), []
    enqueue_submit = passes.enqueue_submit

    def recorded(ids):
        try:
            both.wait(timeout=10)
            met.append(True)
        except threading.BrokenBarrierError:
            met.append(False)
        return enqueue_submit(ids)

    monkeypatch.setattr(passes, "enqueue_submit", recorded)

    def launch(case):
        try:
            return services.launch_case(Case.objects.get(pk=case.pk)).launch_requested_at is not None
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=2) as executor:
        assert list(executor.map(launch, cases)) == [True, True]
    assert met == [True, True]
