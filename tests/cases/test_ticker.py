"""django-q2 wiring: the ticker loop, its lease, the schedule and event-triggered polls."""

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.backends.fake import FakeBackend
from apps.cases import services, tasks
from apps.cases.models import Case, CaseStatus

pytestmark = pytest.mark.django_db


def test_case_passes_are_registered_with_the_shared_tick_loop(db):
    from apps.core import ticker

    periodic = ticker.registered()["cases.passes"]
    assert periodic.func is tasks.run_passes and periodic.every() == 5


def test_tick_loop_runs_submit_poll_and_sync_passes(make_case):
    from apps.core import ticker

    FakeBackend.script = ("running", "succeeded")
    case = services.launch_case(make_case())
    Case.objects.filter(pk=case.pk).update(next_poll_at=timezone.now() - timedelta(seconds=1))
    # duration=0: exactly one step of the loop, however slow the machine (issue 16, item 10: a
    # 10 ms window ran no step at all when the lease took longer to get).
    assert "cases.passes: 1" in ticker.tick(duration=0)
    case.refresh_from_db()
    assert case.status == CaseStatus.RUNNING and case.last_synced_at is not None


def test_launch_enqueues_an_immediate_poll(make_case, django_capture_on_commit_callbacks, monkeypatch):
    sent = []
    monkeypatch.setattr("django_q.tasks.async_task", lambda func, *args, **kw: sent.append((func, args)))
    with django_capture_on_commit_callbacks(execute=True):
        case = services.launch_case(make_case())
    assert sent == [("apps.cases.tasks.poll_cases", ([str(case.id)],))]
    assert "claimed 1" in tasks.poll_cases([str(case.id)])
