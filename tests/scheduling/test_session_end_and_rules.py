"""Rules at the edge of sessions and scheduling that a one-line change used to break silently:
the idempotent 409 on a class mismatch, the GPU quota, the max_lifetime expiry of a busy
session, and who may open a session for whom."""

from datetime import timedelta

import pytest
import time_machine
from django.contrib.auth.models import Permission
from django.utils import timezone

from apps.resources.models import ResourceClass, ResourcePool
from apps.scheduling import passes, services
from apps.scheduling.models import Device, JobStatus
from apps.sessions import services as session_services
from apps.sessions.models import Session

pytestmark = pytest.mark.django_db


def test_same_external_id_same_slots_but_another_class_is_409(api, owner):
    pool = ResourcePool.objects.create(name="lab", kind="local", public=True)
    small = ResourceClass.objects.create(pool=pool, name="small", cpu=1, memory=1, default=True)
    big = ResourceClass.objects.create(pool=pool, name="big", cpu=2, memory=2)
    client = api(owner)
    first = client.post(
        "/api/v1/sessions/", {"resource_class": small.pk, "slots": 1, "external_id": "77"}, format="json"
    )
    assert first.status_code == 201
    second = client.post(
        "/api/v1/sessions/", {"resource_class": big.pk, "slots": 1, "external_id": "77"}, format="json"
    )
    assert second.status_code == 409 and second.json()["session"] == first.json()["id"]
    assert Session.objects.count() == 1


def test_gpu_quota_refuses_a_session_whose_gpus_do_not_fit(owner, member):
    pool = ResourcePool.objects.create(
        name="gpu", kind="local", public=True, quota_cpu=64, quota_memory=64, quota_gpu=1
    )
    klass = ResourceClass.objects.create(pool=pool, name="one-gpu", cpu=1, memory=1, gpu=1, default=True)
    session_services.admit(user=owner, resource_class=klass)
    with pytest.raises(session_services.CapacityExceeded) as refused:
        session_services.admit(user=member, resource_class=klass)
    assert any(entry.startswith("gpu") for entry in refused.value.extra["quota_exceeded"])


def test_class_with_more_gpus_than_the_quota_is_refused():
    from django.core.exceptions import ValidationError

    pool = ResourcePool.objects.create(name="gpu", kind="local", public=True, quota_cpu=8, quota_memory=8, quota_gpu=1)
    with pytest.raises(ValidationError) as refused:
        ResourceClass(pool=pool, name="two-gpus", cpu=1, memory=1, gpu=2, default=True).full_clean()
    assert "gpu" in refused.value.message_dict


def test_max_lifetime_expiry_cancels_the_sessions_jobs(qpu_pool, fake_device, open_session, owner):
    """A busy session is not idle-expired, but its absolute lifetime ends it and its work."""
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        session = open_session(qpu_pool, owner)
        running, pending = (
            services.submit_job(user=owner, session_id=session.pk, payload={}, shots=1) for _ in range(2)
        )
        passes.run_pool(qpu_pool.pk)
    with time_machine.travel(start + timedelta(seconds=qpu_pool.max_lifetime + 1), tick=False):
        session_services.expire_due_sessions()
    session.refresh_from_db()
    running.refresh_from_db(), pending.refresh_from_db()
    assert session.revocation_reason == "max_lifetime"
    assert pending.status == JobStatus.CANCELLED
    assert running.status == JobStatus.RUNNING and running.cancel_requested_at is not None


def test_pending_jobs_counts_every_job_the_device_could_take(api, qpu_pool, open_session, owner, staff):
    """R-JOB-4: untargeted jobs count for every online device of the pool; jobs that name another
    device do not."""
    one = Device.objects.create(pool=qpu_pool, name="one", driver="fake", online=False)
    two = Device.objects.create(pool=qpu_pool, name="two", driver="fake", online=False)
    session = open_session(qpu_pool, owner)
    for target in (None, None, one, two, two):
        services.submit_job(user=owner, session_id=session.pk, payload={}, shots=1, device_id=target and target.pk)
    rows = {d["name"]: d for d in api(staff).get("/api/v1/devices/").json()["results"]}
    assert (rows["one"]["pending_jobs"], rows["two"]["pending_jobs"]) == (3, 4)
    assert rows["one"]["running_jobs"] == rows["two"]["running_jobs"] == 0


def test_service_principal_opens_a_session_on_a_class_it_cannot_see_itself(api, member, private_pool):
    """docs/architecture.md "Who may do what": a principal (act_on_behalf) opens sessions for
    granted users; it need not be granted the pool itself."""
    from django.contrib.auth import get_user_model

    principal = get_user_model().objects.create_user("slurmctld", password="pw")
    principal.user_permissions.add(Permission.objects.get(codename="act_on_behalf"))
    principal = get_user_model().objects.get(pk=principal.pk)
    klass = private_pool.classes.get()
    response = api(principal).post(
        "/api/v1/sessions/", {"resource_class": klass.pk, "slots": 1, "user": "member"}, format="json"
    )
    assert response.status_code == 201, response.content
    assert Session.objects.get().user == member


def test_service_principal_cannot_open_a_hidden_class_for_a_user_without_access(api, outsider, private_pool):
    from django.contrib.auth import get_user_model

    principal = get_user_model().objects.create_user("slurmctld", password="pw")
    principal.user_permissions.add(Permission.objects.get(codename="act_on_behalf"))
    principal = get_user_model().objects.get(pk=principal.pk)
    response = api(principal).post(
        "/api/v1/sessions/",
        {"resource_class": private_pool.classes.get().pk, "slots": 1, "user": "outsider"},
        format="json",
    )
    assert response.status_code == 400  # neither may use it: the class is not revealed
    assert not Session.objects.exists()


@pytest.mark.parametrize("strategy", ["fifo", "weighted_fair"])
def test_a_job_whose_session_ended_unannounced_is_never_dispatched(
    qpu_pool, fake_device, open_session, owner, strategy
):
    """The revocation commits before its announcement cancels the session's jobs: should the
    process die in between, the dispatcher still never starts a job of an ended session (the fair
    strategies pick among active sessions only; FIFO's candidate is cancelled under its lock)."""
    from apps.scheduling.models import Job
    from apps.sessions import statements as session_statements

    ResourcePool.objects.filter(pk=qpu_pool.pk).update(strategy=strategy)
    session = open_session(qpu_pool, owner)
    job = services.submit_job(user=owner, session_id=session.pk, payload={}, shots=1)
    session_statements.end_sessions([session.pk], "released", timezone.now())  # no announcement
    assert passes.dispatch_once(qpu_pool.pk) is None
    job = Job.objects.get(pk=job.pk)
    assert job.device_id is None and job.status == ("cancelled" if strategy == "fifo" else "pending")


def test_the_repair_cancels_what_ended_sessions_left_unfinished(qpu_pool, fake_device, open_session, owner, settings):
    from django.utils import timezone

    from apps.scheduling.models import Job
    from apps.sessions import statements as session_statements

    settings.GRIDGATE_TASKS_EAGER = False
    session = open_session(qpu_pool, owner)
    running, pending = (services.submit_job(user=owner, session_id=session.pk, payload={}, shots=1) for _ in range(2))
    passes.submit_claimed(passes.dispatch_once(qpu_pool.pk))
    session_statements.end_sessions([session.pk], "released", timezone.now())  # no announcement
    assert services.cancel_jobs_of_ended_sessions() == 1
    running, pending = Job.objects.get(pk=running.pk), Job.objects.get(pk=pending.pk)
    assert pending.status == "cancelled" and running.cancel_requested_at is not None
    assert services.cancel_jobs_of_ended_sessions() == 0  # the running one's cancel is with its device


@pytest.mark.parametrize("strategy", ["fifo", "weighted_fair", "usage_fair"])
def test_a_job_of_a_session_past_its_lifetime_is_never_dispatched_before_the_sweep(
    qpu_pool, fake_device, open_session, owner, member, strategy
):
    """R-SESS-3/R-SESS-7: a session whose ``expires_at`` passed accepts no job and its unfinished
    jobs are cancelled. Until the expiry sweep (once a minute) revoked it, the dispatcher still
    started its pending jobs on the device, after the session's end; another user's job waits
    for nothing."""
    from apps.scheduling.models import Job

    ResourcePool.objects.filter(pk=qpu_pool.pk).update(strategy=strategy, max_lifetime=3600)
    fake_device.max_concurrent_jobs = 1
    fake_device.save()
    start = timezone.now()
    with time_machine.travel(start, tick=False) as clock:
        expiring = open_session(qpu_pool, owner)
        busy = services.submit_job(user=owner, session_id=expiring.pk, payload={}, shots=1)
        passes.submit_claimed(passes.dispatch_once(qpu_pool.pk))  # the device is taken
        late = services.submit_job(user=owner, session_id=expiring.pk, payload={}, shots=1)
        clock.shift(1800)
        other = open_session(qpu_pool, member)
        theirs = services.submit_job(user=member, session_id=other.pk, payload={}, shots=1)
        clock.shift(1801)  # past the first session's lifetime; no sweep has run
        Job.objects.filter(pk=busy.pk).update(status=JobStatus.COMPLETED, finished_at=timezone.now())
        dispatched = passes.dispatch_once(qpu_pool.pk)
        assert dispatched is not None and dispatched.pk == theirs.pk
        assert Job.objects.get(pk=late.pk).device_id is None
        assert passes.dispatch_once(qpu_pool.pk) is None
        assert Job.objects.get(pk=late.pk).status in (JobStatus.PENDING, JobStatus.CANCELLED)
