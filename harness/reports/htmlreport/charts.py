"""The metric charts of the HTML report: step charts of scraped metrics on the timeline's axis.

Which metrics are charted is the ``METRIC_CHARTS`` table just below; ``metric_charts``
draws one chart per metric that some process reported, one line per process.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from harness.record.timeline import History
from harness.reports.htmlreport.axis import _Axis
from harness.reports.htmlreport.lanes import scrape_gaps
from harness.reports.htmlreport.style import _AXIS, _LEFT, _RIGHT, _SERIES, _WIDTH, _e


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


def _held(holes: Sequence[tuple[float, float]], t0: float, t1: float) -> float:
    """How far a value scraped at ``t0`` holds toward ``t1``: to the first failed scrape after it."""
    return min([t1, *(a for a, _ in holes if t0 <= a < t1)])


def _chart_svg(
    chart: MetricChart,
    series: Mapping[str, list[tuple[float, float]]],
    until: Mapping[str, float],
    colors: Mapping[str, str],
    axis: _Axis,
    gaps: Mapping[str, list[tuple[float, float]]],
) -> str:
    plot_top, plot_h = 8.0, 64.0
    peak = max((v for points in series.values() for _, v in points), default=0.0)
    top_value = 1.0 if chart.unit == "flag" or peak <= 0 else peak

    def y(v: float) -> float:
        return plot_top + plot_h - (v / top_value) * plot_h

    out = [_GAP_DEFS, axis.grid(plot_top, plot_top + plot_h)]
    out.append(
        f"<line x1='{_LEFT}' x2='{_LEFT + _WIDTH}' y1='{plot_top + plot_h}' y2='{plot_top + plot_h}' stroke='{_AXIS}'/>"
        f"<text x='{_LEFT - 6}' y='{plot_top + 4}' text-anchor='end' fill='{_AXIS}'>{_e(_human(top_value, chart.unit))}</text>"
        f"<text x='{_LEFT - 6}' y='{plot_top + plot_h}' text-anchor='end' fill='{_AXIS}'>0</text>"
    )
    for i, (process, points) in enumerate(series.items()):
        nudge = -1.5 * i  # equal values of several processes stay visible as parallel lines
        holes = gaps.get(process, [])
        for a, b in holes:  # no value is known here: the line stops, a hatched band says why
            out.append(
                f"<rect class='gap' data-process='{_e(process)}' x='{axis.x(a):.1f}' y='{plot_top:.1f}' "
                f"width='{max(axis.x(b) - axis.x(a), 2):.1f}' height='{plot_h}' fill='url(#not-scraped)' "
                f"stroke='{colors[process]}' stroke-dasharray='2 2' stroke-width='0.8'>"
                f"<title>{_e(process)} could not be scraped {a:.3f}s - {b:.3f}s (no value shown)</title></rect>"
            )

        d = [f"M{axis.x(points[0][0]):.1f} {y(points[0][1]) + nudge:.1f}"]
        for (t0, _v0), (t, v) in itertools.pairwise(points):
            stop = _held(holes, t0, t)
            d.append(f"H{axis.x(stop):.1f} " + (f"V{y(v) + nudge:.1f}" if stop >= t else f"M{axis.x(t):.1f} {y(v) + nudge:.1f}"))
        last_t, last_v = points[-1]
        d.append(f"H{axis.x(_held(holes, last_t, until[process])):.1f}")
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
    w = _LEFT + _WIDTH + _RIGHT
    return (
        f"<div class='fig'><svg xmlns='http://www.w3.org/2000/svg' class='chart' viewBox='0 0 {w} {height:.0f}' width='{w}' "
        f"height='{height:.0f}' preserveAspectRatio='xMinYMin meet'>" + "".join(out) + "</svg></div>"
    )


_GAP_DEFS = (
    "<defs><pattern id='not-scraped' width='5' height='5' patternUnits='userSpaceOnUse' patternTransform='rotate(-45)'>"
    "<line x1='0' y1='0' x2='0' y2='5' stroke='#afb8c1' stroke-width='1.5'/></pattern></defs>"
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
        gaps = {p: scrape_gaps(h, p) for p in ordered}
        keys = "".join(
            f"<span class='key'><svg xmlns='http://www.w3.org/2000/svg' width='14' height='4'><rect width='14' height='4' "
            f"fill='{colors[p]}'/></svg>{_e(p)}</span>"
            for p in ordered
        )
        names = " / ".join(chart.names)
        parts.append(
            f"<figure class='metric' data-metric='{_e(chart.names[0])}'><figcaption><b>{_e(chart.title)}</b> "
            f"<code>{_e(names)}</code> {keys}</figcaption>{_chart_svg(chart, ordered, until, colors, axis, gaps)}</figure>"
        )
    if not parts:
        return ""
    return (
        "<h2>Metrics</h2><p class='note'>As scraped from each process's /metrics (summed over labels), held "
        "until the next scrape or the process's exit; dots are scrapes; a hatched band: the process could not be scraped "
        "there (no value is drawn, not the last one held); same time axis as the timeline.</p>" + "".join(parts)
    )
