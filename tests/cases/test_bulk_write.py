"""A poll pass's write-back is one UPDATE … FROM (VALUES …) on PostgreSQL, split when a pass has
more values than a statement takes (server-side binding's 65 535 parameters)."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.cases.models import Case
from apps.cases.passes import POLL_FIELDS
from apps.core.rows import bulk_write

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]


def test_a_write_back_with_more_values_than_a_statement_takes_is_split_and_writes_every_case(make_case, monkeypatch):
    cases = [make_case(name=f"cavity-{i}") for i in range(5)]
    for i, case in enumerate(cases):
        case.cores = i + 1
    # 16 values per case (15 fields and the key): 2 cases per statement under a limit of 40.
    monkeypatch.setattr(connection.features, "max_query_params", 40)
    with CaptureQueriesContext(connection) as queries:
        bulk_write(cases, POLL_FIELDS)
    updates = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("UPDATE")]
    assert len(updates) == 3
    assert sorted(Case.objects.values_list("cores", flat=True)) == [1, 2, 3, 4, 5]


def test_a_write_back_within_the_limit_is_one_statement(make_case):
    cases = [make_case(name=f"cavity-{i}") for i in range(3)]
    with CaptureQueriesContext(connection) as queries:
        bulk_write(cases, POLL_FIELDS)
    assert sum(q["sql"].startswith("UPDATE") for q in queries.captured_queries) == 1
