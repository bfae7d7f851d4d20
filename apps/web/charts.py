"""Bar charts of job counts, drawn server-side as inline SVG (no charting script to load)."""

from __future__ import annotations

from dataclasses import dataclass

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


def counts_chart(counts: dict | None) -> Chart | None:
    """The most frequent outcomes first, each bar's length proportional to its count."""
    if not counts:
        return None
    items = sorted(((str(k), int(v)) for k, v in counts.items()), key=lambda kv: (-kv[1], kv[0]))
    shown, hidden = items[:MAX_BARS], len(items) - min(len(items), MAX_BARS)
    total = sum(v for _, v in items) or 1
    peak = shown[0][1] or 1
    room = WIDTH - LABEL - 60
    bars = [
        Bar(label=k, count=v, y=i * ROW, width=max(1, round(room * v / peak)), share=v / total)
        for i, (k, v) in enumerate(shown)
    ]
    return Chart(bars=bars, width=WIDTH, height=len(bars) * ROW, label_width=LABEL, total=total, hidden=hidden)
