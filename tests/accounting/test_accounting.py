"""GET /api/v1/accounting/: usage per user and pool over a period (staff only)."""

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from apps.resources.models import ResourceClass, ResourcePool
from apps.scheduling.models import Job, JobStatus
from apps.sessions import services

pytestmark = pytest.mark.django_db


@pytest.fixture
def pool(db):
    pool = ResourcePool.objects.create(name="qpu", public=True, slots_total=10)
    ResourceClass.objects.create(pool=pool, name="c", cpu=1, memory=1, default=True)
    return pool


def test_usage_per_user_and_pool(api, staff, owner, member, pool):
    start = timezone.now().replace(microsecond=0) - timedelta(hours=10)
    with time_machine.travel(start, tick=False):
        session = services.admit(user=owner, resource_class=pool.classes.get(), slots=2).session
    with time_machine.travel(start + timedelta(hours=3), tick=False):
        services.release(user=session.user, session_id=session.pk)
    for i, (status, wait, runtime) in enumerate(
        [(JobStatus.COMPLETED, 1, 4.0), (JobStatus.COMPLETED, 3, 6.0), (JobStatus.FAILED, 5, None)]
    ):
        created = start + timedelta(minutes=i)
        Job.objects.create(
            session=session,
            pool=pool,
            user=owner,
            payload={},
            shots=1,
            status=status,
            created_at=created,
            scheduled_at=created + timedelta(seconds=wait),
            runtime_seconds=runtime,
        )
    since = (start - timedelta(hours=1)).isoformat().replace("+00:00", "Z")
    body = api(staff).get(f"/api/v1/accounting/?since={since}").json()
    (row,) = body["rows"]
    assert (row["user"], row["pool"], row["sessions"]) == ("owner", "qpu", 1)
    assert row["session_slot_hours"] == pytest.approx(6.0)  # 2 slots × 3 h
    assert row["jobs"] == {"completed": 2, "failed": 1}
    assert row["device_seconds"] == 10.0
    assert row["wait_mean_seconds"] == pytest.approx(3.0) and row["wait_p95_seconds"] == 5.0
    assert api(staff).get(f"/api/v1/accounting/?since={since}&user=member").json()["rows"] == []


def test_slot_hours_count_only_the_part_inside_the_period(api, staff, owner, pool):
    start = timezone.now().replace(microsecond=0) - timedelta(hours=5)
    with time_machine.travel(start, tick=False):
        services.admit(user=owner, resource_class=pool.classes.get(), slots=1)  # still active
    since = (start + timedelta(hours=4)).isoformat().replace("+00:00", "Z")
    (row,) = api(staff).get(f"/api/v1/accounting/?since={since}").json()["rows"]
    assert row["session_slot_hours"] == pytest.approx(1.0, abs=0.01)


def test_accounting_is_staff_only_and_validates_its_parameters(api, owner, staff):
    assert api(owner).get("/api/v1/accounting/").status_code == 403
    assert api(staff).get("/api/v1/accounting/?since=yesterday").status_code == 400
    assert api(staff).get("/api/v1/accounting/?since=2026-13-45T00:00:00").status_code == 400
    assert api(staff).get("/api/v1/accounting/?since=2020-01-01").status_code == 200  # a date, naive: UTC
    assert api(staff).get("/api/v1/accounting/?pool=x").status_code == 400
    assert (
        api(staff).get("/api/v1/accounting/?since=2026-01-02T00:00:00Z&until=2026-01-01T00:00:00Z").status_code == 400
    )
    assert api(staff).get("/api/v1/accounting/").status_code == 200


@pytest.mark.parametrize(
    "query",
    [
        {"until": "0001-01-01"},
        {"since": "0001-01-01"},
        {"until": "9999-12-31T23:59:59"},
        {"since": "0001-01-01T00:00:00+05:00"},
        {"until": "9999-12-31T23:59:59-05:00"},
    ],
)
def test_accounting_dates_outside_the_supported_range_are_400(api, staff, query):
    response = api(staff).get("/api/v1/accounting/", query)
    assert response.status_code == 400, response.content
    assert set(response.json()) <= {"since", "until"}


def test_a_pool_id_in_other_digits_is_a_400_not_a_500(api, staff):
    # '²'.isdigit() is True, and int('²') raises: the check let it through to a 500.
    response = api(staff).get("/api/v1/accounting/?pool=%C2%B2")
    assert response.status_code == 400
    assert "pool" in response.json()
