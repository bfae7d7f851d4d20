"""R-RES-1/2 on the dispatcher, the pending codes and the pool's status: on a reserved device the
holders' jobs go first during the window (others wait with ``reserved``); a maintenance window
pauses its pool or device (``maintenance``; QRMI ``status()`` paused with the window's title)
and ends by itself. Nothing is written when a window starts or ends."""

import pytest
import time_machine
from rest_framework.test import APIClient

from apps.reservations.models import WindowKind
from apps.scheduling import passes, selectors, services
from apps.scheduling.models import Device, Job, JobStatus
from apps.sessions import services as sessions
from tests.reservations.conftest import ELEVEN, TEN, at

pytestmark = pytest.mark.django_db

LONG = {"script": ["running"] * 50}


def open_session(user, pool):
    return sessions.admit(user=user, resource_class=pool.classes.get()).session


def submit(session):
    return services.submit_job(user=session.user, session_id=session.pk, payload={}, shots=1)


@pytest.fixture
def device(qpu):
    return Device.objects.create(pool=qpu, name="qpu1", driver="fake", config=LONG)


def code_of(job):
    job.refresh_from_db()
    return selectors.queue_info([job])[job.pk].code


def outsider_then_holder(qpu, alice, outsiders):
    """Before 10:00, an outsider's job, then a minute later alice's (a holder once a window is
    reserved for group_a): (theirs, mine)."""
    with time_machine.travel(at(9, 50), tick=False) as clock:
        theirs = submit(open_session(outsiders[0], qpu))
        clock.shift(60)
        mine = submit(open_session(alice, qpu))
    return theirs, mine


def test_r_res_1_without_a_window_the_older_sessions_job_goes_first(qpu, device, alice, outsiders):
    theirs, _mine = outsider_then_holder(qpu, alice, outsiders)
    with time_machine.travel(at(9, 51), tick=False):
        assert passes.dispatch_once(qpu.pk).pk == theirs.pk


def test_r_res_1_a_holders_job_starts_at_the_first_dispatch_of_the_window_and_others_wait_reserved(
    qpu, device, alice, group_a, outsiders, reserve
):
    reserve(qpu, groups=[group_a], device=device)
    theirs, mine = outsider_then_holder(qpu, alice, outsiders)
    with time_machine.travel(at(10, 0, 1), tick=False):
        dispatched = passes.dispatch_once(qpu.pk)
        assert dispatched.pk == mine.pk and dispatched.device_id == device.pk
        assert code_of(theirs) == "reserved"
        assert selectors.REASONS["reserved"] == "reserved for others now"


def test_r_res_1_others_use_a_reserved_device_while_its_holders_have_nothing_to_run(
    qpu, device, alice, group_a, outsiders, reserve
):
    reserve(qpu, groups=[group_a])
    with time_machine.travel(at(10, 5), tick=False):
        open_session(alice, qpu)  # a holder with nothing to run
        theirs = submit(open_session(outsiders[0], qpu))
        assert code_of(theirs) != "reserved"
        assert passes.dispatch_once(qpu.pk).pk == theirs.pk


def test_r_res_1_on_a_pool_with_two_devices_only_the_reserved_one_serves_holders_first(
    qpu, device, alice, group_a, outsiders, reserve
):
    other = Device.objects.create(pool=qpu, name="qpu2", driver="fake", config=LONG)
    reserve(qpu, groups=[group_a], device=other)
    theirs, mine = outsider_then_holder(qpu, alice, outsiders)
    with time_machine.travel(at(10, 1), tick=False):
        first, second = passes.dispatch_once(qpu.pk), passes.dispatch_once(qpu.pk)
    assert (first.pk, first.device_id) == (mine.pk, other.pk)
    assert (second.pk, second.device_id) == (theirs.pk, device.pk)


def test_r_res_1_a_holder_whose_project_has_no_device_time_left_waits_on_the_reserved_device(
    qpu, device, alice, group_a, outsiders, reserve
):
    """R-ALLOC-1 holds inside a reservation: alice's job waits (``allocation_exhausted``) and the
    reserved device takes the outsider's, as when its holders have nothing to run."""
    from apps.allocations.models import Allocation

    Allocation.objects.create(name="spent", pool=qpu, user=alice, device_seconds=0, starts_at=at(9), ends_at=at(12))
    reserve(qpu, groups=[group_a], device=device)
    theirs, mine = outsider_then_holder(qpu, alice, outsiders)
    with time_machine.travel(at(10, 0, 1), tick=False):
        assert passes.dispatch_once(qpu.pk).pk == theirs.pk
        assert code_of(mine) == "allocation_exhausted"


def accessible(pool) -> dict:
    return APIClient().get(f"/qrmi/{pool.name}/accessible").json()


@pytest.mark.parametrize("on_device", [False, True], ids=["pool", "its only device"])
def test_r_res_2_a_maintenance_window_pauses_then_resumes_by_itself(qpu, device, alice, reserve, on_device):
    window = reserve(
        qpu,
        kind=WindowKind.MAINTENANCE,
        slots=0,
        title="Calibration of the laser",
        device=device if on_device else None,
    )
    with time_machine.travel(at(9, 59), tick=False):
        job = submit(open_session(alice, qpu))
        assert accessible(qpu)["status"] == "online"
    with time_machine.travel(at(10, 30), tick=False):
        assert passes.dispatch_once(qpu.pk) is None
        assert code_of(job) == "maintenance"
        status = accessible(qpu)
        assert (status["status"], status["status_reason"]) == ("paused", "Calibration of the laser")
        assert status["is_accessible"] is True  # sessions and jobs are still taken
        assert selectors.pool_status(qpu).status == "paused"
        # Nothing was written: the device and the pool are as they were.
        assert Device.objects.get(pk=device.pk).paused_reason == ""
    with time_machine.travel(ELEVEN, tick=False):
        assert accessible(qpu)["status"] == "online"
        dispatched = passes.dispatch_once(qpu.pk)
        assert dispatched.pk == job.pk
        assert Job.objects.get(pk=job.pk).status == JobStatus.RUNNING
    assert window.start == TEN


def test_r_res_2_maintenance_of_one_device_leaves_the_others_working(qpu, device, alice, reserve):
    other = Device.objects.create(pool=qpu, name="qpu2", driver="fake", config=LONG)
    reserve(qpu, kind=WindowKind.MAINTENANCE, slots=0, title="Cooling", device=device)
    with time_machine.travel(at(10, 30), tick=False):
        submit(open_session(alice, qpu))
        assert passes.dispatch_once(qpu.pk).device_id == other.pk
        assert accessible(qpu)["status"] == "online"


def test_r_res_2_a_cancelled_maintenance_window_pauses_nothing(qpu, device, alice, reserve):
    from apps.reservations.services import cancel_reservation

    cancel_reservation(reserve(qpu, kind=WindowKind.MAINTENANCE, slots=0, title="Cooling"))
    with time_machine.travel(at(10, 30), tick=False):
        submit(open_session(alice, qpu))
        assert passes.dispatch_once(qpu.pk) is not None
