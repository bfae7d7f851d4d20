"""The utilization selector behind the operators' charts: slots held, device time held, queue wait
p50/p95 and jobs and cases per state, per pool and per bucket, from known data with exact answers,
in a constant number of queries."""

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from apps.accounting import selectors
from apps.accounting.selectors import MAX_PERIOD, buckets, percentile, utilization
from apps.resources.models import ResourcePool
from apps.scheduling.models import Device, JobStatus
from tests.accounting.conftest import DAY, T0, H, M, S, make_job, make_session

pytestmark = pytest.mark.django_db


def _pools(result):
    return {pool.name: pool for pool in result.pools}


def test_buckets_are_round_and_clipped_to_the_period():
    step, parts = buckets(*DAY)
    assert step == H and len(parts) == 24 and parts[0].start == T0 and parts[-1].end == T0 + 24 * H
    step, parts = buckets(T0 + 30 * M, T0 + 30 * M + timedelta(days=7))
    assert step == 3 * H and len(parts) == 57
    assert (parts[0].start, parts[0].end, parts[1].start) == (T0 + 30 * M, T0 + 3 * H, T0 + 3 * H)
    assert parts[-1].end == T0 + 30 * M + timedelta(days=7) and parts[-1].seconds == 30 * 60
    step, parts = buckets(T0, T0 + MAX_PERIOD)
    assert step == timedelta(days=7) and len(parts) <= selectors.MAX_BUCKETS
    # weeks run Monday to Sunday (from the epoch, 1970-01-01, they ran from Thursday)
    assert {part.start.weekday() for part in parts[1:]} == {0} and parts[1].start.hour == 0
    for since, until in [(T0, T0), (T0, T0 - H), (T0, T0 + MAX_PERIOD + S)]:
        with pytest.raises(ValueError):
            buckets(since, until)


def test_percentile_is_the_nearest_rank():
    values = [float(v) for v in range(20, 0, -1)]
    assert (percentile(values, 0.5), percentile(values, 0.95), percentile(values, 1.0)) == (10, 19, 20)
    assert percentile([7.0], 0.95) == 7.0 and percentile([], 0.5) is None


def test_slots_held_are_averaged_over_each_bucket(history):
    qpu = _pools(utilization(*DAY, now=T0 + 24 * H))["qpu"]
    assert qpu.slots[:3] == pytest.approx([1.25, 5.0, 3.0])
    assert qpu.slots[3:] == pytest.approx([3.0] * 21)
    assert qpu.slots_total == 10


def test_device_time_held_is_clipped_to_buckets_and_counts_running_jobs_until_now(history):
    qpu = _pools(utilization(*DAY, now=T0 + 24 * H))["qpu"]
    expected = [0.0] * 24
    expected[0], expected[2], expected[4], expected[5], expected[23] = 600, 1200, 600, 600, 1800
    assert qpu.busy_seconds == pytest.approx(expected)
    assert qpu.capacity == 2
    assert [(d.name, d.busy_seconds) for d in qpu.devices] == [("d1", 3000.0), ("d2", 1800.0)]
    share = qpu.busy_share(utilization(*DAY, now=T0 + 24 * H).elapsed)
    assert share[2] == pytest.approx(1200 / 7200) and share[1] == 0


def test_the_current_bucket_is_averaged_over_its_elapsed_part_and_later_ones_are_empty(history):
    """A period that includes today, asked at 02:30: hour 2 is half over, hours 3-23 have not begun."""
    result = utilization(*DAY, now=T0 + 2 * H + 30 * M)
    qpu = _pools(result)["qpu"]
    assert result.elapsed[:3] == [3600.0, 3600.0, 1800.0] and result.elapsed[3:] == [0.0] * 21
    # 02:00-02:30: the 3-slot session alone, held the whole elapsed half hour (not 1.5 over the hour).
    assert qpu.slots[:3] == pytest.approx([1.25, 5.0, 3.0])
    assert qpu.slots[3:] == [None] * 21
    # Twenty one-minute jobs in hour 2 on 2 devices: 1200 s of 2 × 1800 s elapsed, a third (not a sixth).
    share = qpu.busy_share(result.elapsed)
    assert share[2] == pytest.approx(1 / 3) and share[0] == pytest.approx(600 / 7200)
    assert share[3:] == [None] * 21


def test_queue_wait_p50_and_p95_per_bucket_and_over_the_period(history):
    qpu = _pools(utilization(*DAY, now=T0 + 24 * H))["qpu"]
    assert (qpu.wait_p50[2], qpu.wait_p95[2]) == (10.0, 19.0)
    assert (qpu.wait_p50[4], qpu.wait_p95[4]) == (5.0, 5.0)
    assert (qpu.wait_p50[23], qpu.wait_p95[23]) == (1800.0, 1800.0)
    assert qpu.wait_p50[0] is None and qpu.wait_p95[1] is None  # nothing dispatched then
    # 1..20, 5 and 1800: the 11th and the 21st of 22.
    assert (qpu.dispatched, qpu.wait_p50_all, qpu.wait_p95_all) == (22, 10.0, 20.0)


def test_the_python_ranking_used_on_sqlite_gives_the_same_waits(history, monkeypatch):
    """The two code paths (``percentile_disc`` on PostgreSQL, Python on SQLite) agree."""
    in_sql = _pools(utilization(*DAY, now=T0 + 24 * H))["qpu"]
    monkeypatch.setattr(selectors, "percentiles_in_sql", lambda: False)
    in_python = _pools(utilization(*DAY, now=T0 + 24 * H))["qpu"]
    assert (in_python.wait_p50, in_python.wait_p95) == (in_sql.wait_p50, in_sql.wait_p95)
    assert (in_python.dispatched, in_python.wait_p50_all, in_python.wait_p95_all) == (22, 10.0, 20.0)


def test_jobs_and_cases_created_in_the_period_by_state(history):
    pools = _pools(utilization(*DAY, now=T0 + 24 * H))
    assert pools["qpu"].jobs == {"completed": 21, "running": 1, "pending": 1}
    assert pools["local"].cases == {"done": 2, "failed": 1}
    assert pools["qpu"].cases == {} and pools["local"].jobs == {}
    assert not pools["quiet"].active and pools["quiet"].busy_share([3600.0] * 24) == [None] * 24


def test_one_pool_can_be_asked_for(history):
    result = utilization(*DAY, pool_ids=[history["local"].pk], now=T0 + 24 * H)
    assert [pool.name for pool in result.pools] == ["local"]


@pytest.mark.parametrize("in_sql", [True, False])
def test_query_count_does_not_grow_with_jobs_sessions_or_pools(history, django_assert_num_queries, monkeypatch, in_sql):
    if in_sql and connection.vendor != "postgresql":
        pytest.skip("percentile_disc is PostgreSQL's")
    monkeypatch.setattr(selectors, "percentiles_in_sql", lambda: in_sql)
    expected = 8 if in_sql else 7
    with django_assert_num_queries(expected):
        utilization(*DAY, now=T0 + 24 * H)
    qpu, user = history["qpu"], get_user_model().objects.get(username="u")
    session = make_session(qpu, user, 1, T0 + 6 * H)
    for i in range(30):
        make_job(session, JobStatus.COMPLETED, T0 + 6 * H, T0 + 6 * H + i * S, T0 + 7 * H, qpu.devices.first())
    more = ResourcePool.objects.create(name="more", public=True)
    Device.objects.create(pool=more, name="d3", driver="fake")
    with django_assert_num_queries(expected):
        utilization(*DAY, now=T0 + 24 * H)
