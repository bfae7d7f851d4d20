"""The calendar over the QRMI routes, with real MUNGE credentials: admission during a reservation
is the same rule as over REST (R-RES-1), and ``status()`` reads a maintenance window as paused
with its title (R-RES-2), both without any change to the unmodified client's protocol."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone

from apps.reservations.models import Reservation
from apps.reservations.services import save_reservation
from tests.qrmi.conftest import USER_UID

pytestmark = [pytest.mark.munge, pytest.mark.django_db]

BASE = "/qrmi/fresnel"


def window(pool, **fields):
    now = timezone.now()
    holders = {"users": fields.pop("users", []), "groups": fields.pop("groups", [])}
    return save_reservation(
        Reservation(pool=pool, start=now - timedelta(minutes=1), end=now + timedelta(hours=1), **fields), **holders
    )


def test_r_res_1_an_acquire_of_an_outsider_gets_only_the_shared_slots(qpu, qrmi, alice, bob):
    group = Group.objects.create(name="course")
    bob.groups.add(group)
    window(qpu, slots=3, title="Course", groups=[group])
    acquire = {"user_id": str(USER_UID), "qpu_slots": 1}
    assert qrmi(0).post(f"{BASE}/sessions", {**acquire, "scheduler_job_id": "1"}, format="json").status_code == 200
    refused = qrmi(0).post(f"{BASE}/sessions", {**acquire, "scheduler_job_id": "2"}, format="json")
    assert refused.status_code == 409 and "reserved for others" in refused.json()["detail"]
    holder = {"user_id": "1001", "qpu_slots": 3, "scheduler_job_id": "3"}
    assert qrmi(0).post(f"{BASE}/sessions", holder, format="json").status_code == 200


def test_r_res_2_status_reads_a_maintenance_window_as_paused_with_its_title(qpu, qrmi):
    window(qpu, kind="maintenance", title="Laser calibration until 11:00")
    body = qrmi(0).get(f"{BASE}/status").json()
    assert (body["status"], body["status_reason"]) == ("paused", "Laser calibration until 11:00")
    open_body = qrmi(None).get(f"{BASE}/accessible").json()
    assert (open_body["is_accessible"], open_body["status"]) == (True, "paused")
