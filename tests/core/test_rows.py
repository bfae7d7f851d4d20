"""``apps.core.rows.bulk_write``: many rows' fields written back at once, on the database the
tests run on (SQLite's ``bulk_update``, PostgreSQL's ``UPDATE … FROM (VALUES …)``), with
decimals, JSON and an integer key; the UUID-keyed case of the poll pass is in
tests/cases/test_bulk_write.py."""

from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.core.rows import bulk_write
from apps.resources.models import ResourceClass, ResourcePool

pytestmark = pytest.mark.django_db


@pytest.fixture
def classes(local_pool):
    ResourceClass.objects.filter(pool=local_pool).delete()
    made = [
        ResourceClass.objects.create(pool=local_pool, name=f"c{i}", cpu=1, memory=1, default=i == 0) for i in range(5)
    ]
    return made


def test_bulk_write_writes_the_named_fields_of_every_row(classes):
    for i, resource_class in enumerate(classes):
        resource_class.cpu = Decimal("0.5") * (i + 1)
        resource_class.remote = {"partition": f"p{i}"}
    bulk_write(classes, ["cpu", "remote"])
    rows = list(ResourceClass.objects.filter(pk__in=[c.pk for c in classes]).order_by("name"))
    assert [row.cpu for row in rows] == [Decimal("0.5") * (i + 1) for i in range(5)]
    assert [row.remote for row in rows] == [{"partition": f"p{i}"} for i in range(5)]


def test_bulk_write_leaves_the_fields_it_is_not_given(classes):
    for resource_class in classes:
        resource_class.memory, resource_class.name = 7, resource_class.name + "-renamed"
    bulk_write(classes, ["memory"])
    assert set(ResourceClass.objects.filter(pk__in=[c.pk for c in classes]).values_list("memory", flat=True)) == {7}
    assert not ResourceClass.objects.filter(name__endswith="-renamed").exists()


def test_bulk_write_of_nothing_sends_nothing(db):
    with CaptureQueriesContext(connection) as queries:
        bulk_write([], ["name"])
    assert not queries.captured_queries


def test_bulk_write_writes_a_null_and_touches_no_other_row(classes, firecrest_pool):
    pool = ResourcePool.objects.get(pk=classes[0].pool_id)
    pool.quota_memory = None
    bulk_write([pool], ["quota_memory"])
    assert ResourcePool.objects.get(pk=pool.pk).quota_memory is None
    assert ResourcePool.objects.get(pk=firecrest_pool.pk).remote == firecrest_pool.remote


@pytest.mark.postgres
def test_bulk_write_on_postgresql_is_one_update_per_statements_worth_of_parameters(classes, monkeypatch):
    for i, resource_class in enumerate(classes):
        resource_class.memory = 10 + i
    # 2 values per row (the field and the key): 2 rows per statement under a limit of 4.
    monkeypatch.setattr(connection.features, "max_query_params", 4)
    with CaptureQueriesContext(connection) as queries:
        bulk_write(classes, ["memory"])
    updates = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("UPDATE")]
    assert len(updates) == 3
    assert all("FROM (VALUES" in sql for sql in updates)
    assert sorted(ResourceClass.objects.filter(pool=classes[0].pool).values_list("memory", flat=True)) == [
        10,
        11,
        12,
        13,
        14,
    ]
