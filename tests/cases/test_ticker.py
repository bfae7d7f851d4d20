"""django-q2 wiring: the ticker loop, its lease, the schedule and event-triggered polls."""

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.backends.fake import FakeBackend
from apps.cases import services, tasks
from apps.cases.models import Case, CaseStatus
from tests.cases.conftest import launched

pytestmark = pytest.mark.django_db


def test_case_passes_are_registered_with_the_shared_tick_loop(db):
    from apps.core import ticker

    periodic = ticker.registered()["cases.passes"]
    assert periodic.func is tasks.run_passes and periodic.every() == 5


def test_tick_loop_runs_submit_poll_and_sync_passes(make_case):
    from apps.core import ticker

    FakeBackend.script = ("running", "succeeded")
    case = launched(make_case())
    Case.objects.filter(pk=case.pk).update(next_poll_at=timezone.now() - timedelta(seconds=1))
    # One step of the loop: every pass is due at a ticker's first step.
    assert "cases.passes" in ticker.Ticker().run_due()
    case.refresh_from_db()
    assert case.status == CaseStatus.RUNNING and case.last_synced_at is not None


def test_launch_enqueues_the_submit_step_and_the_submission_an_immediate_poll(
    make_case, django_capture_on_commit_callbacks, monkeypatch
):
    """R-CASE-1: the request only records the launch; the worker's submit step is enqueued once
    it commits, and a submitted case's first poll once the submission is recorded."""
    sent = []
    monkeypatch.setattr("django_q.tasks.async_task", lambda func, *args, **kw: sent.append((func, args)))
    case = make_case()
    with django_capture_on_commit_callbacks(execute=True):
        services.launch_case(case)
    assert sent == [("apps.cases.tasks.submit_cases", ([str(case.id)],))]
    assert FakeBackend.calls.get("submit", 0) == 0  # nothing reached the provider in the request
    with django_capture_on_commit_callbacks(execute=True):
        assert "recorded 1" in tasks.submit_cases([str(case.id)])
    assert sent[1:] == [("apps.cases.tasks.poll_cases", ([str(case.id)],))]
    assert "claimed 1" in tasks.poll_cases([str(case.id)])


def test_a_broker_that_refuses_the_message_leaves_the_launch_to_the_tick_loop(
    make_case, django_capture_on_commit_callbacks, monkeypatch
):
    def down(*args, **kwargs):
        raise ConnectionError("broker down")

    monkeypatch.setattr("django_q.tasks.async_task", down)
    case = make_case()
    with django_capture_on_commit_callbacks(execute=True):
        services.launch_case(case)  # no 500: the launch is recorded and the submit pass takes it
    assert "recorded 1" in tasks.run_passes()
    case.refresh_from_db()
    assert case.status == CaseStatus.PENDING
