"""The worker half of a launch (R-CASE-1): submission off the request path, retries of transient
and uncertain submissions, orphan jobs, and the write-back guards of the passes (R-CASE-2)."""

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from apps.backends.fake import FakeBackend
from apps.cases import passes, services
from apps.cases.models import Case, CaseEvent, CaseStatus
from tests.cases.conftest import launched

pytestmark = pytest.mark.django_db


def test_r_case_1_launch_records_the_request_and_submits_nothing_in_the_request(make_case):
    case = services.launch_case(make_case(), launch_options={"outcome": "succeed"})
    assert case.status == CaseStatus.PREPARED and case.launch_requested_at is not None
    assert case.is_submitting and case.display_status == "submitting"
    assert FakeBackend.calls.get("find", 0) == 0 and FakeBackend.calls.get("submit", 0) == 0
    assert passes.submit_pass().recorded == 1  # the worker's step
    case.refresh_from_db()
    assert case.status == CaseStatus.PENDING and case.remote_id and not case.is_submitting


def test_r_case_1_a_transient_submit_error_retries_with_backoff_instead_of_failing(make_case):
    FakeBackend.faults.transient_submit = 1
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        case = launched(make_case())
        assert case.status == CaseStatus.PREPARED and case.poll_failures == 1
        assert "will retry" in case.last_error and "provider busy" in case.last_error
        assert passes.submit_pass().claimed == 0  # backing off
    with time_machine.travel(start + passes.backoff(1) + timedelta(seconds=1), tick=False):
        assert passes.submit_pass().recorded == 1
    case.refresh_from_db()
    assert case.status == CaseStatus.PENDING and case.last_error == "" and case.poll_failures == 0
    assert FakeBackend.calls["submit"] == 2 and len(FakeBackend.jobs) == 1


def test_r_case_1_a_permanent_submit_error_fails_the_case_with_the_error(make_case):
    FakeBackend.faults.fail_submit = 1
    case = launched(make_case())
    assert case.status == CaseStatus.FAILED and "submission refused" in case.last_error
    assert FakeBackend.calls["submit"] == 1


def test_r_case_1_an_uncertain_submission_is_adopted_by_name_on_the_retry(make_case):
    FakeBackend.faults.uncertain_submit = 1  # the job reached the provider, its answer did not
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        case = launched(make_case())
    assert case.status == CaseStatus.PREPARED and case.remote_id == ""
    with time_machine.travel(start + passes.backoff(1) + timedelta(seconds=1), tick=False):
        passes.submit_pass()
    case.refresh_from_db()
    assert case.status == CaseStatus.PENDING and case.remote_id in FakeBackend.jobs
    assert FakeBackend.calls["submit"] == 1 and len(FakeBackend.jobs) == 1


def test_r_case_1_after_the_last_uncertain_attempt_the_orphan_job_is_cancelled(make_case, monkeypatch):
    """Every answer is lost and the job only shows up after the last attempt: the case fails,
    and the provider is asked once more so the job does not run unrecorded."""
    FakeBackend.faults.uncertain_submit = 1
    hidden = {"on": True}
    original_find = FakeBackend.find
    monkeypatch.setattr(FakeBackend, "find", lambda self, spec: None if hidden["on"] else original_find(self, spec))
    case = make_case()
    services.launch_case(case)
    Case.objects.filter(pk=case.pk).update(poll_failures=passes.MAX_SUBMIT_ATTEMPTS - 1)  # the last attempt

    def submit_then_show(self, spec, _submit=FakeBackend.submit):
        try:
            return _submit(self, spec)
        finally:
            hidden["on"] = False  # the provider lists the job from now on

    monkeypatch.setattr(FakeBackend, "submit", submit_then_show)
    passes.submit_pass(case_ids=[case.id])
    case.refresh_from_db()
    assert case.status == CaseStatus.FAILED and "lost" in case.last_error
    (job,) = FakeBackend.jobs.values()
    assert job.cancelled and FakeBackend.calls["cancel"] == 1
    assert case.events.filter(kind=CaseEvent.Kind.CANCEL, message__contains="orphan").exists()


def test_r_case_6_a_cancel_landing_while_the_submission_is_in_flight_cancels_the_orphan(make_case, monkeypatch):
    case = make_case()
    services.launch_case(case)
    original = FakeBackend.submit

    def submit_racing_a_cancel(self, spec):
        # The user cancels while sbatch/the upload is under way: the provider lists no job yet,
        # so the cancel finds nothing to stop; the job appears once the submission completes.
        services.cancel_case(Case.objects.get(pk=case.pk))
        return original(self, spec)

    monkeypatch.setattr(FakeBackend, "submit", submit_racing_a_cancel)
    report = passes.submit_pass(case_ids=[case.id])
    case.refresh_from_db()
    assert report.recorded == 0 and case.status == CaseStatus.CANCELLED and case.remote_id == ""
    (job,) = FakeBackend.jobs.values()
    assert job.cancelled  # nothing runs (or bills) for a cancelled case


def test_r_case_2_the_write_back_skips_a_case_whose_remote_id_changed_meanwhile(make_case, monkeypatch):
    """The poll answered for the old job; the case was resubmitted as another one meanwhile (same
    status): the old job's answer must not be written over the new job's case."""
    case = launched(make_case())
    old_remote = case.remote_id
    original = FakeBackend.poll_many

    def poll_then_resubmitted(self, jobs):
        answers = original(self, jobs)  # the old job answers "running"
        Case.objects.filter(pk=case.pk).update(remote_id="fake-resubmitted")
        return answers

    monkeypatch.setattr(FakeBackend, "poll_many", poll_then_resubmitted)
    report = passes.poll_pass(case_ids=[case.id])
    case.refresh_from_db()
    assert report.skipped == 1 and report.recorded == 0
    assert case.remote_id == "fake-resubmitted" and case.remote_id != old_remote
    assert case.status == CaseStatus.PENDING and case.last_polled_at is None
    assert not case.events.filter(to_status=CaseStatus.RUNNING).exists()
    assert case.lease_owner == ""  # released, not left to expire


def test_provider_note_on_a_waiting_case_reaches_the_case_and_its_history(make_case, monkeypatch):
    from apps.backends.base import BackendState

    case = launched(make_case())
    monkeypatch.setattr(
        FakeBackend,
        "poll_many",
        lambda self, jobs: {j.remote_id: BackendState("pending", message="Slurm: JobHeldAdmin") for j in jobs},
    )
    passes.poll_pass(case_ids=[case.id])
    passes.poll_pass(case_ids=[case.id])  # the same note again: one event only
    case.refresh_from_db()
    assert case.status_message == "Slurm: JobHeldAdmin"
    notes = list(case.events.filter(kind=CaseEvent.Kind.NOTE).values_list("message", flat=True))
    assert notes == ["Slurm: JobHeldAdmin"]
    monkeypatch.setattr(
        FakeBackend, "poll_many", lambda self, jobs: {j.remote_id: BackendState("running") for j in jobs}
    )
    passes.poll_pass(case_ids=[case.id])
    case.refresh_from_db()
    assert case.status == CaseStatus.RUNNING and case.status_message == ""
