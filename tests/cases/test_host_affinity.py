"""Host affinity: a host-bound backend's case (local: a process seen only in its host's /proc) is
pinned to the worker host that starts it, and only that host's workers claim it. Hosts are distinct
GRIDGATE_WORKER_HOST identities (override_settings)."""

import threading

import pytest
from django.test import override_settings

from apps.backends.fake import FakeBackend
from apps.cases import passes, services, tasks
from apps.cases.models import Case, CaseEvent, CaseStatus
from apps.core import ticker
from tests.cases.conftest import launched

pytestmark = pytest.mark.django_db

HOST_A = override_settings(GRIDGATE_WORKER_HOST="host-a")
HOST_B = override_settings(GRIDGATE_WORKER_HOST="host-b")


@pytest.fixture
def host_bound(monkeypatch):
    """The fake backend standing in for a host-bound one (the local backend's own run is in
    tests/backends/test_local.py::test_a_local_case_started_on_one_host_is_never_polled_by_another)."""
    monkeypatch.setattr(FakeBackend, "host_bound", True)
    FakeBackend.script = ("running", "succeeded")  # the first poll says running


def test_a_host_bound_case_is_pinned_to_the_host_that_submits_it(make_case, host_bound):
    with HOST_A:
        case = launched(make_case())
    assert case.status == CaseStatus.PENDING and case.run_host == "host-a"


def test_a_case_started_on_host_a_is_not_polled_by_a_pass_on_host_b(make_case, host_bound):
    with HOST_A:
        case = launched(make_case())
    with HOST_B:
        report = passes.poll_pass(case_ids=[case.id])
        assert report.claimed == 0
        assert passes.poll_pass().claimed == 0 and passes.sync_pass().claimed == 0
    assert FakeBackend.calls.get("poll", 0) == 0
    with HOST_A:
        assert passes.poll_pass(case_ids=[case.id]).claimed == 1
    case.refresh_from_db()
    assert case.status == CaseStatus.RUNNING


def test_the_submit_of_a_not_yet_started_host_bound_case_is_taken_by_any_host(make_case, host_bound):
    case = make_case()
    services.launch_case(case)
    with HOST_B:
        assert passes.submit_pass().recorded == 1
    case.refresh_from_db()
    assert case.run_host == "host-b" and case.status == CaseStatus.PENDING


def test_a_pinned_launch_waiting_for_its_retry_is_retried_only_on_its_host(make_case, host_bound):
    FakeBackend.faults.transient_submit = 1
    with HOST_A:
        case = launched(make_case())
    assert case.status == CaseStatus.PREPARED and case.run_host == "host-a"
    Case.objects.filter(pk=case.pk).update(lease_until=None)  # the back-off is over
    with HOST_B:
        assert passes.submit_pass().claimed == 0
    with HOST_A:
        assert passes.submit_pass().recorded == 1


def test_remote_backend_cases_stay_claimable_by_any_host(make_case):
    FakeBackend.script = ("running", "succeeded")
    with HOST_A:
        case = launched(make_case())
    assert case.run_host == ""
    with HOST_B:
        assert passes.poll_pass(case_ids=[case.id]).claimed == 1


def test_host_passes_take_only_this_hosts_pinned_cases(make_case, host_bound):
    with HOST_A:
        mine = launched(make_case())
    FakeBackend.host_bound = False
    remote = launched(make_case())
    Case.objects.update(next_poll_at=None)
    Case.objects.filter(pk__in=[mine.pk, remote.pk]).update(next_poll_at="2000-01-01T00:00Z")
    with HOST_A:
        tasks.run_host_passes()
    mine.refresh_from_db()
    remote.refresh_from_db()
    assert mine.status == CaseStatus.RUNNING and remote.status == CaseStatus.PENDING


def test_host_passes_run_in_every_hosts_ticker_not_only_the_shared_loop():
    periodics = ticker.registered()
    assert periodics["cases.host_passes"].per_host
    assert not periodics["cases.passes"].per_host


def test_a_cancel_asked_on_another_host_is_carried_out_by_the_run_hosts_poll(make_case, host_bound):
    with HOST_A:
        case = launched(make_case())
    with HOST_B:
        answered = services.cancel_case(case)
        assert answered.status == CaseStatus.PENDING and answered.cancel_requested_at is not None
        assert FakeBackend.calls.get("cancel", 0) == 0  # host B never touches host A's process
        again = services.cancel_case(case)  # idempotent
        assert again.cancel_requested_at == answered.cancel_requested_at
    assert case.events.filter(kind=CaseEvent.Kind.CANCEL).count() == 1
    with HOST_A:
        passes.poll_pass(case_ids=[case.id])
    case.refresh_from_db()
    assert case.status == CaseStatus.CANCELLED and FakeBackend.calls["cancel"] == 1


def test_a_cancel_on_the_run_host_itself_stops_the_case_at_once(make_case, host_bound):
    with HOST_A:
        case = launched(make_case())
        assert services.cancel_case(case).status == CaseStatus.CANCELLED


def test_upgrading_pins_unfinished_local_cases_to_the_host_that_migrates(make_case):
    """Migration 0008: local cases from the single-host era that may have a process running stay
    with the host that ran them (the one running ``migrate``), never claimable by a new host."""
    import importlib

    from django.apps import apps as django_apps
    from django.utils import timezone

    migration = importlib.import_module("apps.cases.migrations.0008_pin_unfinished_local_cases")
    now = timezone.now()
    shapes = {
        "pending": {"status": CaseStatus.PENDING, "backend": "local", "remote_id": "local:1"},
        "running": {"status": CaseStatus.RUNNING, "backend": "local", "remote_id": "local:2"},
        "submitting": {"status": CaseStatus.PREPARED, "backend": "local", "launch_requested_at": now},
        "never launched": {"status": CaseStatus.PREPARED},
        "done": {"status": CaseStatus.DONE, "backend": "local", "results_fetched": True},
        "cancelled": {"status": CaseStatus.CANCELLED, "backend": "local", "launch_requested_at": now},
        "on slurm": {"status": CaseStatus.RUNNING, "backend": "slurm", "remote_id": "42"},
        "pinned already": {"status": CaseStatus.RUNNING, "backend": "local", "run_host": "host-b"},
    }
    cases = {}
    for name, fields in shapes.items():
        cases[name] = make_case(name=name)
        Case.objects.filter(pk=cases[name].pk).update(**fields)
    with override_settings(GRIDGATE_WORKER_HOST="old-host"):
        migration.pin_unfinished_local_cases(django_apps, None)
    pinned = dict(Case.objects.values_list("name", "run_host"))
    assert pinned == {
        "pending": "old-host",
        "running": "old-host",
        "submitting": "old-host",
        "never launched": "",
        "done": "",
        "cancelled": "",
        "on slurm": "",
        "pinned already": "host-b",
    }
    with HOST_B:  # a new host no longer takes the old host's running case
        assert passes.poll_pass(case_ids=[cases["running"].id]).claimed == 0


class WorkerKilled(BaseException):
    """The worker dies (SIGKILL): nothing after this point of the submission runs."""


def started_then_killed(make_case, monkeypatch):
    """Host A's worker pins the case, starts its process, and dies before recording it: the case
    stays prepared, pinned to host A, its launch requested, a process running on host A."""
    original = FakeBackend.submit

    def submit_and_die(self, spec):
        original(self, spec)
        raise WorkerKilled

    case = make_case()
    services.launch_case(case)
    monkeypatch.setattr(FakeBackend, "submit", submit_and_die)
    with HOST_A, pytest.raises(WorkerKilled):
        passes.submit_pass(case_ids=[case.id])
    monkeypatch.setattr(FakeBackend, "submit", original)
    Case.objects.filter(pk=case.pk).update(lease_until=None)  # the dead worker's lease expired
    case.refresh_from_db()
    assert case.status == CaseStatus.PREPARED and case.run_host == "host-a"
    [job] = FakeBackend.jobs.values()
    return case, job


def test_a_launch_cancelled_from_another_host_is_stopped_by_the_run_hosts_pass(make_case, host_bound, monkeypatch):
    """R-CASE-6: the web on host W cannot see host A's process; host A's pass stops it."""
    case, job = started_then_killed(make_case, monkeypatch)
    with override_settings(GRIDGATE_WORKER_HOST="web-w"):
        answered = services.cancel_case(case)
    assert answered.status == CaseStatus.CANCELLED and answered.cancel_requested_at is not None
    assert FakeBackend.calls.get("cancel", 0) == 0 and not job.cancelled  # nothing tried on W
    with HOST_B:
        assert tasks.run_host_passes() and FakeBackend.calls.get("cancel", 0) == 0  # not B's either
    with HOST_A:
        tasks.run_host_passes()
    case.refresh_from_db()
    assert job.cancelled and FakeBackend.calls["cancel"] == 1
    assert case.cancel_requested_at is None and not case.lease_owner  # done: asked once only
    with HOST_A:
        assert passes.orphan_cancel_pass().claimed == 0
    assert case.events.filter(kind=CaseEvent.Kind.CANCEL, message__startswith="cancelled the orphan job").exists()


def test_a_failed_orphan_cancel_is_retried_by_the_run_host(make_case, host_bound, monkeypatch):
    case, job = started_then_killed(make_case, monkeypatch)
    with override_settings(GRIDGATE_WORKER_HOST="web-w"):
        services.cancel_case(case)
    original = FakeBackend.cancel
    monkeypatch.setattr(FakeBackend, "cancel", lambda self, ref: (_ for _ in ()).throw(RuntimeError("busy")))
    with HOST_A:
        assert passes.orphan_cancel_pass().skipped == 1
    case.refresh_from_db()
    assert case.cancel_requested_at is not None and not job.cancelled
    monkeypatch.setattr(FakeBackend, "cancel", original)
    Case.objects.filter(pk=case.pk).update(lease_until=None)  # its back-off (the lease) is over
    with HOST_A:
        assert passes.orphan_cancel_pass().recorded == 1
    assert job.cancelled


def test_a_launch_cancelled_on_its_run_host_is_stopped_at_once(make_case, host_bound, monkeypatch):
    case, job = started_then_killed(make_case, monkeypatch)
    with HOST_A:
        answered = services.cancel_case(case)
    assert answered.status == CaseStatus.CANCELLED and job.cancelled
    assert answered.cancel_requested_at is None


def test_a_launch_cancel_that_failed_on_its_run_host_is_retried_by_the_orphan_pass(make_case, host_bound, monkeypatch):
    """R-CASE-6: the provider did not answer the inline cancel; the request stays recorded and the
    run host's orphan pass stops what the launch started once the provider answers again."""
    case, job = started_then_killed(make_case, monkeypatch)
    real = passes.cancel_orphan
    monkeypatch.setattr(passes, "cancel_orphan", lambda case: False)  # the provider is away
    with HOST_A:
        answered = services.cancel_case(case)
    assert answered.status == CaseStatus.CANCELLED and not job.cancelled
    case.refresh_from_db()
    assert case.cancel_requested_at is not None
    monkeypatch.setattr(passes, "cancel_orphan", real)
    with HOST_A:
        passes.orphan_cancel_pass(host_only=True)
    case.refresh_from_db()
    assert job.cancelled and case.cancel_requested_at is None


def test_cross_host_cancels_run_while_the_poll_lease_is_kept_alive(make_case, host_bound, monkeypatch):
    """A local cancel waits out its grace per case: a batch of them must not outlast the lease."""
    with HOST_A:
        case = launched(make_case())
    with HOST_B:
        services.cancel_case(case)
    heartbeats = []

    def cancel(self, ref):
        heartbeats.extend(t.name for t in threading.enumerate() if t.name.startswith("lease-heartbeat-"))
        FakeBackend.jobs[ref.remote_id].cancelled = True

    monkeypatch.setattr(FakeBackend, "cancel", cancel)
    with HOST_A:
        passes.poll_pass(case_ids=[case.id])
    case.refresh_from_db()
    assert case.status == CaseStatus.CANCELLED
    assert heartbeats, "the cancel ran with no lease heartbeat: a long batch would lose its leases"
