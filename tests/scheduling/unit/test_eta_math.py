"""R-JOB-5: the expected start's math, on plain rows (no database): the order each strategy
would serve pending jobs in, the wait that later arrivals add, the median and the 90 % bound,
and the correction learned from recorded starts."""

import math

import pytest

from apps.scheduling import eta


def row(pk, session, user, mean=60.0, var=0.0, vruntime=0.0, slots=1, created=0.0):
    return eta.Pending(pk, session, user, mean, var, None, vruntime, slots, created, None)


def test_a_fifo_queue_serves_in_submission_order_and_sums_the_device_time_before_each():
    queue = eta.Queue("fifo", [row(1, "a", 1, 10.0), row(2, "b", 2, 20.0), row(3, "a", 1, 30.0)], capacity=1)
    assert queue.rank == {1: 1, 2: 2, 3: 3}
    assert list(queue.before_mean) == [0.0, 10.0, 30.0, 60.0]
    assert queue.first_of_session == {"a": 1, "b": 2}


def test_weighted_fair_interleaves_sessions_by_their_start_tags():
    # a (slots 1) has three jobs, b (slots 2) three: b's tags advance by 1/2 per job.
    rows = [row(i, "a", 1, created=0.0) for i in (1, 2, 3)] + [row(i, "b", 2, slots=2, created=1.0) for i in (4, 5, 6)]
    queue = eta.Queue("weighted_fair", rows, capacity=1)
    order = sorted(queue.rank, key=queue.rank.get)
    assert order == [1, 4, 5, 2, 6, 3]  # tags a: 0 1 2, b: 0 .5 1; ties go to the older session


def test_usage_fair_serves_the_share_with_less_usage_first():
    shares = eta.Shares(
        key_of={1: "one", 2: "two"},
        vtime={"one": 0.0, "two": 0.0},
        weight={"one": 1.0, "two": 1.0},
        start={"one": 600.0, "two": 0.0},
        half_life=math.inf,
    )
    queue = eta.Queue("usage_fair", [row(1, "a", 1), row(2, "b", 2)], capacity=1, shares=shares)
    assert queue.rank == {2: 1, 1: 2}
    assert queue.behind_share == {1}


def test_nothing_arriving_adds_nothing_to_the_wait():
    assert eta.fill(100.0, [], 1) == (0.0, 0.0, 1.0)


def test_a_flow_with_room_to_spare_stretches_the_wait_to_its_fixed_point():
    added, variance, gain = eta.fill(60.0, [(1e9, 0.5, 0.0)], 1)  # W = 60 + 0.5 W
    assert added == pytest.approx(60.0)
    assert gain == pytest.approx(2.0)
    assert variance == 0.0  # no lumps: arrivals as a steady stream


def test_a_flow_adds_at_most_its_room_below_the_job():
    added, variance, gain = eta.fill(60.0, [(10.0, 0.5, 30.0)], 1)
    assert added == pytest.approx(10.0)
    assert (variance, gain) == (0.0, 1.0)  # the room is used up for sure


def test_the_median_of_a_spread_wait_is_below_its_mean_and_its_bound_above():
    found = eta.estimate(120.0, 120.0**2, 0.0, 0.0, 1.0)
    assert found.median == pytest.approx(120.0 / math.sqrt(2))
    assert found.std == pytest.approx(120.0)
    mu, sigma = eta.lognormal(120.0, 120.0**2)
    assert found.p90 == pytest.approx(math.exp(mu + 1.2815515655 * sigma))
    assert found.median < 120.0 < found.p90


def test_a_certain_wait_has_its_bound_at_its_median():
    found = eta.estimate(60.0, 0.0, 10.0, 0.0, 1.0)
    assert found.median == pytest.approx(70.0) and found.p90 == pytest.approx(70.0)


def test_a_queue_estimate_counts_the_running_rest_and_the_jobs_ranked_before():
    queue = eta.Queue("fifo", [row(1, "a", 1, 30.0), row(2, "a", 1, 30.0)], capacity=2)
    found = queue.estimate(2, (90.0, 0.0), 2)  # (90 s left running + 30 s before it) over 2
    assert found.median == pytest.approx(60.0)


def test_too_few_recorded_starts_correct_nothing_but_still_say_how_the_bounds_held():
    correction = eta.learn([(60.0, 120.0, 300.0, 120.0, None)] * (eta.CORRECTION_MIN - 1))
    assert correction.p90 == 1.0
    assert (correction.starts, correction.coverage, correction.early) == (eta.CORRECTION_MIN - 1, 0.0, 0.0)


def starts_held(held: int, level: float | None = 0.9, n: int = 100):
    """``n`` starts whose actual waits are 1 to 3 times the bound predicted (100 s), of which
    the first ``held`` beat the bound shown to them, learned at ``level``."""
    out = []
    for i in range(n):
        actual = 100.0 * (1 + 2 * i / (n - 1))
        out.append((50.0, 100.0, actual, actual if i < held else actual / 2, level))
    return out


def test_bounds_that_held_nine_times_in_ten_are_learned_again_at_the_level_they_were():
    correction = eta.learn(starts_held(90))
    assert correction.coverage == pytest.approx(0.9) and correction.level == pytest.approx(0.9)
    assert correction.p90 == pytest.approx((1 + 2 * 90 / 99) * 100.0 / 100.0)  # the 90th of the ratios
    assert correction.early == 0.0  # each waited past the median predicted (50 s)


def test_bounds_that_held_too_rarely_raise_the_level_and_too_often_lower_it():
    assert eta.learn(starts_held(85)).level == pytest.approx(0.95)
    assert eta.learn(starts_held(85)).p90 == pytest.approx(1 + 2 * 95 / 99)
    assert eta.learn(starts_held(95)).level == pytest.approx(0.85)
    assert eta.learn(starts_held(1)).level == eta.LEVEL_RANGE[1]
    # The level integrates: bounds learned at 0.95 that held as promised stay at 0.95, and
    # starts recorded before any level count as learned at 0.9.
    assert eta.learn(starts_held(90, level=0.95)).level == pytest.approx(0.95)
    assert eta.learn(starts_held(85, level=None)).level == pytest.approx(0.95)


def test_the_median_is_shown_as_the_model_has_it_and_the_bound_is_only_widened():
    starts = [(50.0, 100.0, 1.0, 100.0, 0.9)] * 100  # everything started at once
    correction = eta.learn(starts)
    assert correction.p90 == 1.0 and correction.early == 1.0  # the model's bound, never narrowed
    assert correction.apply(eta.Estimate(40.0, 10.0, 41.0)) == (40.0, 41.0)
    late = eta.learn([(50.0, 100.0, 10_000.0, 100.0, 0.9)] * 100)  # everything started very late
    assert late.p90 == eta.CORRECTION_MAX
    shown, bound = late.apply(eta.Estimate(40.0, 10.0, 41.0))
    assert shown == 40.0 and bound == pytest.approx(41.0 * eta.CORRECTION_MAX)
    assert eta.Correction(p90=1.0).apply(eta.Estimate(40.0, 10.0, 30.0)) == (40.0, 40.0)  # never below it


def test_a_pools_correction_is_learned_once_per_max_age_and_stale_pools_in_one_read():
    cache, reads = eta.Cache(), []

    def read(pool_ids):
        reads.append(sorted(pool_ids))
        return {7: [(60.0, 60.0, 120.0, 60.0, 0.9)] * eta.CORRECTION_MIN}

    first = cache.corrections([7, 8], read)
    assert first[7].p90 == 2.0 and first[8] == eta.NO_CORRECTION
    assert cache.corrections([7, 8], read) == first and reads == [[7, 8]]
    cache.clear()
    cache.corrections([7], read)
    assert reads == [[7, 8], [7]]


def test_a_start_that_reaches_a_window_is_pushed_past_it_by_the_time_left():
    # 60 s of work, a window from 30 s to 630 s: 30 s before it, the other 30 s after it.
    assert eta.push_past(60.0, [(30.0, 630.0, 0.0)]) == pytest.approx(660.0)


def test_a_start_before_a_window_or_after_it_ended_is_untouched():
    assert eta.push_past(20.0, [(30.0, 630.0, 0.0)]) == pytest.approx(20.0)
    assert eta.push_past(20.0, [(-600.0, -10.0, 0.0)]) == pytest.approx(20.0)


def test_an_open_window_and_a_start_that_falls_on_a_window_both_wait_for_its_end():
    assert eta.push_past(0.0, [(-10.0, 100.0, 0.0)]) == pytest.approx(100.0)
    assert eta.push_past(30.0, [(30.0, 90.0, 0.0), (100.0, 200.0, 0.0)]) == pytest.approx(90.0)


def test_a_window_on_some_of_the_devices_slows_the_clock_to_the_capacity_the_others_leave():
    # 60 s of work; from 30 s to 630 s half the capacity is left: the other 30 s take 60 s.
    assert eta.push_past(60.0, [(30.0, 630.0, 0.5)]) == pytest.approx(90.0)
    # 400 s of work: 30 s before, 300 s of work in the 600 s window at half speed, 70 s after it.
    assert eta.push_past(400.0, [(30.0, 630.0, 0.5)]) == pytest.approx(700.0)
    # A start that falls on a window that leaves some capacity is not moved to its end.
    assert eta.push_past(30.0, [(30.0, 630.0, 0.5)]) == pytest.approx(30.0)


def test_the_capacity_left_counts_each_device_once_and_the_whole_pool_as_every_device():
    capacity_of = {1: 1, 2: 1, 3: 2}  # four jobs at once
    assert eta.capacity_left([(10.0, 20.0, 1)], capacity_of) == [(10.0, 20.0, 0.75)]
    # Device 1 off from 0 to 30 (twice: maintenance and a reservation), device 3 from 20 to 40.
    spans = [(0.0, 30.0, 1), (0.0, 30.0, 1), (20.0, 40.0, 3)]
    assert eta.capacity_left(spans, capacity_of) == [(0.0, 20.0, 0.75), (20.0, 30.0, 0.25), (30.0, 40.0, 0.5)]
    # Every device, or the pool itself (None): nothing left.
    assert eta.capacity_left([(0.0, 5.0, 1), (0.0, 5.0, 2), (0.0, 5.0, 3)], capacity_of) == [(0.0, 5.0, 0.0)]
    assert eta.capacity_left([(0.0, 5.0, None), (3.0, 9.0, 2)], capacity_of) == [(0.0, 5.0, 0.0), (5.0, 9.0, 0.75)]
    # A device that is not usable now (not in capacity_of) is already left out of the capacity.
    assert eta.capacity_left([(0.0, 5.0, 9)], capacity_of) == []
