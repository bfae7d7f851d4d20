"""GET /api/v1/allocations/: yours (staff: all) with granted, used, remaining and the period."""

import pytest

pytestmark = pytest.mark.django_db


def test_users_see_their_own_and_their_groups_allocations_staff_all(
    qpu, owner, member, outsider, staff, team, grant, api
):
    mine = grant(qpu, user=owner, device_seconds=100)
    theirs = grant(qpu, group=team, core_hours=5)

    assert [a["id"] for a in api(owner).get("/api/v1/allocations/").data["results"]] == [mine.pk]
    assert [a["id"] for a in api(member).get("/api/v1/allocations/").data["results"]] == [theirs.pk]
    assert api(outsider).get("/api/v1/allocations/").data["results"] == []
    assert {a["id"] for a in api(staff).get("/api/v1/allocations/").data["results"]} == {mine.pk, theirs.pk}
    assert api(outsider).get(f"/api/v1/allocations/{mine.pk}/").status_code == 404


def test_allocation_shows_granted_used_remaining_and_period(qpu, owner, grant, api):
    mine = grant(qpu, user=owner, device_seconds=100, core_hours=2)
    mine.used_device_seconds, mine.used_period_start = 30, mine.starts_at
    mine.save(update_fields=["used_device_seconds", "used_period_start"])  # a plain save keeps the charges'
    row = api(owner).get(f"/api/v1/allocations/{mine.pk}/").data
    assert row["granted"] == {"device_seconds": 100, "core_hours": 2}
    assert row["used"] == {"device_seconds": 30, "core_hours": 0}
    assert row["remaining"] == {"device_seconds": 70, "core_hours": 2}
    assert row["period_start"] and row["period_end"]
    assert row["user"] == "owner" and row["pool"] == "qpu"


def test_filtering_allocations_by_a_hidden_pool_answers_as_for_a_pool_that_does_not_exist(api, outsider, private_pool):
    """R-POOL-8: ``?pool=`` was checked against every pool (a hidden one: an empty list; a missing
    id: a 400), so the answer told which private pools exist."""
    client = api(outsider)
    answers = [client.get(f"/api/v1/allocations/?pool={pk}") for pk in (private_pool.pk, private_pool.pk + 1000)]
    assert answers[0].status_code == answers[1].status_code
    assert answers[0].json() == answers[1].json()
