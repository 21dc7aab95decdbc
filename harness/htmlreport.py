"""The HTML report of one run (``report.html``): one self-contained page for a person.

Top to bottom: the verdict badge and why; the checks, failed first; the timeline (a lane
per process plus harness, nemesis and checks, on a time axis in seconds with round ticks,
and a legend for every mark and colour); step charts of the scraped metrics that matter,
on the same time axis; then steps, faults, processes, files and every event. Plain
HTML, CSS and inline SVG written here; no JavaScript. ``harness.report`` writes the file.

Which metrics are charted is the ``METRIC_CHARTS`` table just below.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.checks import NamedResult
from harness.timeline import Entry, History
from harness.verdict import RunResult

__all__ = ["METRIC_CHARTS", "MetricChart", "metric_charts", "nice_ticks", "render_html", "timeline_svg"]


@dataclass(frozen=True)
class MetricChart:
    """One chart: the samples whose name is one of ``names`` (with or without ``_total``),
    summed over their labels, per process, as last scraped."""

    title: str
    names: tuple[str, ...]
    unit: str  # "count", "bytes" or "flag"


# The metrics worth a chart, in page order. A name matches a sample with or without the
# ``_total`` suffix, so ``mxref_bytes_loaded`` finds ``mxref_bytes_loaded_total``; list
# every spelling a metric has had so old run folders still chart.
METRIC_CHARTS: tuple[MetricChart, ...] = (
    MetricChart("source attempts (all results)", ("mx_p2p_source_attempts",), "count"),
    MetricChart("data plane healthy (1 = yes)", ("mxref_data_plane_healthy",), "flag"),
    MetricChart("bytes loaded", ("mxref_bytes_loaded", "mxref_loaded_bytes"), "bytes"),
    MetricChart("data-plane errors (timeouts + failures)", ("mx_nixl_data_plane_errors",), "count"),
)

# ------------------------------------------------------------------------ styles

_GREEN, _RED, _AMBER, _PURPLE, _BLUE, _ORANGE, _VIOLET, _GREY = (
    "#1a7f37", "#cf222e", "#9a6700", "#8250df", "#0969da", "#bc4c00", "#6639ba", "#6e7781",
)
_CHECK_COLORS: dict[object, str] = {True: _GREEN, False: _RED, "unknown": _AMBER}
_VERDICT_COLORS = {
    "pass": _GREEN,
    "fail": _RED,
    "unknown": _AMBER,
    "hang": _PURPLE,
    "error": _GREY,
    "xfail": _ORANGE,
    "xpass": _BLUE,
    "skip": _GREY,
}
# events drawn as dots on a process lane: colour, legend text
_EVENT_STYLE = {
    "load_done": (_GREEN, "load_done"),
    "fallback": (_ORANGE, "fallback"),
    "transfer_timeout": (_RED, "transfer timeout"),
    "transfer_error": (_RED, "transfer error"),
    "load_failed": (_RED, "load_failed"),
    "peer_disconnected": (_VIOLET, "peer disconnected"),
    "integrity": (_BLUE, "integrity"),
}
_ALIVE, _FAULT, _STEP, _STATUS, _AXIS = "#afb8c1", _RED, "#57606a", _BLUE, "#57606a"
# one colour per process in the metric charts (cycled)
_SERIES = ("#0969da", "#bc4c00", "#1a7f37", "#8250df", "#cf222e", "#1b7c83", "#9a6700", "#bf3989")

# geometry shared by the timeline and the charts, so their time axes line up
_LEFT, _WIDTH, _RIGHT = 120, 880, 40
_CHAR_W = 6.4  # about one character of 11px text


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _valid_text(valid: Any) -> str:
    return "PASS" if valid is True else "FAIL" if valid is False else "UNKNOWN"


# ------------------------------------------------------------------------ time axis


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

    @property
    def end(self) -> float:
        return self.ticks[-1]

    def x(self, t: float) -> float:
        return _LEFT + max(0.0, min(t, self.end)) / self.end * _WIDTH

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


# ------------------------------------------------------------------------ timeline


def timeline_svg(h: History, processes: Iterable[str], checks: Sequence[NamedResult] = ()) -> str:
    """A lane per process (plus harness, nemesis and checks) on a time axis in seconds.

    Faults: one row each in the nemesis lane (overlapping windows stacked), the time any
    fault is active shaded across all lanes, and each window outlined on its target's lane.
    Processes: lifetime bars, transfers as thin bars, outcomes as dots (coincident dots
    stacked), status changes as text. Checks: a numbered dot per mark, failures on top."""
    processes = list(processes)
    end = max(h.end, 1e-3)
    axis = _Axis.of(end)
    x = axis.x
    body: list[str] = []
    labels: list[str] = []
    y = 18.0  # below the top tick labels

    def lane_label(name: str, top: float, baseline: float = 16) -> None:
        labels.append(f"<text x='4' y='{top + baseline:.1f}' class='lane'>{_e(name)}</text>")

    def sep(bottom: float) -> None:
        body.append(f"<line x1='{_LEFT}' x2='{_LEFT + _WIDTH}' y1='{bottom:.1f}' y2='{bottom:.1f}' stroke='#d0d7de'/>")

    # harness: step starts as ticks, marks (mark, hang, await timeout) as labelled diamonds in rows
    top = y
    lane_label("harness", top)
    for entry in h.select(actor="harness", f="step", type="invoke"):
        body.append(
            f"<line x1='{x(entry.t):.1f}' x2='{x(entry.t):.1f}' y1='{top + 4:.1f}' y2='{top + 18:.1f}' stroke='{_STEP}' "
            f"stroke-width='1.5'><title>{entry.t:.3f}s step {_e(entry.get('step'))}: {_e(entry.get('text'))}</title></line>"
        )
    marks = list(h.select(actor="harness", f=("mark", "hang", "await_timeout")))
    mark_text = [str(m.get("mark") or m.f) for m in marks]
    mark_rows = _rows([(x(m.t) - 5, x(m.t) + 8 + _CHAR_W * len(t)) for m, t in zip(marks, mark_text, strict=True)])
    for m, text, row in zip(marks, mark_text, mark_rows, strict=True):
        cy = top + 28 + 14 * row
        body.append(
            f"<path class='mark' d='M{x(m.t):.1f} {cy - 5:.1f} l4 5 l-4 5 l-4 -5 z' fill='{_PURPLE}'>"
            f"<title>{m.t:.3f}s {_e(m.f)}: {_e(text)}</title></path>"
            f"<text x='{x(m.t) + 6:.1f}' y='{cy + 4:.1f}' fill='{_PURPLE}'>{_e(text)}</text>"
        )
    y = top + 22 + 14 * (max(mark_rows, default=-1) + 1) + 4
    sep(y)

    # nemesis: one bar per fault window, overlapping windows in separate rows
    top = y
    lane_label("nemesis", top)
    windows = h.fault_windows()
    spans: list[tuple[float, float]] = []
    inside: list[bool] = []
    for w in windows:
        x0, x1 = x(w.start), max(x(w.end if w.end is not None else end), x(w.start) + 3)
        text_w = _CHAR_W * len(w.name) + 6
        inside.append(x1 - x0 >= text_w)
        spans.append((x0, x1 if inside[-1] else x1 + 3 + text_w))
    fault_rows = _rows(spans)
    for w, row, fits in zip(windows, fault_rows, inside, strict=True):
        x0, x1 = x(w.start), max(x(w.end if w.end is not None else end), x(w.start) + 3)
        by = top + 4 + 18 * row
        until = "end" if w.end is None else f"{w.end:.3f}s"
        tip = f"{w.name}: {w.kind} {w.target or ''}, {w.start:.3f}s - {until}" + ("" if w.injected else " (not injected)")
        faint = "" if w.injected else " fill-opacity='0.4'"
        body.append(
            f"<rect class='fault' x='{x0:.1f}' y='{by:.1f}' width='{x1 - x0:.1f}' height='14' fill='{_FAULT}'{faint}>"
            f"<title>{_e(tip)}</title></rect>"
        )
        tx, color = (x0 + 3, "#fff") if fits else (x1 + 3, _FAULT)
        body.append(f"<text class='fault-label' x='{tx:.1f}' y='{by + 11:.1f}' fill='{color}'>{_e(w.name)}</text>")
    y = top + 4 + 18 * max(1, max(fault_rows, default=0) + 1) + 4
    sep(y)

    # processes
    outlines: dict[str, list[Any]] = {}
    for w in windows:
        if w.target is not None:
            outlines.setdefault(w.target, []).append(w)
    for name in processes:
        top = y
        lane_label(name, top, 23)
        bar = top + 14  # the lifetime bar: bar .. bar + 10
        for inc in h.incarnations(name):
            x0, x1 = x(inc.start), x(inc.end if inc.end is not None else end)
            body.append(
                f"<rect class='alive' x='{x0:.1f}' y='{bar:.1f}' width='{max(x1 - x0, 2):.1f}' height='10' fill='{_ALIVE}'>"
                f"<title>{_e(name)} #{inc.incarnation} pid {inc.pid} rc {inc.rc}</title></rect>"
            )
        for w in outlines.get(name, []):
            x0, x1 = x(w.start), x(w.end if w.end is not None else end)
            body.append(
                f"<rect class='fault-outline' x='{x0:.1f}' y='{bar - 3:.1f}' width='{max(x1 - x0, 3):.1f}' height='16' "
                f"fill='none' stroke='{_FAULT}' stroke-width='2'><title>{_e(w.name)} ({_e(w.kind)})</title></rect>"
            )
        dots: list[Entry] = []
        starts: dict[Any, float] = {}
        for entry in h.select(actor=name):
            if entry.f == "transfer_start":
                starts[entry.get("index")] = entry.t
            elif entry.f in ("transfer_done", "transfer_timeout", "transfer_error"):
                t0 = starts.pop(entry.get("index"), None)
                if t0 is not None:
                    c = _GREEN if entry.f == "transfer_done" else _RED
                    body.append(
                        f"<rect class='transfer' x='{x(t0):.1f}' y='{bar + 14:.1f}' width='{max(x(entry.t) - x(t0) - 1, 2):.1f}' "
                        f"height='4' fill='{c}'><title>transfer {entry.get('index')}: {entry.f} after {entry.t - t0:.3f}s"
                        "</title></rect>"
                    )
            if entry.f in _EVENT_STYLE:
                dots.append(entry)
            elif entry.f == "status_change":
                body.append(
                    f"<text class='status' x='{x(entry.t):.1f}' y='{bar - 4:.1f}' fill='{_STATUS}'>{_e(entry.get('status'))}"
                    f"<title>{entry.t:.3f}s status {_e(entry.get('status'))}</title></text>"
                )
            elif entry.f == "process_exit":
                body.append(
                    f"<text class='exit' x='{x(entry.t) - 3:.1f}' y='{bar + 9:.1f}' fill='{_RED}' font-weight='700'>x"
                    f"<title>{entry.t:.3f}s exit rc {_e(entry.get('rc'))}</title></text>"
                )
        dot_rows = _rows([(x(d.t) - 4.5, x(d.t) + 4.5) for d in dots], gap=1.0)
        for d, row in zip(dots, dot_rows, strict=True):
            c, text = _EVENT_STYLE[d.f]
            cy = bar + 5 if row == 0 else bar + 26 + 10 * (row - 1)
            if row:  # a stacked dot: a stem back to its time on the bar
                body.append(f"<line x1='{x(d.t):.1f}' x2='{x(d.t):.1f}' y1='{bar + 5:.1f}' y2='{cy:.1f}' stroke='{c}'/>")
            body.append(
                f"<circle class='event' cx='{x(d.t):.1f}' cy='{cy:.1f}' r='4' fill='{c}' stroke='#fff'>"
                f"<title>{d.t:.3f}s {_e(text)} {_e(json.dumps(dict(d.value), default=str)[:200])}</title></circle>"
            )
        y = top + 36 + 10 * max(0, max(dot_rows, default=0))
        sep(y)

    # checks: a numbered dot per mark; failed, then unknown, then passed take the first rows
    top = y
    lane_label("checks", top)
    placed = [(check, t, label) for check in _by_severity(checks) for t, label in check.marks]
    check_rows = _rows_in_order([(x(t) - 7, x(t) + 7) for _, t, _ in placed])
    for (check, t, label), row in zip(placed, check_rows, strict=True):
        color = _CHECK_COLORS.get(check.valid, _AMBER)
        cy = top + 14 + 16 * row
        body.append(
            f"<g class='check-mark' data-valid='{_valid_text(check.valid)}'><circle cx='{x(t):.1f}' cy='{cy:.1f}' r='7' "
            f"fill='{color}'/><text x='{x(t):.1f}' y='{cy + 3.5:.1f}' text-anchor='middle' fill='#fff' font-size='9'>"
            f"{check.index + 1}</text><title>{t:.3f}s #{check.index + 1} {_e(check.name)}: {_e(label)} ({_valid_text(check.valid)})"
            "</title></g>"
        )
    y = top + 28 + 16 * max(0, max(check_rows, default=0))
    sep(y)

    # fault shading across every lane, under everything else
    shade = "".join(
        f"<rect class='fault-shade' x='{x(a):.1f}' y='18' width='{max(x(b) - x(a), 2):.1f}' height='{y - 18:.1f}' "
        f"fill='{_FAULT}' fill-opacity='0.08'/>"
        for a, b in _union((w.start, w.end if w.end is not None else end) for w in windows)
    )
    height = y + 20
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' class='timeline' width='{_LEFT + _WIDTH + _RIGHT}' height='{height:.0f}'>"
        + axis.grid(18, y)
        + shade
        + axis.labels(12)
        + axis.labels(y + 14)
        + "".join(labels)
        + "".join(body)
        + "</svg>"
    )


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


def _severity(check: NamedResult) -> int:
    return 0 if check.valid is False else 2 if check.valid is True else 1


def _by_severity(checks: Iterable[NamedResult]) -> list[NamedResult]:
    """Failed checks first, then unknown, then passed; in scenario order within each."""
    return sorted(checks, key=lambda c: (_severity(c), c.index))


def _swatch(inner: str, w: int = 22, h: int = 14) -> str:
    return f"<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}'>{inner}</svg>"


def legend_html() -> str:
    """What every mark and colour on the timeline means (built from the same style tables)."""
    items = [
        (_swatch(f"<rect y='2' width='22' height='10' fill='{_ALIVE}'/>"), "process alive (start to exit)"),
        (_swatch(f"<text x='6' y='11' fill='{_RED}' font-weight='700'>x</text>"), "process exit"),
        (_swatch(f"<text x='0' y='11' fill='{_STATUS}' font-size='9'>RDY</text>", 24), "status change (text above the bar)"),
        (_swatch(f"<rect y='5' width='22' height='4' fill='{_GREEN}'/>"), "transfer, completed"),
        (_swatch(f"<rect y='5' width='22' height='4' fill='{_RED}'/>"), "transfer, timed out or failed"),
    ]
    by_color: dict[str, list[str]] = {}
    for color, text in _EVENT_STYLE.values():
        by_color.setdefault(color, []).append(text)
    for color, texts in by_color.items():
        items.append((_swatch(f"<circle cx='11' cy='7' r='4' fill='{color}'/>"), " / ".join(texts)))
    items += [
        (
            _swatch(f"<circle cx='6' cy='4' r='3' fill='{_GREY}'/><line x1='14' x2='14' y1='4' y2='11' stroke='{_GREY}'/>"
                    f"<circle cx='14' cy='11' r='3' fill='{_GREY}'/>"),
            "events at the same time: stacked below, stem to their time",
        ),
        (_swatch(f"<rect y='2' width='22' height='10' fill='{_FAULT}'/>"), "fault window (nemesis lane, a row per overlapping fault)"),
        (_swatch(f"<rect x='1' y='1' width='20' height='12' fill='none' stroke='{_FAULT}' stroke-width='2'/>"), "fault window on the process it hit"),
        (_swatch(f"<rect width='22' height='14' fill='{_FAULT}' fill-opacity='0.15'/>"), "some fault active (all lanes)"),
        (_swatch(f"<line x1='11' x2='11' y1='0' y2='14' stroke='{_STEP}' stroke-width='1.5'/>"), "step started (harness lane)"),
        (_swatch(f"<path d='M11 2 l4 5 l-4 5 l-4 -5 z' fill='{_PURPLE}'/>"), "mark, hang or await timeout (harness lane)"),
    ]
    for valid in (True, False, "unknown"):
        items.append(
            (_swatch(f"<circle cx='11' cy='7' r='6.5' fill='{_CHECK_COLORS[valid]}'/>"
                     "<text x='11' y='10' text-anchor='middle' fill='#fff' font-size='9'>n</text>"),
             f"check #n, {_valid_text(valid)}")
        )
    cells = "".join(f"<li>{sw}<span>{_e(text)}</span></li>" for sw, text in items)
    return f"<ul class='legend'>{cells}</ul>"


# ------------------------------------------------------------------------ metric charts


def _base(name: str) -> str:
    return name.removesuffix("_total")


def _series(h: History, chart: MetricChart, processes: Sequence[str]) -> dict[str, list[tuple[float, float]]]:
    """Per process: (t, summed value) of every successful scrape that had the metric."""
    wanted = {_base(n) for n in chart.names}
    out: dict[str, list[tuple[float, float]]] = {}
    for entry in h.select(f="scrape"):
        if entry.actor not in processes or not entry.get("ok"):
            continue
        total: float | None = None
        for sample in entry.get("samples") or ():
            name, _labels, value = sample
            if _base(str(name)) in wanted and isinstance(value, int | float) and math.isfinite(value):
                total = (total or 0.0) + float(value)
        if total is not None:
            out.setdefault(entry.actor, []).append((entry.t, total))
    return out


def _held_until(h: History, process: str, last_t: float) -> float:
    """When the value scraped last at ``last_t`` stopped holding: that incarnation's exit."""
    ends = [i.end if i.end is not None else h.end for i in h.incarnations(process) if i.start <= last_t]
    return max(ends[-1], last_t) if ends else last_t


def _human(value: float, unit: str) -> str:
    if unit == "bytes":
        for scale, suffix in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
            if abs(value) >= scale:
                return f"{value / scale:.3g} {suffix}"
        return f"{value:.0f} B"
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.3g}"


def _chart_svg(
    chart: MetricChart,
    series: Mapping[str, list[tuple[float, float]]],
    until: Mapping[str, float],
    colors: Mapping[str, str],
    axis: _Axis,
) -> str:
    plot_top, plot_h = 8.0, 64.0
    peak = max((v for points in series.values() for _, v in points), default=0.0)
    top_value = 1.0 if chart.unit == "flag" or peak <= 0 else peak

    def y(v: float) -> float:
        return plot_top + plot_h - (v / top_value) * plot_h

    out = [axis.grid(plot_top, plot_top + plot_h)]
    out.append(
        f"<line x1='{_LEFT}' x2='{_LEFT + _WIDTH}' y1='{plot_top + plot_h}' y2='{plot_top + plot_h}' stroke='{_AXIS}'/>"
        f"<text x='{_LEFT - 6}' y='{plot_top + 4}' text-anchor='end' fill='{_AXIS}'>{_e(_human(top_value, chart.unit))}</text>"
        f"<text x='{_LEFT - 6}' y='{plot_top + plot_h}' text-anchor='end' fill='{_AXIS}'>0</text>"
    )
    for i, (process, points) in enumerate(series.items()):
        nudge = -1.5 * i  # equal values of several processes stay visible as parallel lines
        d = [f"M{axis.x(points[0][0]):.1f} {y(points[0][1]) + nudge:.1f}"]
        for t, v in points[1:]:
            d.append(f"H{axis.x(t):.1f} V{y(v) + nudge:.1f}")
        last_t, last_v = points[-1]
        d.append(f"H{axis.x(until[process]):.1f}")
        tip = f"{process}: {_human(last_v, chart.unit)} at {last_t:.3f}s (last scrape), {len(points)} scrape(s)"
        out.append(
            f"<path class='series' data-process='{_e(process)}' d='{' '.join(d)}' fill='none' stroke='{colors[process]}' "
            f"stroke-width='2'><title>{_e(tip)}</title></path>"
        )
        for t, v in points:
            out.append(
                f"<circle cx='{axis.x(t):.1f}' cy='{y(v) + nudge:.1f}' r='1.8' fill='{colors[process]}'>"
                f"<title>{_e(process)} {t:.3f}s: {_e(_human(v, chart.unit))}</title></circle>"
            )
    out.append(axis.labels(plot_top + plot_h + 14))
    height = plot_top + plot_h + 20
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' class='chart' width='{_LEFT + _WIDTH + _RIGHT}' height='{height:.0f}'>"
        + "".join(out)
        + "</svg>"
    )


def metric_charts(h: History, processes: Sequence[str], charts: Sequence[MetricChart] = METRIC_CHARTS) -> str:
    """A step chart per metric of ``charts`` that some process reported, one line per
    process, on the timeline's time axis; empty when nothing was scraped."""
    axis = _Axis.of(max(h.end, 1e-3))
    colors = {p: _SERIES[i % len(_SERIES)] for i, p in enumerate(processes)}
    parts = []
    for chart in charts:
        series = _series(h, chart, processes)
        if not series:
            continue
        ordered = {p: series[p] for p in processes if p in series}
        until = {p: _held_until(h, p, points[-1][0]) for p, points in ordered.items()}
        keys = "".join(
            f"<span class='key'><svg xmlns='http://www.w3.org/2000/svg' width='14' height='4'><rect width='14' height='4' "
            f"fill='{colors[p]}'/></svg>{_e(p)}</span>"
            for p in ordered
        )
        names = " / ".join(chart.names)
        parts.append(
            f"<figure class='metric' data-metric='{_e(chart.names[0])}'><figcaption><b>{_e(chart.title)}</b> "
            f"<code>{_e(names)}</code> {keys}</figcaption>{_chart_svg(chart, ordered, until, colors, axis)}</figure>"
        )
    if not parts:
        return ""
    return (
        "<h2>Metrics</h2><p class='note'>As scraped from each process's /metrics (summed over labels), held "
        "until the next scrape or the process's exit; dots are scrapes; same time axis as the timeline.</p>" + "".join(parts)
    )


# ------------------------------------------------------------------------ page

_CSS = (
    "body{font:14px system-ui,sans-serif;margin:24px;color:#1f2328}"
    "table{border-collapse:collapse;margin:8px 0 20px}td,th{border:1px solid #d0d7de;padding:4px 8px;"
    "text-align:left;vertical-align:top}th{background:#f6f8fa}.badge{color:#fff;padding:2px 10px;"
    "border-radius:10px;font-weight:600}code,pre{font:12px ui-monospace,monospace}pre{white-space:pre-wrap}"
    "svg text{font:11px system-ui,sans-serif}svg text.lane{font-weight:600}"
    "tr.fail td{background:#ffebe9}tr.unknown td{background:#fff8c5}"
    ".why{border-left:4px solid #cf222e;padding:4px 10px;margin:8px 0 16px;background:#fff5f5}"
    ".why li{margin:2px 0}.note{color:#57606a;margin:4px 0}"
    ".legend{list-style:none;padding:0;margin:4px 0 20px;display:flex;flex-wrap:wrap;gap:4px 18px;font-size:12px}"
    ".legend li{display:flex;align-items:center;gap:6px}"
    "figure.metric{margin:6px 0}figcaption{font-size:12px}.key{margin-left:12px;display:inline-flex;"
    "align-items:center;gap:4px}"
)


def _check_rows(checks: Sequence[NamedResult]) -> str:
    rows = []
    for check in _by_severity(checks):
        c = _CHECK_COLORS.get(check.valid, _AMBER)
        cls = {True: "pass", False: "fail"}.get(check.valid, "unknown") if isinstance(check.valid, bool) else "unknown"
        details = ""
        if check.valid is not True and check.details:
            details = (
                "<details><summary>details</summary><pre>"
                + _e(json.dumps(dict(check.details), default=str, indent=1)[:4000])
                + "</pre></details>"
            )
        rows.append(
            f"<tr class='{cls}'><td>{check.index + 1}</td><td>{_e(check.name)}</td>"
            f"<td style='color:{c};font-weight:600'>{_valid_text(check.valid)}</td><td>{_e(check.summary)}{details}</td></tr>"
        )
    return "".join(rows)


def _why(result: RunResult) -> str:
    """Right under the badge: what went wrong, so no one has to scroll for it."""
    bad = [c for c in _by_severity(result.checks) if c.valid is not True]
    items = []
    if result.reason:
        items.append(f"<li><b>{_e(result.status)}</b>: {_e(result.reason)}</li>")
    for c in bad:
        items.append(f"<li><b>{_valid_text(c.valid)}</b> #{c.index + 1} {_e(c.name)}: {_e(c.summary)}</li>")
    if not items:
        return ""
    head = f"{len(bad)} of {len(result.checks)} checks did not pass" if bad else "the run did not complete"
    return f"<div class='why'><b>{_e(head)}</b><ul>{''.join(items)}</ul></div>"


def render_html(result: RunResult, versions: dict[str, Any] | None = None) -> str:
    """The whole page of one run, self-contained."""
    h = result.history
    sc = result.scenario
    versions = versions or {}
    color = _VERDICT_COLORS.get(result.verdict, _GREY)
    processes = list(sc.processes)
    passed = sum(1 for c in result.checks if c.valid is True)
    crashed = f" <span class='badge' style='background:{_RED}'>CRASHED</span>" if result.status == "crashed" else ""
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{_e(sc.name)}: {_e(result.verdict.upper())}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{_e(sc.name)} <span class='badge' style='background:{color}'>{_e(result.verdict.upper())}</span>{crashed}</h1>",
        f"<p>{_e(sc.description)}</p>" if sc.description else "",
    ]
    if result.known_defect:
        note = {
            "xfail": "The known defect reproduced; the failures below are expected.",
            "xpass": "<b>Every check passed: the known defect did not reproduce in this run. One run cannot call it "
            "fixed: <code>mxchaos run --repeat N</code> does, once its confidence bound falls below the measured rate.</b>",
        }.get(result.verdict, "")
        parts.append(
            f"<p style='border-left:4px solid {color};padding-left:8px'><b>Known defect</b>: "
            f"{_e(result.known_defect)}<br>{note}</p>"
        )
    parts.append(_why(result))
    parts.append(f"<h2>Checks <small>({passed}/{len(result.checks)} passed)</small></h2>")
    if result.checks:
        parts.append("<table class='checks'><tr><th>#</th><th>check</th><th>verdict</th><th>summary</th></tr>")
        parts.append(_check_rows(result.checks) + "</table>")
    else:
        parts.append("<p class='note'>No check was judged.</p>")
    facts = [
        ("run id", result.run_id),
        ("seed", result.seed),
        ("started", result.started_at),
        ("duration", f"{result.seconds:.3f}s"),
        ("references", ", ".join(sc.references) or "-"),
        ("transport", sc.transport or ("auto: ucx-tcp-any (netns hosts)" if sc.netns_hosts() else "auto: ucx-tcp")),
        ("NIXL", versions.get("nixl")),
        ("UCX", versions.get("ucx")),
        ("torch", versions.get("torch")),
        ("Python", versions.get("python")),
        ("host", (versions.get("host") or {}).get("hostname")),
    ]
    parts.append("<h2>Timeline <small>(time in seconds since the run started)</small></h2>")
    parts.append(timeline_svg(h, processes, result.checks))
    parts.append(legend_html())
    parts.append(metric_charts(h, processes))
    parts.append("<h2>Run</h2><table>" + "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in facts) + "</table>")
    parts.append(_steps_table(h))
    parts.append(_faults_table(h))
    parts.append(_processes_table(h, sc.roles()))
    if result.stacks:
        parts.append("<h2>Stacks</h2><ul>")
        for name, path in result.stacks.items():
            parts.append(f"<li><a href='{_e(path)}'>{_e(name)}</a></li>")
        parts.append("</ul>")
    parts.append("<h2>Files</h2><ul>")
    for name in ("scenario.yaml", "timeline.jsonl", "metrics.jsonl", "verdict.json", "junit.xml", "versions.json"):
        parts.append(f"<li><a href='{name}'>{name}</a></li>")
    parts.append("</ul>")
    parts.append("<details><summary>All events (without scrapes)</summary><table>")
    parts.append("<tr><th>t</th><th>actor</th><th>type</th><th>f</th><th>value</th></tr>")
    for entry in h:
        if entry.f == "scrape":
            continue
        value = json.dumps({k: v for k, v in entry.value.items() if k != "argv"}, default=str)
        parts.append(
            f"<tr><td>{entry.t:.3f}</td><td>{_e(entry.actor)}</td><td>{_e(entry.type)}</td>"
            f"<td>{_e(entry.f)}</td><td><code>{_e(value[:400])}</code></td></tr>"
        )
    parts.append("</table></details></body></html>")
    return "".join(parts)


def _table(title: str, head: Sequence[str], rows: Iterable[str]) -> str:
    return f"<h2>{_e(title)}</h2><table><tr>" + "".join(f"<th>{_e(c)}</th>" for c in head) + "</tr>" + "".join(rows) + "</table>"


def _steps_table(h: History) -> str:
    rows = []
    opened: dict[str, Entry] = {}
    for entry in h.select(actor="harness", f="step"):
        sid = str(entry.get("step"))
        if entry.type == "invoke":
            opened[sid] = entry
            continue
        start = opened.pop(sid, None)
        took = f"{entry.t - start.t:.3f}s" if start else "?"
        outcome = entry.type + (" (indeterminate)" if entry.get("indeterminate") else "")
        rows.append(
            f"<tr><td>{_e(sid)}</td><td>{_e(entry.get('text'))}</td><td>{start.t if start else 0:.3f}</td>"
            f"<td>{took}</td><td>{_e(outcome)}</td><td>{_e(entry.get('error', ''))}</td></tr>"
        )
    for sid, start in opened.items():
        rows.append(f"<tr><td>{_e(sid)}</td><td>{_e(start.get('text'))}</td><td>{start.t:.3f}</td><td>-</td><td>not finished</td><td></td></tr>")
    return _table("Steps", ("step", "action", "t (s)", "took", "outcome", "error"), rows)


def _faults_table(h: History) -> str:
    windows = h.fault_windows()
    if not windows:
        return ""
    rows = (
        f"<tr><td>{_e(w.name)}</td><td>{_e(w.kind)}</td><td>{_e(w.target or '')}</td><td>{w.start:.3f}</td>"
        f"<td>{'-' if w.end is None else f'{w.end:.3f}'}</td><td>{'yes' if w.injected else 'no'}</td></tr>"
        for w in windows
    )
    return _table("Faults", ("fault", "kind", "target", "from (s)", "until (s)", "injected"), rows)


def _processes_table(h: History, roles: dict[str, str]) -> str:
    rows = []
    for name, role in roles.items():
        incs = h.incarnations(name)
        desc = "; ".join(
            f"#{i.incarnation} pid {i.pid}: {i.start:.3f}-{'?' if i.end is None else f'{i.end:.3f}'}s rc {i.rc}"
            + (" (stopped)" if i.stopped_by_harness else "")
            for i in incs
        )
        links = f"<a href='procs/{_e(name)}.log'>log</a>"
        if role != "command":
            links += f" <a href='procs/{_e(name)}.events.jsonl'>events</a>"
        rows.append(f"<tr><td>{_e(name)}</td><td>{_e(role)}</td><td>{_e(desc or 'never started')}</td><td>{links}</td></tr>")
    return _table("Processes", ("process", "role", "incarnations", "files"), rows)

