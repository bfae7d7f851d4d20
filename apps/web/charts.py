"""Charts drawn server-side as inline SVG (no charting script to load): bar charts of counts (a
job's outcomes, jobs per state) and time series over buckets (the operators' utilization page).

Functions here only place things: they take numbers and return geometry and texts; the templates
draw them (``web/_job_live.html``, ``web/_time_chart.html``) with a title, a description and a
table of the same numbers for readers who do not see the picture.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

ROW = 24  # px per bar
LABEL = 110  # px for the bitstring column
WIDTH = 560
MAX_BARS = 24


@dataclass
class Bar:
    label: str
    count: int
    y: int
    width: int
    share: float

    @property
    def text_y(self) -> int:
        return self.y + ROW // 2 + 4


@dataclass
class Chart:
    bars: list[Bar]
    width: int
    height: int
    label_width: int
    total: int
    hidden: int  # outcomes not drawn (beyond MAX_BARS, the rarest)

    @property
    def bar_x(self) -> int:
        return self.label_width


def counts_chart(counts: dict | None, order: Sequence[str] | None = None) -> Chart | None:
    """The most frequent outcomes first (or in ``order``: states), each bar's length proportional
    to its count."""
    if not counts:
        return None
    items = sorted(((str(k), int(v)) for k, v in counts.items()), key=lambda kv: (-kv[1], kv[0]))
    if order is not None:
        rank = {name: i for i, name in enumerate(order)}
        items.sort(key=lambda kv: (rank.get(kv[0], len(rank)), kv[0]))
    shown, hidden = items[:MAX_BARS], len(items) - min(len(items), MAX_BARS)
    total = sum(v for _, v in items) or 1
    peak = max(v for _, v in shown) or 1
    room = WIDTH - LABEL - 60
    bars = [
        Bar(label=k, count=v, y=i * ROW, width=max(1, round(room * v / peak)), share=v / total)
        for i, (k, v) in enumerate(shown)
    ]
    return Chart(bars=bars, width=WIDTH, height=len(bars) * ROW, label_width=LABEL, total=total, hidden=hidden)


# -- time series ----------------------------------------------------------------------------------
TS_WIDTH = 640
TS_HEIGHT = 220
TS_LEFT = 58  # room for the value axis labels
TS_RIGHT = 14
TS_TOP = 14
TS_BOTTOM = 30  # room for the time axis labels
X_LABELS = 6  # at most this many time labels


@dataclass
class Tick:
    pos: float
    text: str


@dataclass
class Column:
    x: float
    y: float
    width: float
    height: float
    title: str  # "01:00–02:00: 5.0"


@dataclass
class Point:
    x: float
    y: float
    title: str


@dataclass
class Line:
    name: str
    css: str
    points: list[Point]
    segments: list[str]  # polyline point lists, broken where a bucket has no value


@dataclass
class TimeChart:
    key: str  # unique on the page: ids of the title and description
    title: str
    description: str
    headers: list[str]  # the table: "Period", then one header per series
    rows: list[list[str]]
    columns: list[Column] = field(default_factory=list)
    lines: list[Line] = field(default_factory=list)
    y_ticks: list[Tick] = field(default_factory=list)
    x_ticks: list[Tick] = field(default_factory=list)
    reference: Tick | None = None  # a dashed level, e.g. the pool's capacity
    width: int = TS_WIDTH
    height: int = TS_HEIGHT
    left: int = TS_LEFT
    top: int = TS_TOP

    @property
    def right(self) -> int:
        return self.width - TS_RIGHT

    @property
    def bottom(self) -> int:
        return self.height - TS_BOTTOM


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 4, 8 × 10^k at or above ``value`` (1 for nothing): its quarters, the
    value axis's ticks, are round too."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for factor in (1, 2, 4, 8, 10):
        if value <= factor * power * (1 + 1e-9):
            return factor * power
    return 10 * power


def duration_ceiling(seconds: float) -> float:
    """:func:`nice_ceiling` in the unit the axis is read in (seconds, minutes or hours)."""
    unit = 1 if seconds < 60 else 60 if seconds < 3600 else 3600
    return nice_ceiling(seconds / unit) * unit


def number_text(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.2f}".rstrip("0").rstrip(".")


def duration_text(seconds: float | None) -> str:
    """A wait in words a reader takes in at a glance: 19 s, 4.5 min, 2 h."""
    if seconds is None:
        return "—"
    if seconds < 60:
        return f"{number_text(round(seconds, 1))} s"
    if seconds < 3600:
        return f"{number_text(round(seconds / 60, 1))} min"
    return f"{number_text(round(seconds / 3600, 1))} h"


def percent_text(share: float | None) -> str:
    return "—" if share is None else f"{number_text(round(100 * share, 1))} %"


def bucket_text(start: datetime, end: datetime, step: timedelta) -> str:
    if step >= timedelta(days=1):
        return f"{start:%Y-%m-%d}" if end - start <= timedelta(days=1) else f"{start:%Y-%m-%d}–{end:%Y-%m-%d}"
    return f"{start:%Y-%m-%d %H:%M}–{end:%H:%M}"


def _frame(buckets, step, y_max: float, fmt: Callable[[float], str]):
    since, until = buckets[0].start, buckets[-1].end
    span = (until - since).total_seconds()
    plot_w, plot_h = TS_WIDTH - TS_LEFT - TS_RIGHT, TS_HEIGHT - TS_TOP - TS_BOTTOM

    def x(moment: datetime) -> float:
        return round(TS_LEFT + plot_w * (moment - since).total_seconds() / span, 1)

    def y(value: float) -> float:
        return round(TS_TOP + plot_h * (1 - min(value, y_max) / y_max), 1)

    y_ticks = [Tick(y(y_max * i / 4), fmt(y_max * i / 4)) for i in range(5)]
    every = max(1, math.ceil(len(buckets) / X_LABELS))
    day_steps = step >= timedelta(days=1)
    x_ticks = []
    # Time labels on whole buckets only: a partial first bucket starts at an odd minute.
    first = 1 if len(buckets) > 1 and buckets[0].end - buckets[0].start < step else 0
    for i, bucket in enumerate(buckets):
        if i < first or (i - first) % every:
            continue
        new_day = i == first or bucket.start.date() != buckets[i - every].start.date()
        text = f"{bucket.start:%d %b}" if day_steps or (new_day and bucket.start.hour == 0) else f"{bucket.start:%H:%M}"
        if not day_steps and new_day and bucket.start.hour != 0:
            text = f"{bucket.start:%d %b %H:%M}"
        if x(bucket.start) <= TS_WIDTH - TS_RIGHT - 80:  # a label at the far right would be cut off
            x_ticks.append(Tick(x(bucket.start), text))
    return x, y, y_ticks, x_ticks


def column_chart(
    key: str,
    title: str,
    description: str,
    buckets,
    step: timedelta,
    values: Sequence[float | None],
    *,
    header: str,
    fmt: Callable[[float | None], str] = number_text,
    y_max: float | None = None,
    reference: float | None = None,
    reference_text: str = "",
) -> TimeChart:
    """One column per bucket, as wide as the bucket's share of the period, as tall as its value."""
    peak = max([v for v in values if v is not None] + [reference or 0])
    top = y_max if y_max is not None else nice_ceiling(peak)
    x, y, y_ticks, x_ticks = _frame(buckets, step, top, fmt)
    columns = []
    for bucket, value in zip(buckets, values, strict=True):
        if not value:
            continue
        left, right = x(bucket.start), x(bucket.end)
        gap = 1 if right - left > 3 else 0
        columns.append(
            Column(
                x=left + gap / 2,
                y=y(value),
                width=max(right - left - gap, 0.5),
                height=round(y(0) - y(value), 1),
                title=f"{bucket_text(bucket.start, bucket.end, step)}: {fmt(value)}",
            )
        )
    chart = TimeChart(
        key=key,
        title=title,
        description=description,
        headers=["Period (UTC)", header],
        rows=[[bucket_text(b.start, b.end, step), fmt(v)] for b, v in zip(buckets, values, strict=True)],
        columns=columns,
        y_ticks=y_ticks,
        x_ticks=x_ticks,
    )
    if reference is not None:
        chart.reference = Tick(y(reference), reference_text)
    return chart


def line_chart(
    key: str,
    title: str,
    description: str,
    buckets,
    step: timedelta,
    series: Sequence[tuple[str, str, Sequence[float | None]]],
    *,
    fmt: Callable[[float | None], str] = number_text,
    ceiling: Callable[[float], float] = nice_ceiling,
) -> TimeChart:
    """A point per bucket with a value (at the bucket's middle), joined; gaps where none."""
    peak = max([v for _, _, values in series for v in values if v is not None] + [0])
    x, y, y_ticks, x_ticks = _frame(buckets, step, ceiling(peak), fmt)
    lines = []
    for name, css, values in series:
        points, segments, current = [], [], []
        for bucket, value in zip(buckets, values, strict=True):
            if value is None:
                if current:
                    segments.append(" ".join(current))
                current = []
                continue
            middle = bucket.start + (bucket.end - bucket.start) / 2
            point = Point(x(middle), y(value), f"{name}, {bucket_text(bucket.start, bucket.end, step)}: {fmt(value)}")
            points.append(point)
            current.append(f"{point.x},{point.y}")
        if current:
            segments.append(" ".join(current))
        lines.append(Line(name=name, css=css, points=points, segments=segments))
    rows = [
        [bucket_text(b.start, b.end, step), *(fmt(values[i]) for _, _, values in series)] for i, b in enumerate(buckets)
    ]
    return TimeChart(
        key=key,
        title=title,
        description=description,
        headers=["Period (UTC)", *(name for name, _, _ in series)],
        rows=rows,
        lines=lines,
        y_ticks=y_ticks,
        x_ticks=x_ticks,
    )


# -- the operators' utilization page --------------------------------------------------------------
JOB_STATES = ["pending", "running", "completed", "failed", "cancelled"]
CASE_STATES = ["prepared", "pending", "running", "done", "failed", "cancelled"]


def step_text(step: timedelta) -> str:
    minutes = int(step.total_seconds() // 60)
    for size, one, many in ((7 * 1440, "week", "weeks"), (1440, "day", "days"), (60, "hour", "hours")):
        if minutes % size == 0:
            count = minutes // size
            return one if count == 1 else f"{count} {many}"
    return f"{minutes} minutes"


def _counts_text(counts: dict[str, int], order: Sequence[str]) -> str:
    known = [state for state in order if counts.get(state)] + sorted(set(counts) - set(order))
    return ", ".join(f"{counts[state]} {state}" for state in known)


@dataclass
class PoolPanel:
    """What the page shows for one pool: key figures, time charts and per-state bars."""

    pool: object  # PoolUtilization
    key: str  # id prefix, unique on the page
    facts: list[tuple[str, str]]
    charts: list[TimeChart]
    notes: list[str]
    jobs_chart: Chart | None
    jobs_text: str
    cases_chart: Chart | None
    cases_text: str


def utilization_panels(result) -> list[PoolPanel]:
    """The pictures of ``apps.accounting.selectors.utilization``'s answer, pool by pool."""
    parts, step, elapsed = result.buckets, result.step, result.elapsed
    per = step_text(step)
    panels = []
    for pool in result.pools:
        key = f"pool-{pool.pool_id}"
        facts, charts, notes = [], [], []
        slot_hours = sum(v * e for v, e in zip(pool.slots, elapsed, strict=True) if v is not None) / 3600
        peak_at = max(range(len(parts)), key=lambda i: pool.slots[i] or 0)
        total = f" of {pool.slots_total}" if pool.slots_total is not None else " (no limit)"
        if any(pool.slots):
            facts.append(("Slot-hours", number_text(round(slot_hours, 2))))
            facts.append(("Peak slots held", f"{number_text(round(pool.slots[peak_at], 2))}{total}"))
            charts.append(
                column_chart(
                    f"{key}-slots",
                    "Slots held",
                    f"Slots held by sessions, averaged over each {per}: at most "
                    f"{number_text(round(pool.slots[peak_at], 2))}{total} "
                    f"({bucket_text(parts[peak_at].start, parts[peak_at].end, step)}); "
                    f"{number_text(round(slot_hours, 2))} slot-hours in the period.",
                    parts,
                    step,
                    [None if v is None else round(v, 2) for v in pool.slots],
                    header="Slots held (average)",
                    reference=pool.slots_total,
                    reference_text=f"{pool.slots_total} slots" if pool.slots_total is not None else "",
                )
            )
        else:
            notes.append("No session held slots in this period.")
        if pool.capacity:
            shares = pool.busy_share(elapsed)
            peak_share = max([v for v in shares if v is not None] + [0])
            busy_hours = sum(pool.busy_seconds) / 3600
            per_device = "; ".join(f"{d.name} {number_text(round(d.busy_seconds / 3600, 2))} h" for d in pool.devices)
            facts.append(("Device busy time", f"{number_text(round(busy_hours, 2))} h"))
            charts.append(
                column_chart(
                    f"{key}-busy",
                    "Device busy time",
                    f"Share of the pool's current device capacity ({pool.capacity} job(s) at once on "
                    f"{len(pool.devices)} device(s) today, applied to the whole period: over 100 % where "
                    f"devices were removed since) held by jobs from dispatch to end, per {per}; "
                    f"{number_text(round(busy_hours, 2))} device-hours in the period ({per_device}).",
                    parts,
                    step,
                    shares,
                    header="Busy",
                    fmt=percent_text,
                    y_max=None if peak_share > 1 else 1.0,  # over 100 % is drawn as it is, not clipped
                )
            )
        else:
            notes.append("No devices: this pool takes no jobs, so it has no device time or queue wait.")
        if pool.dispatched:
            facts.append(("Queue wait p50", duration_text(pool.wait_p50_all)))
            facts.append(("Queue wait p95", duration_text(pool.wait_p95_all)))
            charts.append(
                line_chart(
                    f"{key}-wait",
                    "Queue wait p50 and p95",
                    f"Wait from submission to dispatch of the jobs dispatched in each {per}; over the period "
                    f"p50 {duration_text(pool.wait_p50_all)} and p95 {duration_text(pool.wait_p95_all)} "
                    f"({pool.dispatched} jobs).",
                    parts,
                    step,
                    [("p50", "p50", pool.wait_p50), ("p95", "p95", pool.wait_p95)],
                    fmt=duration_text,
                    ceiling=duration_ceiling,
                )
            )
        elif pool.capacity:
            notes.append("No job was dispatched in this period.")
        jobs_total, cases_total = sum(pool.jobs.values()), sum(pool.cases.values())
        panels.append(
            PoolPanel(
                pool=pool,
                key=key,
                facts=facts,
                charts=charts,
                notes=notes,
                jobs_chart=counts_chart(pool.jobs, JOB_STATES),
                jobs_text=f"{jobs_total} job(s) created in the period"
                + (f": {_counts_text(pool.jobs, JOB_STATES)}." if jobs_total else "."),
                cases_chart=counts_chart(pool.cases, CASE_STATES),
                cases_text=f"{cases_total} case(s) created in the period"
                + (f": {_counts_text(pool.cases, CASE_STATES)}." if cases_total else "."),
            )
        )
    return panels
