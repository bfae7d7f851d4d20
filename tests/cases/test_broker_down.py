"""A case launch while the broker is down answers 202; the tick loop submits it."""

import pytest

from apps.cases.models import Case, CaseStatus
from apps.core import ticker

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_case_launched_while_the_broker_is_down_answers_202_and_is_submitted_by_the_tick_loop(
    api, owner, local_pool, broker_down
):
    client = api(owner)
    body = {"name": "cavity", "resource_class": local_pool.classes.get().pk, "command": "solve"}
    case_id = client.post("/api/v1/cases/", body, format="json").json()["id"]
    response = client.post(f"/api/v1/cases/{case_id}/launch/", {}, format="json")
    assert response.status_code == 202, response.content
    assert Case.objects.get(pk=case_id).status == CaseStatus.PREPARED  # no worker got the message
    ticker.Ticker("test").run_due()
    assert Case.objects.get(pk=case_id).status != CaseStatus.PREPARED
