"""The keys the scheduling strategies order by and charge with (R-SCHED-1, R-SCHED-2, R-SCHED-6),
as pure arithmetic: no database. Which job the dispatcher then takes is proven through the
database in tests/scheduling/test_strategies.py and test_usage_fair.py."""

from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

from apps.scheduling import shares
from apps.scheduling.models import FairShare, Job
from apps.scheduling.strategies import STRATEGIES, Fifo, UsageFair, WeightedFair, strategy_for

HOUR = 3600.0
POOL = SimpleNamespace(usage_half_life=HOUR)


def share(usage=0.0, catch_up=0.0, weight=1.0, queued=True, usage_at=0.0):
    return FairShare(usage=usage, catch_up=catch_up, weight=weight, queued=queued, usage_at=usage_at)


def test_strategy_for_names_each_strategy_of_the_pool_setting():
    assert isinstance(strategy_for("fifo"), Fifo)
    assert isinstance(strategy_for("weighted_fair"), WeightedFair)
    assert isinstance(strategy_for("usage_fair"), UsageFair)
    assert set(STRATEGIES) == {"fifo", "weighted_fair", "usage_fair"}


def test_strategy_for_an_unknown_name_is_a_key_error():
    with pytest.raises(KeyError):
        strategy_for("round_robin")


def test_weighted_fair_charges_one_over_the_slots_at_dispatch_and_nothing_at_completion():
    job = Job(runtime_seconds=10.0)
    assert WeightedFair().dispatch_charge(job, 5) == pytest.approx(0.2)
    assert WeightedFair().completion_charge(job, 5) == 0.0
    assert not WeightedFair.charge_at_completion


def test_usage_fair_charges_device_time_over_slots_at_completion_only():
    job = Job(runtime_seconds=12.0)
    assert UsageFair().dispatch_charge(job, 4) == 0.0
    assert UsageFair().completion_charge(job, 4) == pytest.approx(3.0)
    assert UsageFair().completion_charge(Job(runtime_seconds=None), 4) == 0.0
    assert UsageFair.charge_at_completion


def test_fifo_charges_nothing():
    job = Job(runtime_seconds=12.0)
    assert Fifo().dispatch_charge(job, 1) == Fifo().completion_charge(job, 1) == 0.0


def test_usage_halves_every_half_life():
    assert shares.decayed(8.0, 0.0, 2 * HOUR, HOUR) == pytest.approx(2.0)


def test_usage_does_not_grow_when_the_clock_is_behind_its_timestamp():
    assert shares.decayed(8.0, 100.0, 50.0, HOUR) == 8.0


def test_no_usage_decays_to_zero():
    assert shares.decayed(0.0, 0.0, HOUR, HOUR) == 0.0


def test_level_one_key_is_decayed_usage_catch_up_and_in_flight_time_over_weight():
    keys = shares.level_one(
        POOL, {("user", 1): share(usage=8.0, catch_up=4.0, weight=2.0)}, {("user", 1): 6.0}, v1=0.0, now=HOUR
    )
    assert keys[("user", 1)] == pytest.approx((4.0 + 2.0 + 6.0) / 2.0)


def test_level_one_raises_a_share_that_becomes_runnable_to_the_level_virtual_time():
    keys = shares.level_one(
        POOL, {("user", 1): share(queued=False), ("user", 2): share(queued=True)}, {}, v1=5.0, now=0.0
    )
    assert keys == {("user", 1): 5.0, ("user", 2): 0.0}


def test_level_one_leaves_a_runnable_share_above_the_virtual_time_where_it_is():
    keys = shares.level_one(POOL, {("user", 1): share(usage=9.0, queued=False)}, {}, v1=5.0, now=0.0)
    assert keys[("user", 1)] == pytest.approx(9.0)


def test_first_share_is_the_smallest_key():
    assert shares.first_share({("user", 1): 3.0, ("user", 2): 1.0}) == (1.0, ("user", 2))


def test_first_share_on_a_tie_prefers_a_group_then_the_smaller_id():
    assert shares.first_share({("user", 1): 1.0, ("group", 9): 1.0}) == (1.0, ("group", 9))
    assert shares.first_share({("user", 7): 1.0, ("user", 3): 1.0}) == (1.0, ("user", 3))


EARLY, LATE = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 2, tzinfo=UTC)


def test_first_session_is_the_smallest_vruntime():
    rows = [("a", 1, 2.0, 1, EARLY), ("b", 1, 1.0, 1, LATE)]
    assert shares.first_session(rows, vtime=0.0)[0] == "b"


def test_first_session_counts_a_session_behind_the_share_at_its_virtual_time():
    """An arriving session (vruntime 0) is not ahead of one runnable all along: both count at
    the share's virtual time, and the older goes first."""
    rows = [("new", 1, 0.0, 1, LATE), ("old", 1, 3.0, 1, EARLY)]
    assert shares.first_session(rows, vtime=3.0)[0] == "old"


def test_first_session_on_a_tie_prefers_the_older_then_the_smaller_id():
    assert shares.first_session([("b", 1, 1.0, 1, EARLY), ("a", 1, 1.0, 1, LATE)], vtime=0.0)[0] == "b"
    assert shares.first_session([("b", 1, 1.0, 1, EARLY), ("a", 1, 1.0, 1, EARLY)], vtime=0.0)[0] == "a"
