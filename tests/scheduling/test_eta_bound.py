"""R-JOB-5: a pending job's bound (``eta_p90_seconds``, a start it beats 9 times in 10), recorded
while it waits, checked at its dispatch (``gridgate_job_eta_bound_ratio``) and corrected from
the pool's last starts; the API, the pages and ``/metrics`` say the same."""

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.scheduling import eta, passes, selectors
from apps.scheduling.models import DeviceRuntime, Job, JobLatencyBucket, JobStatus, LatencyKind
from apps.web.templatetags.web import duration
from tests.scheduling.test_strategies import submit
from tests.scheduling.test_usage_fair import pending

pytestmark = pytest.mark.django_db


@pytest.fixture
def fifo(qpu_pool, fake_device):
    """A fifo pool whose one-job device takes 60 s a job, give or take 30 s."""
    qpu_pool.strategy = "fifo"
    qpu_pool.save()
    for band in (1, -1):
        DeviceRuntime.objects.create(device=fake_device, band=band, count=50, mean=60.0, var=900.0)
    return qpu_pool


def waiting_of(pool, job):
    eta.clear_cache()
    return selectors.queue_info(pending(pool))[job.pk]


def started_jobs(pool, session, n, *, expected, bound, actual):
    """``n`` jobs dispatched long ago whose recorded expectations were ``expected`` (median)
    and ``bound`` seconds, uncorrected and shown as is, and which started ``actual`` seconds after."""
    at = timezone.now() - timedelta(hours=1)
    Job.objects.bulk_create(
        Job(
            session=session,
            pool=pool,
            user=session.user,
            payload={},
            shots=1,
            created_at=at,
            status=JobStatus.COMPLETED,
            eta_recorded_at=at,
            eta_recorded_seconds=expected,
            eta_p90_recorded_seconds=bound,
            eta_p90_factor=1.0,
            scheduled_at=at + timedelta(seconds=actual),
        )
        for _ in range(n)
    )


def test_a_pending_job_has_a_bound_beyond_its_median(fifo, open_session, owner):
    jobs = submit(open_session(fifo, owner), 3)
    passes.submit_claimed(passes.dispatch_once(fifo.pk))
    waiting = waiting_of(fifo, jobs[2])
    assert waiting.eta_seconds < waiting.eta_p90_seconds
    # Nothing recorded yet: the bound is the model's own 90th percentile.
    assert waiting.eta_p90_seconds == pytest.approx(waiting.estimate.p90)


def test_the_api_the_page_and_a_sessions_next_job_show_the_same_bound(
    fifo, open_session, owner, api, client, time_machine
):
    session = open_session(fifo, owner)
    jobs = submit(session, 2)
    passes.submit_claimed(passes.dispatch_once(fifo.pk))
    time_machine.move_to(timezone.now(), tick=False)  # the running job's rest, the same for every read
    body = api(owner).get(f"/api/v1/jobs/{jobs[1].pk}/").json()
    assert body["eta_p90_seconds"] > body["eta_seconds"] > 0
    listed = api(owner).get("/api/v1/jobs/").json()["results"]
    # The running job's rest shrinks between two reads: the same bound, to a second.
    listed_bound = {j["id"]: j["eta_p90_seconds"] for j in listed}[jobs[1].pk]
    assert listed_bound == pytest.approx(body["eta_p90_seconds"], abs=1.0)
    next_job = api(owner).get(f"/api/v1/sessions/{session.pk}/").json()["next_job"]
    assert next_job["eta_p90_seconds"] == pytest.approx(body["eta_p90_seconds"], abs=1.0)
    client.force_login(owner)
    page = client.get(f"/jobs/{jobs[1].pk}/").content.decode()
    assert f"almost surely within {duration(body['eta_p90_seconds'])}" in page
    assert f"likely in about {duration(body['eta_seconds'])}" in page


def test_the_dispatcher_records_each_waiting_jobs_expected_start_once(fifo, open_session, owner):
    jobs = submit(open_session(fifo, owner), 3)
    passes.submit_claimed(passes.dispatch_once(fifo.pk))
    assert passes.record_predictions(fifo.pk) == 2
    waiting = waiting_of(fifo, jobs[2])
    job = Job.objects.get(pk=jobs[2].pk)
    assert job.eta_recorded_at is not None
    assert job.eta_recorded_seconds == pytest.approx(waiting.estimate.median, rel=0.05)
    assert job.eta_p90_recorded_seconds == pytest.approx(waiting.estimate.p90, rel=0.05)
    assert job.eta_p90_factor == pytest.approx(1.0)
    assert job.eta_p90_level == pytest.approx(0.9)  # no correction yet: the bound is the model's 90 %
    assert passes.record_predictions(fifo.pk) == 0  # recorded once: the first promise is the one checked


def test_a_pass_dispatches_before_it_records_the_expected_starts_of_the_jobs_left_waiting(fifo, open_session, owner):
    """Building the ETA of a deep queue takes seconds (bench/dispatch.py): done after the
    dispatch, it never delays a free device's next job; a job dispatched at once has no wait to
    predict."""
    first, second = submit(open_session(fifo, owner), 2)
    assert passes.run_pool(fifo.pk)["dispatched"] == 1
    assert Job.objects.get(pk=first.pk).eta_recorded_at is None
    assert Job.objects.get(pk=second.pk).eta_recorded_at is not None


def test_a_job_dispatched_meanwhile_is_not_recorded(fifo, fake_device, open_session, owner, monkeypatch):
    jobs = submit(open_session(fifo, owner), 2)
    real = selectors.queue_info

    def dispatched_meanwhile(found):
        info = real(found)
        Job.objects.filter(pk=jobs[0].pk).update(
            status=JobStatus.RUNNING, device=fake_device, scheduled_at=timezone.now()
        )
        return info

    monkeypatch.setattr(selectors, "queue_info", dispatched_meanwhile)
    assert passes.record_predictions(fifo.pk) == 1  # the other one
    assert Job.objects.get(pk=jobs[0].pk).eta_recorded_at is None


def test_each_dispatch_of_a_recorded_job_observes_whether_its_bound_held(fifo, open_session, owner):
    jobs = submit(open_session(fifo, owner), 2)
    passes.submit_claimed(passes.dispatch_once(fifo.pk))
    passes.record_predictions(fifo.pk)
    bound = Job.objects.get(pk=jobs[1].pk).eta_p90_recorded_seconds
    Job.objects.filter(pk=jobs[0].pk).update(status=JobStatus.COMPLETED, finished_at=timezone.now())
    Job.objects.filter(pk=jobs[1].pk).update(eta_recorded_at=timezone.now() - timedelta(seconds=2 * bound))
    passes.dispatch_once(fifo.pk)
    (row,) = JobLatencyBucket.objects.filter(pool=fifo, kind=LatencyKind.ETA_BOUND)
    assert row.count == 1 and row.le > 1  # started after twice its bound: the bound did not hold
    assert row.sum == pytest.approx(2.0, rel=0.01)


def test_the_bound_corrects_itself_from_the_pools_last_starts(fifo, open_session, owner, member):
    jobs = submit(open_session(fifo, owner), 2)
    passes.submit_claimed(passes.dispatch_once(fifo.pk))
    before = waiting_of(fifo, jobs[1])
    assert before.eta_p90_seconds == pytest.approx(before.estimate.p90)
    # The pool's last starts came at three times their bound: the bound grows threefold, and
    # the median is shown as the model has it.
    started_jobs(fifo, open_session(fifo, member), eta.CORRECTION_MIN, expected=60.0, bound=120.0, actual=360.0)
    after = waiting_of(fifo, jobs[1])
    assert after.eta_p90_seconds == pytest.approx(3 * after.estimate.p90)
    assert after.eta_seconds == pytest.approx(after.estimate.median)


def test_fewer_recorded_starts_than_needed_correct_nothing(fifo, open_session, owner, member):
    jobs = submit(open_session(fifo, owner), 2)
    passes.submit_claimed(passes.dispatch_once(fifo.pk))
    started_jobs(fifo, open_session(fifo, member), eta.CORRECTION_MIN - 1, expected=60.0, bound=60.0, actual=600.0)
    waiting = waiting_of(fifo, jobs[1])
    assert waiting.eta_p90_seconds == pytest.approx(waiting.estimate.p90)


def test_the_pools_admin_page_shows_how_the_bound_held(fifo, open_session, member, staff, client):
    started_jobs(fifo, open_session(fifo, member), 40, expected=60.0, bound=120.0, actual=100.0)
    client.force_login(staff)
    page = client.get(f"/admin/resources/resourcepool/{fifo.pk}/change/").content.decode()
    assert "over the last 40 recorded starts, the bound shown held 100% of the time" in page
    assert "and 0% started by the median shown (promised 50 %)" in page  # 100 s after an expected 60
    # They held beyond the promise: the next bounds are learned at a lower quantile, and the
    # correction never narrows the model's bound.
    assert "the bound now ×1.00, the 80% quantile of the last starts" in page


def test_a_maintenance_window_or_anothers_reservation_pushes_the_eta_and_the_bound_past_it(
    fifo, fake_device, open_session, owner, member
):
    from apps.reservations.models import Reservation, WindowKind

    jobs = submit(open_session(fifo, owner), 2)
    passes.submit_claimed(passes.dispatch_once(fifo.pk))
    before = waiting_of(fifo, jobs[1])
    now = timezone.now()
    window = Reservation.objects.create(
        pool=fifo,
        device=fake_device,
        kind=WindowKind.MAINTENANCE,
        start=now + timedelta(seconds=5),
        end=now + timedelta(hours=1),
        title="recalibration",
    )
    after = waiting_of(fifo, jobs[1])
    assert after.eta_seconds > 3600 - 10 and after.eta_p90_seconds > after.eta_seconds
    assert after.eta_seconds == pytest.approx(before.eta_seconds + 3600 - 5, abs=5.0)
    window.kind, window.slots = WindowKind.RESERVATION, 1
    window.save()
    window.users.set([member])
    assert waiting_of(fifo, jobs[1]).eta_seconds > 3600 - 10
    window.users.set([owner])  # the owner's own reservation does not hold its job back
    assert waiting_of(fifo, jobs[1]).eta_seconds < 600


def test_a_window_on_one_of_two_devices_slows_the_eta_to_the_capacity_the_other_leaves(
    fifo, fake_device, open_session, owner, member
):
    """R-RES-1/2 on a pool of two one-job devices: while one is in maintenance (or reserved for
    others) the queue moves at half speed, so the part of the wait that falls in the window takes
    twice as long; a job pinned to that device waits for the window's end; a job pinned to the
    other one is not slowed."""
    from apps.reservations.models import Reservation, WindowKind
    from tests import factories

    other = factories.device(fifo, "fake2", config={"script": ["running", "completed"]})
    for band in (1, -1):
        DeviceRuntime.objects.create(device=other, band=band, count=50, mean=60.0, var=900.0)
    jobs = submit(open_session(fifo, owner), 40)
    before = waiting_of(fifo, jobs[-1]).eta_seconds
    assert 900 < before < 1800  # 39 jobs of about 60 s ahead, two at a time
    now = timezone.now()
    window = Reservation.objects.create(
        pool=fifo,
        device=other,
        kind=WindowKind.MAINTENANCE,
        start=now + timedelta(seconds=600),
        end=now + timedelta(hours=2),
        title="swap",
    )
    # 600 s at full speed, then the rest of the wait at half speed.
    slowed = 600 + 2 * (before - 600)
    assert waiting_of(fifo, jobs[-1]).eta_seconds == pytest.approx(slowed, rel=0.02)
    window.kind, window.slots = WindowKind.RESERVATION, 1
    window.save()
    window.users.set([member])
    assert waiting_of(fifo, jobs[-1]).eta_seconds == pytest.approx(slowed, rel=0.02)
    window.users.set([owner])  # the owner's own reservation leaves the owner both devices
    assert waiting_of(fifo, jobs[-1]).eta_seconds == pytest.approx(before, rel=0.02)
    # Pinned jobs: to the device in the window, it waits for the end; to the other, no matter.
    window.users.set([member])
    Job.objects.filter(pk=jobs[-1].pk).update(target_device=other)
    eta.clear_cache()
    read = selectors.queue_info(pending(fifo))  # one read: the same user's pinned and unpinned jobs
    assert read[jobs[-1].pk].eta_seconds > 2 * 3600
    assert read[jobs[-2].pk].eta_seconds < 2 * 3600
    Job.objects.filter(pk=jobs[-1].pk).update(target_device=fake_device)
    pinned = waiting_of(fifo, jobs[-1]).eta_seconds
    window.delete()
    assert pinned == pytest.approx(waiting_of(fifo, jobs[-1]).eta_seconds, rel=0.02)
