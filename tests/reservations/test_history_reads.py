"""A user's GET /reservations/ reads the windows they hold, not the whole calendar's past: other
people's windows, years of them, cost it nothing (SPEC §9). Measured on PostgreSQL's plans."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.reservations.models import Reservation
from tests import factories
from tests.plans import HISTORY_ROWS, rows_read

pytestmark = [pytest.mark.django_db, pytest.mark.postgres]

URL = "/api/v1/reservations/"


def test_a_users_list_reads_their_windows_not_everyone_elses(api, owner, member):
    pool = factories.pool("qpu", slots_total=10)
    now = timezone.now()
    others = Reservation.objects.bulk_create(
        Reservation(
            pool=pool,
            start=now - timedelta(days=30, hours=2 + i),
            end=now - timedelta(days=30, hours=1 + i),
            slots=1,
            title=f"past {i}",
        )
        for i in range(HISTORY_ROWS)
    )
    Reservation.users.through.objects.bulk_create(
        Reservation.users.through(reservation=window, user=member) for window in others
    )
    mine = Reservation.objects.create(pool=pool, start=now, end=now + timedelta(hours=1), slots=1, title="mine")
    mine.users.add(owner)
    ours = Reservation.objects.create(pool=pool, start=now, end=now + timedelta(hours=2), slots=1, title="ours")
    team = Group.objects.create(name="team")
    team.user_set.add(owner)
    ours.groups.add(team)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")

    client = api(owner)
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(URL)
    assert response.status_code == 200
    assert [window["title"] for window in response.json()["results"]] == ["mine", "ours"]
    read = {
        query["sql"][:200]: rows
        for query in ctx.captured_queries
        if query["sql"].startswith("SELECT") and (rows := rows_read(query["sql"], "reservations_reservation")) > 50
    }
    assert read == {}
