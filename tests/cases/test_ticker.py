"""django-q2 wiring: the ticker loop, its lease, the schedule and event-triggered polls."""

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from apps.backends.fake import FakeBackend
from apps.cases import services, tasks
from apps.cases.models import Case, CaseStatus

pytestmark = pytest.mark.django_db


def test_case_ticker_schedule_exists_once(db):
    from django_q.models import Schedule

    schedule = Schedule.objects.get(name="gridgate.cases.ticker")
    assert schedule.func == "apps.cases.tasks.case_ticker" and schedule.minutes == 1


def test_only_one_ticker_holds_the_lease_until_it_expires():
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        assert tasks.acquire_lease("cases.ticker", "cluster-a", 60)
        assert not tasks.acquire_lease("cases.ticker", "cluster-b", 60)
        assert tasks.acquire_lease("cases.ticker", "cluster-a", 60)  # renewal
    with time_machine.travel(start + timedelta(seconds=61), tick=False):
        assert tasks.acquire_lease("cases.ticker", "cluster-b", 60)  # cluster-a died: taken over


def test_ticker_skips_when_another_cluster_runs_it():
    assert tasks.acquire_lease(tasks.TICKER_LEASE, "other-cluster", 60)
    assert tasks.case_ticker(duration=0, interval=1) == "another cluster runs the case ticker"


def test_ticker_runs_submit_poll_and_sync_passes(make_case):
    FakeBackend.script = ("running", "succeeded")
    case = services.launch_case(make_case())
    Case.objects.filter(pk=case.pk).update(next_poll_at=timezone.now() - timedelta(seconds=1))
    assert tasks.case_ticker(duration=0, interval=1) == "1 ticks"
    case.refresh_from_db()
    assert case.status == CaseStatus.RUNNING and case.last_synced_at is not None
    assert tasks.acquire_lease(tasks.TICKER_LEASE, "next-cluster", 60)  # released at the end


def test_launch_enqueues_an_immediate_poll(make_case, django_capture_on_commit_callbacks, monkeypatch):
    sent = []
    monkeypatch.setattr("django_q.tasks.async_task", lambda func, *args, **kw: sent.append((func, args)))
    with django_capture_on_commit_callbacks(execute=True):
        case = services.launch_case(make_case())
    assert sent == [("apps.cases.tasks.poll_cases", ([str(case.id)],))]
    assert "claimed 1" in tasks.poll_cases([str(case.id)])
