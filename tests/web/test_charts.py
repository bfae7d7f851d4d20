"""The SVG geometry of apps/web/charts.py: round value axes, readable durations, columns as wide as
their bucket, lines broken where a bucket has no value, states in their natural order."""

from datetime import UTC, datetime, timedelta

import pytest

from apps.accounting.selectors import buckets
from apps.web import charts

T0 = datetime(2026, 11, 1, tzinfo=UTC)
H = timedelta(hours=1)


@pytest.mark.parametrize(
    "value, ceiling", [(0, 1), (0.3, 0.4), (1, 1), (5, 8), (10, 10), (11, 20), (2.95, 4), (1800, 2000)]
)
def test_value_axes_end_on_a_round_number_whose_quarters_are_round(value, ceiling):
    assert charts.nice_ceiling(value) == pytest.approx(ceiling)


def test_duration_axes_are_round_in_minutes_and_hours():
    assert charts.duration_ceiling(1800) == 40 * 60
    assert charts.duration_ceiling(3 * 3600) == 4 * 3600
    assert charts.duration_ceiling(19) == 20


@pytest.mark.parametrize(
    "seconds, text", [(None, "—"), (0.5, "0.5 s"), (10, "10 s"), (19.04, "19 s"), (270, "4.5 min"), (7200, "2 h")]
)
def test_durations_read_in_the_unit_that_fits(seconds, text):
    assert charts.duration_text(seconds) == text


def test_columns_are_as_wide_as_their_bucket_and_as_tall_as_their_value():
    step, parts = buckets(T0 + 0.5 * H, T0 + 48 * H)  # hourly: the first bucket is half an hour
    values = [1.0] + [2.0] * (len(parts) - 1)
    chart = charts.column_chart("k", "t", "d", parts, step, values, header="h", reference=4, reference_text="4 slots")
    first, second = chart.columns[0], chart.columns[1]
    assert first.width + 1 == pytest.approx((second.width + 1) / 2, abs=0.2)
    assert first.height == pytest.approx(second.height / 2, abs=0.2)
    assert chart.reference.text == "4 slots" and chart.y_ticks[-1].text == "4"
    assert chart.rows[0] == ["2026-11-01 00:30–01:00", "1"]
    assert chart.x_ticks[0].text == "01 Nov 01:00"  # the partial first bucket gets no label


def test_lines_break_where_a_bucket_has_no_value():
    step, parts = buckets(T0, T0 + 5 * H)
    values = [None] * len(parts)
    values[0], values[1], values[3] = 10.0, 20.0, 5.0
    chart = charts.line_chart("k", "t", "d", parts, step, [("p50", "p50", values)], fmt=charts.duration_text)
    (line,) = chart.lines
    assert len(line.points) == 3 and len(line.segments) == 2
    assert line.points[1].title.endswith(": 20 s")


def test_states_keep_their_order_and_outcomes_their_frequency():
    states = charts.counts_chart({"completed": 21, "pending": 1, "running": 1}, charts.JOB_STATES)
    assert [bar.label for bar in states.bars] == ["pending", "running", "completed"]
    outcomes = charts.counts_chart({"01": 3, "00": 9})
    assert [bar.label for bar in outcomes.bars] == ["00", "01"]
