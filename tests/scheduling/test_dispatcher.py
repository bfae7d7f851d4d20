"""R-SCHED-3/4, R-JOB-2/3/4: restart, claims, driver failures, cancel, revocation, visibility."""

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.scheduling import passes, selectors, services
from apps.scheduling.drivers.fake import FakeDriver
from apps.scheduling.models import Device, DriverRun, Job, JobStatus
from apps.sessions import services as session_services
from apps.sessions.models import Session

pytestmark = pytest.mark.django_db


def make_polls_due():
    Job.objects.update(next_poll_at=None)


def submit(session, n=1):
    return [services.submit_job(user=session.user, session_id=session.pk, payload={"i": i}, shots=5) for i in range(n)]


def test_a_pass_runs_a_job_to_completion(qpu_pool, fake_device, open_session, owner):
    (job,) = submit(open_session(qpu_pool, owner))
    passes.run_pool(qpu_pool.pk)  # dispatch + submit
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING and job.remote_id == f"fake-{job.pk}"
    make_polls_due()
    passes.run_pool(qpu_pool.pk)  # poll: running
    make_polls_due()
    passes.run_pool(qpu_pool.pk)  # poll: completed
    job.refresh_from_db()
    assert job.status == JobStatus.COMPLETED and job.result == {"counts": {"0": 5}}
    assert job.started_at and job.finished_at and job.runtime_seconds == 1.0


def test_jobs_on_a_device_are_polled_not_resubmitted_after_restart(
    qpu_pool, fake_device, open_session, owner, monkeypatch
):
    (job,) = submit(open_session(qpu_pool, owner))
    passes.run_pool(qpu_pool.pk)
    job.refresh_from_db()
    # A new worker starts: it must poll the job on the device, never submit it again.
    Job.objects.filter(pk=job.pk).update(lease_until=timezone.now() - timedelta(seconds=1))
    monkeypatch.setattr(FakeDriver, "submit", lambda *a, **k: pytest.fail("resubmitted a job already on a device"))
    polled = []
    original_poll = FakeDriver.poll
    monkeypatch.setattr(FakeDriver, "poll", lambda self, d, r: polled.append(r) or original_poll(self, d, r))
    passes.run_pool(qpu_pool.pk)
    assert polled == [job.remote_id]


def test_claim_without_recorded_submission_is_adopted_not_duplicated(qpu_pool, fake_device, open_session, owner):
    (job,) = submit(open_session(qpu_pool, owner))
    claimed = passes.dispatch_once(qpu_pool.pk)
    passes.submit_claimed(claimed)
    # The worker died after the driver accepted the job but before recording the remote id.
    Job.objects.filter(pk=job.pk).update(remote_id="", lease_until=timezone.now() - timedelta(seconds=1))
    passes.run_pool(qpu_pool.pk)
    job.refresh_from_db()
    assert job.remote_id == f"fake-{job.pk}"
    assert DriverRun.objects.filter(remote_id__startswith="fake-").count() == 1


def test_a_claim_whose_worker_died_is_taken_over_after_the_short_job_lease(
    qpu_pool, fake_device, open_session, owner, settings, time_machine
):
    """A worker killed between the claim and the hand-over holds the job for
    GRIDGATE_JOB_LEASE_SECONDS (30 s), not minutes; then any pass hands it over, once."""
    settings.GRIDGATE_JOB_LEASE_SECONDS = 30
    time_machine.move_to(timezone.now(), tick=False)
    (job,) = submit(open_session(qpu_pool, owner))
    claimed = passes.dispatch_once(qpu_pool.pk)  # ... and the worker dies here
    assert claimed.pk == job.pk
    assert passes.poll_running(qpu_pool.pk) == 0  # still its worker's
    time_machine.shift(timedelta(seconds=31))
    assert passes.poll_running(qpu_pool.pk) == 1
    job.refresh_from_db()
    assert job.remote_id == f"fake-{job.pk}" and job.lease_until is None


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_slow_provider_call_keeps_its_claim_past_the_lease(
    qpu_pool, fake_device, open_session, owner, settings, monkeypatch
):
    """The claim is renewed while a driver call runs, so a short lease never lets a second worker
    take a job whose call is merely slow (and submit it twice)."""
    import threading

    from django.db import connection

    settings.GRIDGATE_JOB_LEASE_SECONDS = 2  # renewed every 0.5 s
    (job,) = submit(open_session(qpu_pool, owner))
    claimed = passes.dispatch_once(qpu_pool.pk)
    first_lease = Job.objects.get(pk=job.pk).lease_until
    seen = {}
    original = FakeDriver.submit

    def slow_submit(self, device, job):
        deadline = timezone.now() + timedelta(seconds=30)
        # Slow: still running after the first lease would have expired, and renewed meanwhile.
        while timezone.now() <= first_lease + timedelta(seconds=1) and timezone.now() < deadline:
            threading.Event().wait(0.1)
        seen["lease"] = Job.objects.get(pk=job.pk).lease_until

        def other_worker():
            try:
                seen["taken"] = passes.poll_running(qpu_pool.pk)
            finally:
                connection.close()

        thread = threading.Thread(target=other_worker)
        thread.start()
        thread.join()
        return original(self, device, job)

    monkeypatch.setattr(FakeDriver, "submit", slow_submit)
    passes.submit_claimed(claimed)
    assert seen["lease"] > first_lease + timedelta(seconds=1)  # renewed during the call
    assert seen["taken"] == 0  # the other worker found it claimed
    assert DriverRun.objects.filter(remote_id=f"fake-{job.pk}").count() == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_poll_batch_whose_provider_calls_outlast_the_lease_is_never_taken_by_a_second_worker(
    qpu_pool, fake_device, open_session, owner, settings, monkeypatch
):
    """A poll pass claims its whole batch and renews the whole batch while it calls the provider
    job after job, so the jobs later in a slow batch never lapse to another worker."""
    import threading

    from django.db import connection

    settings.GRIDGATE_JOB_LEASE_SECONDS = 2  # renewed every 0.5 s
    Device.objects.filter(pk=fake_device.pk).update(max_concurrent_jobs=3)
    jobs = submit(open_session(qpu_pool, owner, slots=3), 3)
    passes.run_pool(qpu_pool.pk)  # all three on the device
    assert Job.objects.filter(status=JobStatus.RUNNING).exclude(remote_id="").count() == 3
    make_polls_due()
    seen = {}
    original = FakeDriver.poll

    def slow_first_poll(self, device, remote_id):
        if threading.current_thread() is threading.main_thread() and "taken" not in seen:
            # The batch's first call: slow, past the lease the pass claimed its batch with.
            first_lease = Job.objects.filter(pk__in=[j.pk for j in jobs]).order_by("lease_until")[0].lease_until
            deadline = timezone.now() + timedelta(seconds=30)
            while timezone.now() <= first_lease + timedelta(seconds=1) and timezone.now() < deadline:
                threading.Event().wait(0.1)

            def other_worker():
                try:
                    seen["taken"] = passes.poll_running(qpu_pool.pk)
                finally:
                    connection.close()

            thread = threading.Thread(target=other_worker)
            thread.start()
            thread.join()
        return original(self, device, remote_id)

    monkeypatch.setattr(FakeDriver, "poll", slow_first_poll)
    assert passes.poll_running(qpu_pool.pk) == 3
    assert seen["taken"] == 0  # the jobs waiting their turn in the slow batch were still claimed
    # Every answer was recorded and every claim ended with the pass.
    assert not Job.objects.filter(lease_until__isnull=False).exists()
    assert not Job.objects.exclude(lease_owner="").exists()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_job_whose_claim_was_taken_over_is_never_submitted_again_by_its_old_holder(
    qpu_pool, fake_device, open_session, owner, settings, monkeypatch
):
    """Worker A claims a job and stalls past the lease; worker B takes the claim over and submits
    the job. A waking up meanwhile must neither submit it a second time (two paid QPU jobs) nor
    record it cancelled: the claim is B's now."""
    import threading

    from django.db import connection

    settings.GRIDGATE_JOB_LEASE_SECONDS = 2
    (job,) = submit(open_session(qpu_pool, owner))
    claimed_by_a = passes.dispatch_once(qpu_pool.pk)  # ... and A stalls here, past its lease
    Job.objects.filter(pk=job.pk).update(lease_until=timezone.now() - timedelta(seconds=1))
    calls = []
    original = FakeDriver.submit

    def counting_submit(self, device, submitted):
        calls.append(threading.current_thread().name)
        if len(calls) == 1:  # B's call is in progress: A wakes up now

            def worker_a():
                try:
                    passes.submit_claimed(claimed_by_a)
                finally:
                    connection.close()

            thread = threading.Thread(target=worker_a, name="worker-a")
            thread.start()
            thread.join()
        return original(self, device, submitted)

    monkeypatch.setattr(FakeDriver, "submit", counting_submit)
    assert passes.poll_running(qpu_pool.pk) == 1  # B (this thread) takes the lapsed claim over
    assert calls == [threading.current_thread().name]  # submitted once, by B
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING and job.cancel_requested_at is None
    assert job.remote_id == f"fake-{job.pk}" and job.lease_owner == "" and job.lease_until is None


def test_a_cancel_of_a_job_whose_hand_over_was_never_recorded_reaches_the_device(
    qpu_pool, fake_device, open_session, owner
):
    """The device accepted the job, its worker died before recording it, then the user cancelled:
    the pass that takes the claim over adopts the device's run and stops it there, instead of
    marking the job cancelled while the run goes on unseen on a slot given to another job."""
    (job,) = submit(open_session(qpu_pool, owner))
    passes.submit_claimed(passes.dispatch_once(qpu_pool.pk))
    Job.objects.filter(pk=job.pk).update(remote_id="", lease_until=timezone.now() - timedelta(seconds=1))
    services.cancel_job(Job.objects.get(pk=job.pk))
    passes.run_pool(qpu_pool.pk)  # takes the claim over: adopts the run
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING and job.remote_id == f"fake-{job.pk}"
    assert passes.free_devices(qpu_pool.pk) == []  # the device is still the job's
    for _ in range(5):  # the next polls pass the cancel on and see it end
        make_polls_due()
        passes.run_pool(qpu_pool.pk)
        job.refresh_from_db()
        if job.status != JobStatus.RUNNING:
            break
    run = DriverRun.objects.get(remote_id=f"fake-{job.pk}")
    assert run.cancel_requested and job.status == JobStatus.CANCELLED


@pytest.mark.parametrize("step", ["requeue", "permanent failure", "give up", "running", "poll error"])
def test_a_worker_whose_claim_was_taken_over_changes_nothing_of_the_job(
    qpu_pool, fake_device, open_session, owner, step
):
    """Every write of a claim's holder checks the claim is still its own: the old holder's late
    outcome never re-queues (a second dispatch), fails, or ends the claim of the new holder."""
    from apps.scheduling.drivers import DriverState, TransientDriverError

    (job,) = submit(open_session(qpu_pool, owner))
    claimed = passes.dispatch_once(qpu_pool.pk)
    if step in ("running", "poll error"):
        passes.submit_claimed(claimed)
        claimed.refresh_from_db()
    Job.objects.filter(pk=job.pk).update(
        lease_owner="the-new-holder", lease_until=timezone.now() + timedelta(seconds=30)
    )
    before = Job.objects.values().get(pk=job.pk)
    interval = timedelta(seconds=2)
    if step == "requeue":
        passes._requeue(claimed, TransientDriverError("late"))
    elif step == "permanent failure":
        passes._finish(claimed, DriverState("failed", error="late"), expect_remote_id="", owner=claimed.lease_owner)
    elif step == "give up":
        claimed.attempts = passes.MAX_TRANSIENT_ATTEMPTS
        passes._requeue(claimed, TransientDriverError("late"))
    else:
        if step == "poll error":
            FakeDriver.poll, original = (
                (lambda *a: (_ for _ in ()).throw(TransientDriverError("late"))),
                FakeDriver.poll,
            )
        try:
            passes._poll_claimed(claimed, interval)
        finally:
            if step == "poll error":
                FakeDriver.poll = original
    after = Job.objects.values().get(pk=job.pk)
    assert after["status"] == JobStatus.RUNNING and after["lease_owner"] == "the-new-holder"
    assert after["lease_until"] == before["lease_until"]


def test_transient_driver_error_requeues_without_charging(qpu_pool, open_session, owner):
    Device.objects.create(
        pool=qpu_pool, name="flaky", driver="fake", config={"fail_submit": "transient", "fail_submit_times": 1}
    )
    session = open_session(qpu_pool, owner, slots=2)
    (job,) = submit(session)
    passes.run_pool(qpu_pool.pk)
    job.refresh_from_db()
    session.refresh_from_db()
    assert job.status == JobStatus.PENDING and job.device is None and job.attempts == 1
    assert "transient" in job.error and job.not_before is not None
    assert session.vruntime == 0  # the dispatch charge (1/2) was refunded
    assert selectors.queue_info([job])[job.pk].code == "backoff"
    Job.objects.filter(pk=job.pk).update(not_before=None)
    passes.run_pool(qpu_pool.pk)
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING and job.remote_id


def test_permanent_driver_error_fails_the_job_with_the_error(qpu_pool, open_session, owner):
    Device.objects.create(pool=qpu_pool, name="broken", driver="fake", config={"fail_submit": "permanent"})
    (job,) = submit(open_session(qpu_pool, owner))
    passes.run_pool(qpu_pool.pk)
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and "permanent" in job.error and job.finished_at


def test_transient_poll_errors_keep_the_job_running(qpu_pool, open_session, owner):
    Device.objects.create(pool=qpu_pool, name="f", driver="fake", config={"fail_polls": 1})
    (job,) = submit(open_session(qpu_pool, owner))
    passes.run_pool(qpu_pool.pk)
    Job.objects.filter(pk=job.pk).update(next_poll_at=None)
    passes.run_pool(qpu_pool.pk)
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING and "poll" in job.error


def test_cancel_pending_is_immediate(qpu_pool, parked_device, open_session, owner):
    (job,) = submit(open_session(qpu_pool, owner))
    assert services.cancel_job(job).status == JobStatus.CANCELLED


def test_cancel_running_is_requested_then_done_by_the_worker(qpu_pool, fake_device, open_session, owner):
    (job,) = submit(open_session(qpu_pool, owner))
    passes.run_pool(qpu_pool.pk)
    job = services.cancel_job(Job.objects.get(pk=job.pk))
    assert job.status == JobStatus.RUNNING and job.cancel_requested_at
    make_polls_due()
    passes.run_pool(qpu_pool.pk)
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED


@pytest.mark.parametrize("final", [JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED])
def test_cancel_of_a_finished_job_is_409(qpu_pool, parked_device, open_session, owner, final):
    from apps.core.api.exceptions import Conflict

    (job,) = submit(open_session(qpu_pool, owner))
    Job.objects.filter(pk=job.pk).update(status=final)
    with pytest.raises(Conflict) as info:
        services.cancel_job(job)
    assert info.value.extra["status"] == final


def test_repeated_cancel_of_a_running_job_is_409(qpu_pool, fake_device, open_session, owner):
    from apps.core.api.exceptions import Conflict

    (job,) = submit(open_session(qpu_pool, owner))
    passes.run_pool(qpu_pool.pk)
    services.cancel_job(job)
    with pytest.raises(Conflict):
        services.cancel_job(job)


def test_revoking_a_session_cancels_pending_and_stops_running_jobs(qpu_pool, fake_device, open_session, owner):
    session = open_session(qpu_pool, owner)
    running, pending = submit(session, 2)
    passes.dispatch_once(qpu_pool.pk)
    session_services.revoke(session_ids=[session.pk])
    running.refresh_from_db(), pending.refresh_from_db()
    assert pending.status == JobStatus.CANCELLED and "manual" in pending.error
    assert running.status == JobStatus.RUNNING and running.cancel_requested_at


def test_session_with_unfinished_jobs_is_not_idle_expired(qpu_pool, parked_device, open_session, owner):
    session = open_session(qpu_pool, owner)
    submit(session)
    later = timezone.now() + timedelta(seconds=qpu_pool.idle_timeout + 10)
    session_services.expire_due_sessions(now=later)
    assert Session.objects.get(pk=session.pk).status == "active"
    Job.objects.filter(session=session).update(status=JobStatus.COMPLETED)
    session_services.expire_due_sessions(now=later)
    assert Session.objects.get(pk=session.pk).revocation_reason == "idle_timeout"


def test_submitting_renews_the_idle_deadline(qpu_pool, parked_device, open_session, owner):
    session = open_session(qpu_pool, owner)
    before = session.idle_expires_at
    submit(session)
    session.refresh_from_db()
    assert session.idle_expires_at > before


def test_pending_reasons(qpu_pool, parked_device, open_session, owner):
    (job,) = submit(open_session(qpu_pool, owner))
    job = Job.objects.select_related("pool").get(pk=job.pk)
    info = selectors.queue_info([job])[job.pk]
    assert (info.code, info.reason, info.position, info.eta_seconds) == ("no_device", selectors.NO_DEVICE, 1, None)
    device = Device.objects.create(pool=qpu_pool, name="d", driver="fake")
    assert selectors.queue_info([job])[job.pk].code == "waiting_turn"
    other = submit(open_session(qpu_pool, owner))[0]
    Job.objects.filter(pk=other.pk).update(status=JobStatus.RUNNING, device=device)
    assert selectors.queue_info([job])[job.pk].code == "device_busy"
    assert selectors.queue_info([job])[job.pk].reason == selectors.BUSY
    qpu_pool.is_accessible = False
    qpu_pool.save()
    job = Job.objects.select_related("pool").get(pk=job.pk)
    assert selectors.queue_info([job])[job.pk].code == "pool_not_accessible"


def test_inaccessible_pool_dispatches_nothing(qpu_pool, fake_device, open_session, owner):
    submit(open_session(qpu_pool, owner))
    qpu_pool.is_accessible = False
    qpu_pool.save()
    assert passes.dispatch_once(qpu_pool.pk) is None


def test_queue_positions_follow_the_weighted_order(qpu_pool, parked_device, open_session, owner, member):
    heavy, light = open_session(qpu_pool, owner, slots=2), open_session(qpu_pool, member, slots=1)
    h = submit(heavy, 4)
    l_ = submit(light, 2)
    jobs = list(Job.objects.select_related("pool").filter(pk__in=[j.pk for j in h + l_]))
    info = selectors.queue_info(jobs)
    order = sorted(info, key=lambda pk: info[pk].position)
    # tags: heavy 0, .5, 1, 1.5; light 0, 1 → heavy is older: h0 l0 h1 h2 l1 h3
    assert order == [h[0].pk, l_[0].pk, h[1].pk, h[2].pk, l_[1].pk, h[3].pk]
    assert sorted(w.position for w in info.values()) == list(range(1, 7))
    # And the dispatcher agrees with the estimate.
    Device.objects.create(pool=qpu_pool, name="d", driver="fake")
    from tests.scheduling.conftest import complete

    dispatched = []
    for _ in range(6):
        job = passes.dispatch_once(qpu_pool.pk)
        passes.submit_claimed(job)
        complete(job)
        dispatched.append(job.pk)
    assert dispatched == order


def test_sweep_is_registered_with_the_shared_tick_loop(db):
    from apps.core import ticker

    periodic = ticker.registered()["scheduling.sweep"]
    assert periodic.func is passes.sweep and periodic.every() == 1


def test_finished_emulation_is_polled_at_once_and_the_device_refilled(qpu_pool, open_session, owner, settings):
    """R-SCHED-5: when a run ends, its job is recorded and the next one starts in the same task,
    even if the job's next scheduled poll is later."""
    from apps.scheduling import tasks
    from apps.scheduling.models import DriverRun

    Device.objects.create(pool=qpu_pool, name="emu", driver="emulator")
    session = open_session(qpu_pool, owner)
    from tests.scheduling.pulser_sequences import analog_sequence

    first, second = (
        services.submit_job(user=session.user, session_id=session.pk, payload={"sequence": analog_sequence()}, shots=20)
        for _ in range(2)
    )
    passes.run_pool(qpu_pool.pk)  # dispatches the first (its run task is not executed here)
    Job.objects.filter(pk=first.pk).update(next_poll_at=timezone.now() + timedelta(minutes=5))
    assert tasks.run_emulation(f"emu-{first.pk}") == "completed"
    first.refresh_from_db(), second.refresh_from_db()
    assert first.status == JobStatus.COMPLETED and second.status == JobStatus.RUNNING
    run = DriverRun.objects.get(remote_id=f"emu-{first.pk}")
    assert run.started_at <= run.finished_at


def test_queue_position_counts_jobs_not_in_the_listing(qpu_pool, parked_device, open_session, owner, member):
    """R-JOB-4: a job's position counts every pending job ahead of it, not only listed ones."""
    qpu_pool.strategy = "fifo"
    qpu_pool.save()
    others = submit(open_session(qpu_pool, member), 3)
    (mine,) = submit(open_session(qpu_pool, owner))
    mine = Job.objects.select_related("pool").get(pk=mine.pk)
    assert selectors.queue_info([mine])[mine.pk].position == len(others) + 1
    Device.objects.create(pool=qpu_pool, name="d", driver="fake")
    qpu_pool.strategy = "weighted_fair"
    qpu_pool.save()
    mine = Job.objects.select_related("pool").get(pk=mine.pk)
    # weighted: both sessions at vruntime 0, the member's is older: its first job goes first.
    assert selectors.queue_info([mine])[mine.pk].position == 2


def test_usage_fair_charges_device_time_of_failed_jobs_too(qpu_pool, fake_device, open_session, owner):
    from apps.scheduling.drivers import DriverState
    from apps.scheduling.passes import _finish

    qpu_pool.strategy = "usage_fair"
    qpu_pool.save()
    session = open_session(qpu_pool, owner, slots=2)
    submit(session)
    job = passes.dispatch_once(qpu_pool.pk)
    passes.submit_claimed(job)
    job.refresh_from_db()
    _finish(job, DriverState("failed", error="boom", runtime_seconds=8.0), expect_remote_id=job.remote_id)
    _finish(job, DriverState("failed", error="boom", runtime_seconds=8.0), expect_remote_id=job.remote_id)
    session.refresh_from_db()
    assert session.vruntime == pytest.approx(4.0)  # 8 s / 2 slots, charged once


def test_emulator_run_whose_worker_died_too_often_fails_its_job_and_frees_the_device(
    qpu_pool, open_session, owner, settings
):
    """Poison pill: after GRIDGATE_EMULATOR_MAX_ATTEMPTS starts that all died."""
    from apps.scheduling.drivers import emulator
    from apps.scheduling.models import DriverRun
    from tests.scheduling.pulser_sequences import analog_sequence

    device = Device.objects.create(pool=qpu_pool, name="emu", driver="emulator")
    (job,) = [
        services.submit_job(
            user=owner, session_id=open_session(qpu_pool, owner).pk, payload={"sequence": analog_sequence()}, shots=5
        )
    ]
    passes.run_pool(qpu_pool.pk)
    DriverRun.objects.filter(remote_id=f"emu-{job.pk}").update(
        status="running",
        attempts=settings.GRIDGATE_EMULATOR_MAX_ATTEMPTS,
        heartbeat_at=timezone.now() - emulator.dead_after() - timedelta(seconds=1),
    )
    assert emulator.recover_runs()["failed"] == 1
    make_polls_due()
    passes.run_pool(qpu_pool.pk)
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and "died 3 times" in job.error
    assert not Job.objects.filter(device=device, status=JobStatus.RUNNING).exists()
