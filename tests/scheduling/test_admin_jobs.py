"""The admin's job list tells operators why a job waits, in constant queries."""

import json
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from apps.scheduling.services import submit_job

pytestmark = pytest.mark.django_db

EXAMPLE = json.loads((Path(settings.BASE_DIR) / "examples" / "bell-like-analog.json").read_text())


def _changelist(admin_client) -> tuple[str, int]:
    with CaptureQueriesContext(connection) as ctx:
        response = admin_client.get(reverse("admin:scheduling_job_changelist"))
    assert response.status_code == 200
    return response.content.decode(), len(ctx.captured_queries)


def test_admin_job_list_shows_why_a_pending_job_waits(admin_client, owner, qpu_pool, parked_device, open_session):
    session = open_session(qpu_pool, owner)
    submit_job(user=owner, session_id=session.pk, payload=EXAMPLE["payload"], shots=10)
    page, _ = _changelist(admin_client)
    assert "Waiting because" in page
    assert 'class="field-waiting_because">no device online (#1)<' in page  # its one device is offline


def test_admin_job_list_queries_do_not_grow_with_jobs(
    admin_client, owner, member, qpu_pool, parked_device, open_session
):
    session = open_session(qpu_pool, owner)
    submit_job(user=owner, session_id=session.pk, payload=EXAMPLE["payload"], shots=10)
    _, few = _changelist(admin_client)
    other = open_session(qpu_pool, member)
    for target in (session, other) * 5:
        submit_job(user=target.user, session_id=target.pk, payload=EXAMPLE["payload"], shots=10)
    _, many = _changelist(admin_client)
    assert many <= few + 1  # +1: a second session's row in the ranking query at most


def test_driver_run_admin_shows_which_worker_ran_an_emulation_and_how_often(admin_client, qpu_pool):
    """An operator sees a re-run emulation's attempts and its last worker."""
    from apps.scheduling.models import Device, DriverRun

    device = Device.objects.create(pool=qpu_pool, name="emu", driver="emulator")
    DriverRun.objects.create(
        remote_id="emu-7", device=device, payload={}, shots=1, status="running", attempts=2, worker="host-b:4242"
    )
    page = admin_client.get(reverse("admin:scheduling_driverrun_changelist") + "?q=host-b").content.decode()
    assert "emu-7" in page and "host-b:4242" in page
    assert admin_client.get(reverse("admin:scheduling_driverrun_change", args=["emu-7"])).status_code == 200
    assert admin_client.get(reverse("admin:scheduling_driverrun_add")).status_code == 403
