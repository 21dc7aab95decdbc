"""The time axis of the HTML report and row assignment for marks that would overlap.

``nice_ticks`` picks round 1-2-5 ticks; ``_Axis`` maps seconds to x on the geometry of
``style`` (so the timeline and every metric chart share one axis); ``_rows`` and
``_rows_in_order`` stack overlapping spans into rows; ``_union`` merges time windows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from harness.reports.htmlreport.style import _AXIS, _LEFT, _WIDTH


def nice_ticks(end: float, target: int = 8) -> tuple[float, list[float]]:
    """Round ticks from 0 covering ``end``: a 1-2-5 step giving about ``target`` intervals
    (at most ``1.25 * target``).
    Returns ``(step, ticks)``; the last tick is at or after ``end``."""
    span = end if end > 0 and math.isfinite(end) else 1.0
    raw = span / target
    magnitude = 10 ** math.floor(math.log10(raw))
    # the finest 1-2-5 step that gives at most a quarter more intervals than asked for
    step = next(m * magnitude for m in (1, 2, 5, 10) if span / (m * magnitude) <= target * 1.25 + 1e-9)
    count = max(1, math.ceil(span / step - 1e-9))
    return step, [round(i * step, 9) for i in range(count + 1)]


def _tick_text(t: float, step: float) -> str:
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    return f"{t:.{decimals}f}"


@dataclass(frozen=True)
class _Axis:
    step: float
    ticks: list[float]

    @classmethod
    def of(cls, end: float) -> _Axis:
        step, ticks = nice_ticks(end)
        return cls(step, ticks)

    @classmethod
    def between(cls, t0: float, t1: float) -> _Axis:
        """An axis over ``[t0, t1]`` widened to round ticks (a zoomed view)."""
        step, _ = nice_ticks(max(t1 - t0, 1e-3))
        first = math.floor(t0 / step + 1e-9)
        count = max(1, math.ceil(t1 / step - 1e-9) - first)
        return cls(step, [round((first + i) * step, 9) for i in range(count + 1)])

    @property
    def start(self) -> float:
        return self.ticks[0]

    @property
    def end(self) -> float:
        return self.ticks[-1]

    def shows(self, t: float) -> bool:
        """Whether a moment lies on this axis (a zoomed view leaves out what is outside it)."""
        return self.start - 1e-9 <= t <= self.end + 1e-9

    def x(self, t: float) -> float:
        return _LEFT + (max(self.start, min(t, self.end)) - self.start) / (self.end - self.start) * _WIDTH

    def grid(self, y0: float, y1: float) -> str:
        return "".join(
            f"<line x1='{self.x(t):.1f}' x2='{self.x(t):.1f}' y1='{y0:.1f}' y2='{y1:.1f}' stroke='#eaeef2'/>"
            for t in self.ticks
        )

    def labels(self, y: float) -> str:
        """Tick labels at baseline ``y``, with the unit named at the axis end."""
        out = [
            f"<text class='tick' x='{self.x(t):.1f}' y='{y:.1f}' text-anchor='middle' fill='{_AXIS}'>"
            f"{_tick_text(t, self.step)}</text>"
            for t in self.ticks
        ]
        out.append(f"<text class='unit' x='{_LEFT + _WIDTH + 14}' y='{y:.1f}' fill='{_AXIS}'>s</text>")
        return "".join(out)


def _rows(spans: Sequence[tuple[float, float]], gap: float = 4.0) -> list[int]:
    """Interval lane assignment: a row per span so that spans sharing a row do not overlap
    (``gap`` pixels apart at least); earlier spans take lower rows."""
    order = sorted(range(len(spans)), key=lambda i: spans[i])
    row_ends: list[float] = []
    rows = [0] * len(spans)
    for i in order:
        start, end = spans[i]
        for r, last in enumerate(row_ends):
            if last + gap <= start:
                rows[i], row_ends[r] = r, end
                break
        else:
            rows[i] = len(row_ends)
            row_ends.append(end)
    return rows


def _union(windows: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(windows):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _rows_in_order(spans: Sequence[tuple[float, float]], gap: float = 1.0) -> list[int]:
    """Like ``_rows`` but spans are placed in the order given (so the first ones keep row 0)."""
    rows: list[int] = []
    taken: list[list[tuple[float, float]]] = []
    for start, end in spans:
        for r, row in enumerate(taken):
            if all(end + gap <= a or b + gap <= start for a, b in row):
                row.append((start, end))
                rows.append(r)
                break
        else:
            taken.append([(start, end)])
            rows.append(len(taken) - 1)
    return rows
