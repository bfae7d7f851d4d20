"""The case lifecycle on the fake backend, with injected faults (R-CASE-1 … 6)."""

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from apps.backends.base import SubmitUncertain
from apps.backends.fake import FakeBackend
from apps.cases import passes, services, workspace
from apps.cases.models import Case, CaseStatus
from apps.core import exceptions as service_errors
from apps.core.api.exceptions import Conflict
from tests.cases.conftest import drive, launched, statuses

pytestmark = pytest.mark.django_db


def test_fake_case_goes_prepared_pending_running_done_with_results_on_disk(make_case):
    case = make_case()
    assert case.status == CaseStatus.PREPARED and case.backend == "fake"
    case = launched(case, launch_options={"outcome": "succeed"})
    assert case.status == CaseStatus.PENDING and case.remote_id and case.submitted_at

    passes.poll_pass(case_ids=[case.id])  # scripted: pending
    case.refresh_from_db()
    assert case.status == CaseStatus.PENDING
    passes.poll_pass(case_ids=[case.id])  # running
    case.refresh_from_db()
    assert case.status == CaseStatus.RUNNING and case.started_at
    case = drive(case)

    assert case.status == CaseStatus.DONE
    assert case.results_fetched and case.progress == 1.0 and case.finished_at
    results = workspace.case_dir(case.id) / "results" / "result.txt"
    assert results.read_text() == f"fake result of {case.id}\n"
    assert statuses(case) == [
        ("", "prepared"),
        ("prepared", "pending"),
        ("pending", "running"),
        ("running", "done"),
    ]
    assert "step 4/4: succeeded" in (workspace.case_dir(case.id) / "stdout.log").read_text()


def test_r_case_4_done_only_after_results_are_in_results_dir(make_case):
    """R-CASE-4: a failing fetch_final keeps the case running; a later pass finishes it."""
    case = launched(make_case())
    FakeBackend.faults.fail_fetch_final = 2
    case = drive(case, max_passes=4, until=CaseStatus.DONE)
    assert case.status == CaseStatus.RUNNING
    assert not case.results_fetched
    assert "fetching results failed" in case.last_error
    assert not (workspace.case_dir(case.id) / "results" / "result.txt").exists()

    case = drive(case, max_passes=3, until=CaseStatus.DONE)
    assert case.status == CaseStatus.DONE and case.results_fetched
    assert (workspace.case_dir(case.id) / "results" / "result.txt").exists()
    assert case.last_error == "" and case.poll_failures == 0


def test_r_case_3_failed_polls_change_nothing_but_counters_and_back_off(make_case):
    case = launched(make_case())
    drive(case, max_passes=2, until=CaseStatus.RUNNING)
    case.refresh_from_db()
    assert case.status == CaseStatus.RUNNING
    before = Case.objects.values().get(pk=case.pk)

    FakeBackend.faults.fail_polls = 3
    now = timezone.now()
    delays = []
    for i in range(3):
        at = now + timedelta(hours=i)
        passes.poll_pass(case_ids=[case.id], now=at)
        case.refresh_from_db()
        delays.append((case.next_poll_at - at).total_seconds())
    assert case.status == CaseStatus.RUNNING
    assert case.poll_failures == 3
    assert "provider unreachable" in case.last_error
    assert delays == [20, 40, 80]  # exponential from the 10 s cadence
    after = Case.objects.values().get(pk=case.pk)
    changed = {key for key in before if before[key] != after[key]}
    assert changed <= {"poll_failures", "last_error", "last_polled_at", "next_poll_at"}

    case = drive(case)
    assert case.status == CaseStatus.DONE and case.poll_failures == 0 and case.last_error == ""


def test_r_case_3_back_off_is_capped(make_case, settings):
    settings.GRIDGATE_CASE_MAX_BACKOFF_SECONDS = 300
    assert passes.backoff(1).total_seconds() == 20
    assert passes.backoff(50).total_seconds() == 300


def test_r_case_1_failed_submit_marks_the_case_failed_with_the_error(make_case):
    FakeBackend.faults.fail_submit = 1
    case = launched(make_case())
    assert case.status == CaseStatus.FAILED
    assert "submission refused" in case.last_error
    assert case.remote_id == "" and case.finished_at
    assert statuses(case)[-1] == ("prepared", "failed")


def test_r_case_1_retried_launch_adopts_the_job_instead_of_submitting_again(make_case, fake):
    """The web process died after the provider accepted the job but before recording it."""
    case = make_case()
    spec = passes.build_spec(case)
    remote_id = fake.submit(spec)  # the job reached the provider…
    Case.objects.filter(pk=case.pk).update(  # …and the launcher died holding its lease
        launch_requested_at=timezone.now() - timedelta(minutes=5),
        lease_owner="dead-worker",
        lease_until=timezone.now() - timedelta(minutes=3),
    )
    report = passes.submit_pass()
    case.refresh_from_db()
    assert report.recorded == 1
    assert case.status == CaseStatus.PENDING and case.remote_id == remote_id
    assert FakeBackend.calls["submit"] == 1

    # A second launch request on the submitted case is refused, never a second job.
    with pytest.raises(service_errors.Conflict) as refused:
        services.launch_case(case)
    assert refused.value.extra["status"] == CaseStatus.PENDING
    assert FakeBackend.calls["submit"] == 1 and len(FakeBackend.jobs) == 1


def test_r_case_1_launch_while_another_launch_holds_the_lease_is_refused(make_case):
    case = make_case()
    Case.objects.filter(pk=case.pk).update(
        launch_requested_at=timezone.now(), lease_owner="other", lease_until=timezone.now() + timedelta(minutes=1)
    )
    with pytest.raises(service_errors.Conflict):
        services.launch_case(case)
    assert FakeBackend.calls.get("submit", 0) == 0


def test_remote_failure_ends_failed_with_its_logs(make_case):
    case = launched(make_case(), launch_options={"outcome": "fail"})
    case = drive(case)
    assert case.status == CaseStatus.FAILED
    assert "scripted failure" in case.last_error
    assert "simulated failure" in (workspace.case_dir(case.id) / "stderr.log").read_text()
    assert not case.results_fetched


def test_r_case_6_cancel_racing_completion_answers_409_with_the_real_final_status(make_case, fake):
    """The provider finished the job after our last poll: it refuses the abort."""
    case = launched(make_case())
    drive(case, max_passes=2, until=CaseStatus.RUNNING)
    fake.complete(case.remote_id)
    polls = FakeBackend.calls["poll"]
    with pytest.raises(Conflict) as refused:
        services.cancel_case(case)
    # The answer is the real final state, from one status call; recording it (after the results
    # are fetched, R-CASE-4) is left to the worker's pass (R-CASE-2), which is due now.
    assert refused.value.extra["status"] == CaseStatus.DONE
    assert refused.value.extra["recorded_status"] == CaseStatus.RUNNING
    assert FakeBackend.calls["poll"] == polls + 1
    case.refresh_from_db()
    assert case.status == CaseStatus.RUNNING and not case.results_fetched
    passes.poll_pass()
    case.refresh_from_db()
    assert case.status == CaseStatus.DONE and case.results_fetched


def test_r_case_6_cancel_of_a_case_already_recorded_done_is_409(make_case):
    case = drive(launched(make_case()))
    with pytest.raises(Conflict) as refused:
        services.cancel_case(case)
    assert refused.value.extra["status"] == CaseStatus.DONE


def test_r_case_6_cancel_running_case_then_cancel_again(make_case):
    case = launched(make_case())
    case = services.cancel_case(case)
    assert case.status == CaseStatus.CANCELLED and case.finished_at
    assert FakeBackend.jobs[case.remote_id].cancelled
    with pytest.raises(Conflict) as again:
        services.cancel_case(case)
    assert again.value.extra["status"] == CaseStatus.CANCELLED


def test_r_case_6_cancel_prepared_case_just_marks_it(make_case):
    case = services.cancel_case(make_case())
    assert case.status == CaseStatus.CANCELLED
    assert FakeBackend.calls.get("cancel", 0) == 0


def test_pass_skips_write_back_when_the_case_was_cancelled_meanwhile(make_case, monkeypatch):
    case = launched(make_case())
    original_poll = FakeBackend.poll_many

    def poll_then_user_cancels(self, jobs):
        answers = original_poll(self, jobs)
        Case.objects.filter(pk=case.pk).update(status=CaseStatus.CANCELLED)  # a cancel lands mid-pass
        return answers

    monkeypatch.setattr(FakeBackend, "poll_many", poll_then_user_cancels)
    report = passes.poll_pass(case_ids=[case.id])
    case.refresh_from_db()
    assert report.skipped == 1 and report.recorded == 0
    assert case.status == CaseStatus.CANCELLED and case.lease_owner == ""


def test_r_case_5_progress_is_never_read_from_a_stale_synced_marker(make_case, fake):
    case = launched(make_case())
    drive(case, max_passes=2, until=CaseStatus.RUNNING)
    fake.set_progress_marker(case.remote_id, "0.4")
    passes.sync_pass(case_ids=[case.id])
    case.refresh_from_db()
    assert case.progress == pytest.approx(0.4)
    assert (workspace.case_dir(case.id) / "live" / ".gridgate" / "progress").read_text() == "0.4"

    case = drive(case)
    assert case.status == CaseStatus.DONE and case.progress == 1.0
    # The stale copy is still in live/: later passes and refreshes never bring it back.
    assert (workspace.case_dir(case.id) / "live" / ".gridgate" / "progress").read_text() == "0.4"
    passes.sync_pass(case_ids=[case.id])
    passes.poll_pass(case_ids=[case.id])
    case.refresh_from_db()
    assert case.progress == 1.0


def test_r_case_5_a_sync_racing_the_final_poll_never_overwrites_the_final_progress(make_case, fake, monkeypatch):
    """The sync pass read the marker (0.4) of a running case while a poll finalized it: the
    write-back must not replace the final progress (1) with the stale marker."""
    case = launched(make_case())
    drive(case, max_passes=2, until=CaseStatus.RUNNING)
    fake.set_progress_marker(case.remote_id, "0.4")
    original = FakeBackend.sync

    def sync_while_the_poll_finalizes(self, job_ref, globs):
        original(self, job_ref, globs)
        Case.objects.filter(pk=case.pk).update(status=CaseStatus.DONE, progress=1.0, results_fetched=True)

    monkeypatch.setattr(FakeBackend, "sync", sync_while_the_poll_finalizes)
    report = passes.sync_pass(case_ids=[case.id])
    assert report.claimed == 1 and report.skipped == 1
    assert (workspace.case_dir(case.id) / "live" / ".gridgate" / "progress").read_text() == "0.4"
    case.refresh_from_db()
    assert case.status == CaseStatus.DONE and case.progress == 1.0


def test_a_runai_pool_runs_cases_and_a_kind_left_out_of_the_mapping_says_so(owner, db, settings, monkeypatch, tmp_path):
    """Launching on a Run:AI pool is accepted (the worker submits it to Run:AI); a kind
    the operators left out of GRIDGATE_CASE_BACKENDS is refused naming the kinds that run cases."""
    from apps.resources.models import ResourceClass, ResourcePool

    monkeypatch.setenv("GRIDGATE_CRED_RUNAI_CLIENT_ID", "gridgate")
    monkeypatch.setenv("GRIDGATE_CRED_RUNAI_CLIENT_SECRET", "not-a-real-secret")

    pool = ResourcePool.objects.create(
        name="gpu",
        kind="runai",
        public=True,
        remote={
            "base_url": "https://runai.example.org",
            "credentials": "service",
            "working_root": str(tmp_path),
            "image": "python:3.12",
        },
    )
    rc = ResourceClass.objects.create(pool=pool, name="a100", cpu=8, memory=64, gpu=1, default=True)
    settings.GRIDGATE_CASE_BACKENDS = {"local": "fake", "runai": "runai"}
    case = services.create_case(owner=owner, resource_class=rc, name="train", command="python train.py")
    services.launch_case(case)
    case.refresh_from_db()
    assert case.backend == "runai" and case.launch_requested_at is not None
    settings.GRIDGATE_CASE_BACKENDS = {"local": "fake"}
    other = services.create_case(owner=owner, resource_class=rc, name="train2", command="python train.py")
    with pytest.raises(service_errors.Invalid) as refused:
        services.launch_case(other)
    assert "runai" in refused.value.detail and "no case backend" in refused.value.detail
    other.refresh_from_db()
    assert other.status == CaseStatus.PREPARED


def test_poll_pass_query_count_does_not_grow_with_cases(make_case):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def queries_for(n):
        cases = [launched(make_case(name=f"c{i}")) for i in range(n)]
        Case.objects.filter(pk__in=[c.pk for c in cases]).update(next_poll_at=timezone.now() - timedelta(seconds=1))
        with CaptureQueriesContext(connection) as ctx:
            report = passes.poll_pass()
        assert report.recorded == n
        Case.objects.all().delete()
        return len(ctx.captured_queries)

    small, large = queries_for(3), queries_for(30)
    assert small == large


def test_r_case_1_a_slow_submit_renews_its_lease_so_no_other_worker_submits_again(make_case, settings, monkeypatch):
    """The launch lease (120 s) used to expire during a long upload; the submit pass of another
    worker then took the launch over and submitted a second job."""
    settings.GRIDGATE_CASE_LEASE_SECONDS = 120
    case = make_case()
    start = timezone.now()
    original = FakeBackend.submit
    takeovers = []

    def slow_submit(self, spec):
        with time_machine.travel(start + timedelta(seconds=100), tick=False):
            spec.heartbeat()  # between two uploads
        with time_machine.travel(start + timedelta(seconds=200), tick=False):
            takeovers.append(passes.submit_pass())  # past the first lease: another worker looks
        return original(self, spec)

    monkeypatch.setattr(FakeBackend, "submit", slow_submit)
    with time_machine.travel(start, tick=False):
        case = launched(case)
    assert [report.claimed for report in takeovers] == [0]
    assert FakeBackend.calls["submit"] == 1 and len(FakeBackend.jobs) == 1
    assert case.status == CaseStatus.PENDING and case.lease_owner == ""


def test_r_case_1_a_submit_whose_lease_was_taken_over_stops_before_submitting(make_case, monkeypatch):
    case = make_case()
    original = FakeBackend.submit

    def submit_after_takeover(self, spec):
        Case.objects.filter(pk=case.pk).update(lease_owner="other-worker")  # our lease expired, taken
        spec.heartbeat()
        return original(self, spec)

    monkeypatch.setattr(FakeBackend, "submit", submit_after_takeover)
    case = launched(case)
    assert FakeBackend.jobs == {} and FakeBackend.calls.get("submit", 0) == 0
    assert case.status == CaseStatus.PREPARED and case.lease_owner == "other-worker"


def test_r_case_2_a_poll_pass_that_lost_its_lease_appends_no_log_delta(make_case, monkeypatch):
    """Two workers must never append the same output delta: a pass whose lease was taken over
    during the provider call leaves the case (and its delta) to the new holder."""
    case = launched(make_case())
    original = FakeBackend.poll_many

    def slow_poll(self, jobs):
        answers = original(self, jobs)
        Case.objects.filter(pk=case.pk).update(lease_owner="other-worker")
        return answers

    monkeypatch.setattr(FakeBackend, "poll_many", slow_poll)
    report = passes.poll_pass(case_ids=[case.id])
    assert report.recorded == 0
    assert (workspace.case_dir(case.id) / "stdout.log").read_text() == ""


def test_r_case_6_cancel_in_the_uncertain_submit_back_off_stops_the_provider_job(make_case, monkeypatch):
    """The submission timed out but reached the provider; the user cancels during the back-off:
    the job must not keep running unseen."""
    case = make_case()
    original = FakeBackend.submit

    def submit_then_time_out(self, spec):
        original(self, spec)
        raise SubmitUncertain("fake: no answer within 30 s")

    monkeypatch.setattr(FakeBackend, "submit", submit_then_time_out)
    case = launched(case)
    monkeypatch.setattr(FakeBackend, "submit", original)
    assert case.status == CaseStatus.PREPARED and case.launch_requested_at is not None
    ((_remote_id, job),) = FakeBackend.jobs.items()
    case = services.cancel_case(case)
    assert case.status == CaseStatus.CANCELLED
    assert job.cancelled and FakeBackend.calls["cancel"] == 1


def test_r_case_2_refresh_enqueues_the_passes_and_answers_from_the_database(make_case, monkeypatch):
    case = launched(make_case())
    sent = []
    monkeypatch.setattr("apps.cases.passes.enqueue_refresh", lambda ids: sent.append(list(ids)))
    polls = FakeBackend.calls.get("poll", 0)
    refreshed = services.refresh_case(case)
    assert refreshed.status == CaseStatus.PENDING
    assert FakeBackend.calls.get("poll", 0) == polls and FakeBackend.calls.get("sync", 0) == 0
    assert sent == [[case.id]]


def test_r_back_1_a_secret_in_a_submission_error_never_reaches_last_error(make_case, monkeypatch, local_pool):
    monkeypatch.setenv("GRIDGATE_CRED_TEST_TOKEN", "s3cr3t-token-value")
    local_pool.remote = {"token_env": "GRIDGATE_CRED_TEST_TOKEN"}
    local_pool.save(update_fields=["remote"])

    def leaky_submit(self, spec):
        raise RuntimeError("401 for token s3cr3t-token-value")

    monkeypatch.setattr(FakeBackend, "submit", leaky_submit)
    case = launched(make_case())
    assert case.status == CaseStatus.FAILED
    assert "s3cr3t-token-value" not in case.last_error and "***" in case.last_error
    assert not case.events.filter(message__contains="s3cr3t-token-value").exists()


def test_r_case_6_a_cancel_whose_stop_the_poll_recorded_during_its_grace_period_answers_200(make_case, monkeypatch):
    """A command that traps SIGTERM is stopped only after the grace period (SIGKILL); the worker's
    poll runs meanwhile, sees the stop and records `cancelled` first. The cancel did what was
    asked: 200 with the case, not 409 "already ended"."""
    case = launched(make_case())
    real_cancel = FakeBackend.cancel

    def cancel_during_which_the_worker_polls(self, job):
        real_cancel(self, job)
        passes.poll_pass(case_ids=[case.id])  # the per-host pass, during the grace period

    monkeypatch.setattr(FakeBackend, "cancel", cancel_during_which_the_worker_polls)
    cancelled = services.cancel_case(case)
    assert cancelled.status == CaseStatus.CANCELLED
    with pytest.raises(Conflict):  # a repeat is still the 409 of a case that had ended
        services.cancel_case(cancelled)
