"""R-ALLOC-1 under concurrency (PostgreSQL, threads): an operator editing a grant while a worker
charges a job to it loses no charge (the admin's save never writes back the spending it read)."""

import threading
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.db.models import Sum
from django.test import Client
from django.utils import timezone

from apps.allocations.admin import AllocationAdmin
from apps.allocations.models import Allocation, Charge
from apps.scheduling import passes, services
from apps.scheduling.models import Job, JobStatus
from tests import factories
from tests.allocations.conftest import DEVICE_TIME

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

WAIT = 30


def test_raising_a_grant_in_the_admin_while_a_job_is_charged_loses_no_charge(monkeypatch, qpu, owner, open_session):
    """The operator's change form reads the allocation (spent: 0), a job ends and is charged
    (spent: 120 s), then the form is saved: with a full save the spending goes back to 0 and the
    project may spend its charge again; the ledger and the allocation disagree."""
    start = timezone.now() - timedelta(hours=1)
    allocation = Allocation.objects.create(
        name="project", pool=qpu, user=owner, device_seconds=1000, starts_at=start, ends_at=start + timedelta(days=30)
    )
    session = open_session(qpu, owner)
    assert session.allocation_id == allocation.pk
    job = services.submit_job(user=owner, session_id=session.pk, payload={}, shots=1)
    passes.run_pool(qpu.pk)  # dispatched: running on the fake device, which completes it at the next poll
    assert Job.objects.get(pk=job.pk).status == JobStatus.RUNNING

    operator = factories.user("operator", is_staff=True)
    operator.user_permissions.set(Permission.objects.filter(codename__in=["change_allocation", "view_allocation"]))
    loaded, charged = threading.Event(), threading.Event()
    original = AllocationAdmin.save_model

    def save_model(self, request, obj, form, change):
        loaded.set()  # the form was read and validated: the object is as it was then
        charged.wait(WAIT)
        return original(self, request, obj, form, change)

    monkeypatch.setattr(AllocationAdmin, "save_model", save_model)

    def edit():
        try:
            client = Client()
            client.force_login(operator)
            local = timezone.localtime(start)
            end = timezone.localtime(start + timedelta(days=30))
            return client.post(
                f"/admin/allocations/allocation/{allocation.pk}/change/",
                {
                    "name": "project",
                    "pool": qpu.pk,
                    "user": owner.pk,
                    "group": "",
                    "device_seconds": "2000",  # raised
                    "core_hours": "",
                    "period": "fixed",
                    "starts_at_0": local.strftime("%Y-%m-%d"),
                    "starts_at_1": local.strftime("%H:%M:%S"),
                    "ends_at_0": end.strftime("%Y-%m-%d"),
                    "ends_at_1": end.strftime("%H:%M:%S"),
                    "window_days": "",
                },
            ).status_code
        finally:
            connection.close()

    def finish():
        try:
            assert loaded.wait(WAIT)
            Job.objects.filter(pk=job.pk).update(next_poll_at=None)
            passes.poll_running(qpu.pk)  # the job completes and is charged DEVICE_TIME
        finally:
            charged.set()
            connection.close()

    results = []
    threads = [threading.Thread(target=lambda: results.append(edit())), threading.Thread(target=finish)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert results == [302]
    assert Job.objects.get(pk=job.pk).status == JobStatus.COMPLETED
    allocation.refresh_from_db()
    assert allocation.device_seconds == 2000  # the operator's change is kept
    ledger = Charge.objects.filter(allocation=allocation).aggregate(s=Sum("device_seconds"))["s"]
    assert ledger == DEVICE_TIME
    assert allocation.used_device_seconds == ledger  # and so is the charge
