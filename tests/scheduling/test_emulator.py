"""The emulator end to end: a real Pulser sequence through the API, run by the worker code."""

import pytest

from apps.scheduling.models import Device, Job, JobStatus
from tests.scheduling.pulser_sequences import analog_sequence

pytestmark = pytest.mark.django_db


def test_pulser_job_completes_with_counts_summing_to_shots(
    api, owner, qpu_pool, open_session, django_capture_on_commit_callbacks, settings
):
    settings.GRIDGATE_TASKS_EAGER = True  # the worker's tasks run inline, in order
    Device.objects.create(pool=qpu_pool, name="emu", driver="emulator")
    session = open_session(qpu_pool, owner)
    with django_capture_on_commit_callbacks(execute=True):
        response = api(owner).post(
            f"/api/v1/sessions/{session.pk}/jobs/",
            {"payload": {"sequence": analog_sequence(atoms=3)}, "shots": 200},
            format="json",
        )
    assert response.status_code == 201, response.content
    job = api(owner).get(f"/api/v1/jobs/{response.json()['id']}/").json()
    assert job["status"] == "completed", job
    counts = job["result"]["counts"]
    assert sum(counts.values()) == 200
    assert all(len(bits) == 3 and set(bits) <= {"0", "1"} for bits in counts)
    assert Job.objects.get(pk=job["id"]).runtime_seconds > 0


def test_emulator_failure_is_recorded_on_the_job(
    qpu_pool, owner, open_session, django_capture_on_commit_callbacks, settings
):
    from apps.scheduling import passes, services
    from apps.scheduling.models import DriverRun

    settings.GRIDGATE_TASKS_EAGER = True
    Device.objects.create(pool=qpu_pool, name="emu", driver="emulator")
    session = open_session(qpu_pool, owner)
    job = services.submit_job(
        user=session.user, session_id=session.pk, payload={"sequence": analog_sequence()}, shots=10
    )
    # The sequence is corrupted on the device side after submission (validated, then broken).
    Job.objects.filter(pk=job.pk).update(payload={"sequence": "{}"})
    job.refresh_from_db()
    claimed = passes.dispatch_once(qpu_pool.pk)
    with django_capture_on_commit_callbacks(execute=True):
        passes.submit_claimed(claimed)
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and "Pulser" in job.error
    assert DriverRun.objects.get(remote_id=job.remote_id).status == "failed"


# -- a worker killed mid-emulation ------------------------------------------------------------------
def running_run(qpu_pool, *, started_ago: float, beat_ago: float | None, attempts: int = 1, status="running"):
    from datetime import timedelta

    from django.utils import timezone

    from apps.scheduling.models import DriverRun

    device = Device.objects.create(pool=qpu_pool, name="emu", driver="emulator")
    now = timezone.now()
    return device, DriverRun.objects.create(
        remote_id="emu-1",
        device=device,
        payload={"sequence": "{}"},
        shots=1,
        status=status,
        attempts=attempts,
        started_at=now - timedelta(seconds=started_ago),
        heartbeat_at=None if beat_ago is None else now - timedelta(seconds=beat_ago),
    )


@pytest.fixture
def sent(monkeypatch):
    """The tasks handed to the broker (after commit: the tests run outside a transaction)."""
    tasks = []
    monkeypatch.setattr("django_q.tasks.async_task", lambda func, *args, **kw: tasks.append((func, args)))
    return tasks


def dead_for(settings) -> float:
    return settings.GRIDGATE_EMULATOR_DEAD_AFTER + 1


@pytest.mark.django_db(transaction=True)
def test_run_whose_worker_died_is_queued_again_and_its_task_resent(qpu_pool, sent, settings):
    from apps.scheduling.drivers import emulator

    device, run = running_run(qpu_pool, started_ago=60, beat_ago=dead_for(settings))
    assert emulator.recover_runs()["rerun"] == 1
    run.refresh_from_db()
    assert (run.status, run.attempts, run.enqueues, run.started_at) == ("queued", 1, 1, None)
    assert sent == [("apps.scheduling.tasks.run_emulation", ("emu-1",))]
    # Its job is not failed meanwhile: the run is simply not finished.
    state = emulator.EmulatorDriver().poll(device, run.remote_id)
    assert (state.status, state.started) == ("running", False)


@pytest.mark.django_db(transaction=True)
def test_run_whose_worker_died_max_attempts_times_is_failed_with_the_count(qpu_pool, sent, settings):
    from apps.scheduling.drivers import emulator

    settings.GRIDGATE_EMULATOR_MAX_ATTEMPTS = 3
    device, run = running_run(qpu_pool, started_ago=60, beat_ago=dead_for(settings), attempts=3)
    assert emulator.recover_runs()["failed"] == 1
    run.refresh_from_db()
    assert run.status == "failed" and "died 3 times" in run.error and run.finished_at is not None
    assert sent == []
    state = emulator.EmulatorDriver().poll(device, run.remote_id)
    assert state.status == "failed" and "died 3 times" in state.error


@pytest.mark.django_db(transaction=True)
def test_dead_run_whose_cancel_was_requested_is_cancelled_not_rerun(qpu_pool, sent, settings):
    from apps.scheduling.drivers import emulator
    from apps.scheduling.models import DriverRun

    device, run = running_run(qpu_pool, started_ago=60, beat_ago=dead_for(settings))
    DriverRun.objects.filter(pk=run.pk).update(cancel_requested=True)
    assert emulator.recover_runs()["cancelled"] == 1
    assert DriverRun.objects.get(pk=run.pk).status == "cancelled" and sent == []


@pytest.mark.django_db(transaction=True)
def test_long_run_with_a_live_heartbeat_keeps_running(qpu_pool, sent):
    from apps.scheduling.drivers import emulator

    device, run = running_run(qpu_pool, started_ago=3600, beat_ago=1)
    assert emulator.recover_runs() == {"rerun": 0, "failed": 0, "cancelled": 0, "resent": 0}
    assert emulator.EmulatorDriver().poll(device, run.remote_id).status == "running"


@pytest.mark.django_db(transaction=True)
def test_queued_run_no_worker_started_is_sent_again_with_a_growing_delay(qpu_pool, sent, settings):
    """A task lost by the broker (Redis has no acknowledgement; a killed cluster's prefetched
    tasks): the run stays queued and nothing would ever start it."""
    from datetime import timedelta

    from django.utils import timezone

    from apps.scheduling.drivers import emulator
    from apps.scheduling.models import DriverRun

    settings.GRIDGATE_EMULATOR_REQUEUE_SECONDS = 10
    device, run = running_run(qpu_pool, started_ago=0, beat_ago=None, attempts=0, status="queued")
    now = timezone.now()
    DriverRun.objects.filter(pk=run.pk).update(started_at=None, enqueued_at=now - timedelta(seconds=5), enqueues=1)
    assert emulator.recover_runs()["resent"] == 0  # sent 5 s ago: still in the broker's queue
    DriverRun.objects.filter(pk=run.pk).update(enqueued_at=now - timedelta(seconds=11))
    assert emulator.recover_runs()["resent"] == 1
    assert sent == [("apps.scheduling.tasks.run_emulation", ("emu-1",))]
    assert DriverRun.objects.get(pk=run.pk).enqueues == 2
    DriverRun.objects.filter(pk=run.pk).update(enqueued_at=now - timedelta(seconds=15))
    assert emulator.recover_runs()["resent"] == 0  # second send: waits 20 s (busy workers, not a loss)
    DriverRun.objects.filter(pk=run.pk).update(enqueued_at=now - timedelta(seconds=21))
    assert emulator.recover_runs()["resent"] == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_duplicate_deliveries_of_a_run_execute_it_once(qpu_pool, monkeypatch, settings):
    """The broker's retry, a resend by recover_runs and Redis's at-most-once hand-out can all
    deliver run_emulation twice; the compare-and-set on ``queued`` runs it once."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connection

    from apps.scheduling import passes, tasks
    from apps.scheduling.drivers import emulator
    from apps.scheduling.models import DriverRun

    monkeypatch.setattr(passes, "run_pool", lambda pool_id: {})
    executed = []
    lock = threading.Lock()

    def execute(run):
        with lock:
            executed.append(run.pk)
        run.status, run.result, run.runtime_seconds = "completed", {"counts": {"0": 1}}, 0.1

    monkeypatch.setattr(emulator, "execute", execute)
    device, run = running_run(qpu_pool, started_ago=0, beat_ago=None, attempts=0, status="queued")
    barrier = threading.Barrier(8)

    def deliver(_):
        try:
            barrier.wait(timeout=30)
            return tasks.run_emulation(run.remote_id)
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=8) as pool:
        outcomes = list(pool.map(deliver, range(8)))
    assert executed == [run.pk]
    assert sorted(outcomes) == ["completed"] + ["skipped"] * 7
    run = DriverRun.objects.get(pk=run.pk)
    assert (run.status, run.attempts) == ("completed", 1)


@pytest.mark.django_db(transaction=True)
def test_worker_presumed_dead_does_not_overwrite_the_rerun(qpu_pool, monkeypatch, sent, settings):
    """A worker that stalled past DEAD_AFTER but lived: its run was started again elsewhere; its
    late outcome is discarded (the compare-and-set on ``attempts``)."""
    from apps.scheduling import passes, tasks
    from apps.scheduling.drivers import emulator
    from apps.scheduling.models import DriverRun

    monkeypatch.setattr(passes, "run_pool", lambda pool_id: {})
    device, run = running_run(qpu_pool, started_ago=0, beat_ago=None, attempts=0, status="queued")

    def stalled(stale):
        # While this worker "computes", it is presumed dead, re-run, and the re-run starts.
        DriverRun.objects.filter(pk=stale.pk).update(heartbeat_at="2000-01-01T00:00:00Z")
        assert emulator.recover_runs()["rerun"] == 1
        DriverRun.objects.filter(pk=stale.pk).update(status="running", attempts=2)
        stale.status, stale.result = "completed", {"counts": {"stale": 1}}

    monkeypatch.setattr(emulator, "execute", stalled)
    assert tasks.run_emulation(run.remote_id) == "superseded"
    run.refresh_from_db()
    assert (run.status, run.attempts, run.result) == ("running", 2, None)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_heartbeat_is_stamped_while_the_simulation_runs(qpu_pool, settings):
    """The beat comes from its own thread and connection while the worker's thread is busy."""
    import time

    from django.db import connection

    from apps.scheduling.drivers import emulator
    from apps.scheduling.models import DriverRun

    device, run = running_run(qpu_pool, started_ago=0, beat_ago=0)
    first = run.heartbeat_at
    settings.GRIDGATE_EMULATOR_HEARTBEAT_SECONDS = 0.05
    seen = []
    with emulator.heartbeat(run.pk, run.attempts):
        for _ in range(400):  # bounded wait (a loaded machine): stop at the first new beat
            seen = list(DriverRun.objects.filter(pk=run.pk, heartbeat_at__gt=first).values_list("heartbeat_at"))
            if seen:
                break
            time.sleep(0.05)
    connection.close()
    assert seen, "no heartbeat was written"


def test_job_whose_emulation_worker_died_completes_after_the_rerun(
    qpu_pool, owner, open_session, django_capture_on_commit_callbacks, settings
):
    """The whole route: dispatched, its worker dies mid-simulation, the recovery pass re-runs it,
    the job completes (never failed for the worker's death)."""
    from datetime import timedelta

    from django.utils import timezone

    from apps.scheduling import passes, services
    from apps.scheduling.drivers import emulator
    from apps.scheduling.models import DriverRun

    Device.objects.create(pool=qpu_pool, name="emu", driver="emulator")
    session = open_session(qpu_pool, owner)
    job = services.submit_job(user=owner, session_id=session.pk, payload={"sequence": analog_sequence()}, shots=10)
    with django_capture_on_commit_callbacks(execute=False):  # the task is lost with its worker
        passes.run_pool(qpu_pool.pk)
    job.refresh_from_db()
    # A worker started it, then was killed: its heartbeat stopped long ago.
    DriverRun.objects.filter(remote_id=job.remote_id).update(
        status="running", attempts=1, heartbeat_at=timezone.now() - timedelta(seconds=dead_for(settings))
    )
    settings.GRIDGATE_TASKS_EAGER = True  # the re-sent task runs inline
    with django_capture_on_commit_callbacks(execute=True):
        assert emulator.recover_runs()["rerun"] == 1
    job.refresh_from_db()
    assert job.status == JobStatus.COMPLETED and sum(job.result["counts"].values()) == 10
    assert DriverRun.objects.get(remote_id=job.remote_id).attempts == 2


@pytest.mark.django_db(transaction=True)
def test_after_a_database_outage_runs_are_judged_dead_only_once_contact_has_lasted_dead_after(
    qpu_pool, sent, settings, monkeypatch
):
    """During a database outage no worker can beat, so when the database comes back every live run
    looks dead. The recovery pass judges deaths only once its ticker has had database contact for
    DEAD_AFTER: the live workers have beaten again by then, and only the run whose worker really
    died is re-run."""
    from datetime import timedelta

    from django.db import OperationalError
    from django.utils import timezone

    from apps.core import ticker
    from apps.scheduling.drivers import emulator
    from apps.scheduling.models import DriverRun

    settings.GRIDGATE_EMULATOR_DEAD_AFTER = 10
    clock = [1000.0]
    monkeypatch.setattr(ticker, "clock", lambda: clock[0])
    keeper = ticker.Ticker("recovery-side")
    monkeypatch.setattr(ticker, "_running", keeper)  # this process's ticker
    assert keeper.keep()
    clock[0] += 3600  # an hour of contact

    def database_away(*args):
        raise OperationalError("server closed the connection unexpectedly")

    real_acquire = ticker.acquire_lease
    monkeypatch.setattr(ticker, "acquire_lease", database_away)
    keeper.keep()  # the outage
    assert ticker.database_contact_seconds() == 0
    clock[0] += 60
    monkeypatch.setattr(ticker, "acquire_lease", real_acquire)
    assert keeper.keep()  # the database is back
    # Both runs' last beats are from before the outage: one's worker lives (it beats again once it
    # has reconnected), the other's died during the outage.
    device = Device.objects.create(pool=qpu_pool, name="emu", driver="emulator")
    stale = timezone.now() - timedelta(seconds=70)
    live, dead = (
        DriverRun.objects.create(
            remote_id=remote_id,
            device=device,
            payload={"sequence": "{}"},
            shots=1,
            status="running",
            attempts=1,
            started_at=stale,
            heartbeat_at=stale,
        )
        for remote_id in ("emu-live", "emu-dead")
    )
    assert emulator.recover_runs()["rerun"] == 0  # just reconnected: nobody had the time to beat
    clock[0] += 9
    DriverRun.objects.filter(pk=live.pk).update(heartbeat_at=timezone.now())  # its worker is back
    assert emulator.recover_runs()["rerun"] == 0
    clock[0] += 1  # DEAD_AFTER of contact
    assert emulator.recover_runs()["rerun"] == 1
    assert DriverRun.objects.get(pk=live.pk).status == "running"
    assert DriverRun.objects.get(pk=dead.pk).status == "queued"
    assert sent == [("apps.scheduling.tasks.run_emulation", ("emu-dead",))]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_an_emulation_start_locks_its_run_and_never_its_device(qpu_pool, monkeypatch):
    """Claiming a queued run, taken with its device joined in, locked the device's row too: the
    submissions to the pool (which hold its devices in share mode) waited for every start."""
    from apps.scheduling import tasks
    from apps.scheduling.models import DriverRun
    from tests.concurrency import locked_while

    device, run = running_run(qpu_pool, started_ago=0, beat_ago=None, attempts=0, status="queued")
    answers = locked_while(
        monkeypatch,
        DriverRun,
        "save",
        lambda: tasks._start(run.remote_id).status,
        [(DriverRun, run.remote_id), (Device, device.pk)],
    )
    assert answers == {("DriverRun", run.remote_id): True, ("Device", device.pk): False, "result": "running"}
