"""``soak.html``: one static page (inline CSS and SVG, no script) of a soak's record and summary.

The verdict (the report's palette: colour and glyph), the figures (transfers, transfers/s, failed
loads, segments), each growth named with its rate, then one chart per resource: transfers on the
x axis (its ticks ``nice_ticks``), a line per process in the report's series colours, and a table
of every series' verdict and slope with its interval.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from harness.reports.htmlreport.axis import nice_ticks
from harness.reports.htmlreport.palette import glyph_badge, swatch
from harness.reports.htmlreport.style import _AXIS, _SERIES
from harness.soak.slope import Point
from harness.soak.verdict import growth_text, series_of

__all__ = ["render_page"]

CSS = """
body{font:14px system-ui,sans-serif;margin:16px;color:#222;max-width:1100px}
table{border-collapse:collapse}td,th{border:1px solid #999;padding:3px 6px;text-align:right}
th{background:#f2f2f2}td.l,th.l{text-align:left}.small{font-size:12px;color:#444}
.verdict{color:#fff;border-radius:4px;padding:2px 8px;font-weight:bold}
.growth{background:#ffebe9;border:2px solid #cf222e;padding:6px 10px;margin:6px 0}
svg text{font:11px system-ui,sans-serif}
"""
_W, _H, _LEFT, _TOP, _PLOT_W, _PLOT_H = 760, 190, 70, 10, 560, 140


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _chart(resource: str, lines: Mapping[str, list[Point]], rows: Mapping[str, Mapping[str, Any]]) -> str:
    xs = [p.transfers for pts in lines.values() for p in pts]
    ys = [p.value for pts in lines.values() for p in pts]
    if not xs:
        return ""
    _step, ticks = nice_ticks(max(xs) or 1)
    x_end = ticks[-1] or 1
    lo, hi = min(ys), max(ys)
    if hi == lo:
        lo, hi = lo - 1, hi + 1

    def x(v: float) -> float:
        return _LEFT + v / x_end * _PLOT_W

    def y(v: float) -> float:
        return _TOP + _PLOT_H - (v - lo) / (hi - lo) * _PLOT_H

    out = [f"<line x1='{_LEFT}' x2='{_LEFT + _PLOT_W}' y1='{_TOP + _PLOT_H}' y2='{_TOP + _PLOT_H}' stroke='{_AXIS}'/>",
           f"<text x='{_LEFT - 4}' y='{_TOP + 8}' text-anchor='end' fill='{_AXIS}'>{hi:g}</text>",
           f"<text x='{_LEFT - 4}' y='{_TOP + _PLOT_H}' text-anchor='end' fill='{_AXIS}'>{lo:g}</text>"]
    for t in ticks:
        out.append(f"<line x1='{x(t):.1f}' x2='{x(t):.1f}' y1='{_TOP}' y2='{_TOP + _PLOT_H}' stroke='#eaeef2'/>"
                   f"<text x='{x(t):.1f}' y='{_TOP + _PLOT_H + 14}' text-anchor='middle' fill='{_AXIS}'>{t:g}</text>")
    legend_y = _TOP + 10
    for i, (process, pts) in enumerate(lines.items()):
        color = _SERIES[i % len(_SERIES)]
        verdict = rows.get(process, {}).get("verdict", "")
        d = " ".join(f"{'M' if j == 0 or pts[j - 1].segment != p.segment else 'L'}{x(p.transfers):.1f} {y(p.value):.1f}"
                     for j, p in enumerate(pts))
        out.append(f"<path d='{d}' fill='none' stroke='{color}' stroke-width='1.6'>"
                   f"<title>{_e(process)} {_e(resource)}: {_e(verdict)}</title></path>")
        look = swatch({"grows": "fail", "flat": "pass"}.get(verdict, "unknown"))
        out.append(f"<text x='{_LEFT + _PLOT_W + 10}' y='{legend_y + 14 * i}' fill='{color}'>{_e(process)} "
                   f"<tspan fill='{look.strong}'>{look.glyph} {_e(verdict)}</tspan></text>")
    out.append(f"<text x='{_LEFT + _PLOT_W / 2}' y='{_H - 4}' text-anchor='middle' fill='{_AXIS}'>transfers</text>")
    return (f"<h3>{_e(resource)}</h3><svg xmlns='http://www.w3.org/2000/svg' width='{_W}' height='{_H}' "
            f"viewBox='0 0 {_W} {_H}'>" + "".join(out) + "</svg>")


def _table(summary: Mapping[str, Any]) -> str:
    head = ("<tr><th class='l'>process</th><th class='l'>resource</th><th class='l'>verdict</th><th>first</th>"
            "<th>last</th><th>slope / 1000</th><th>95% interval</th><th>flat if &le;</th><th>points</th></tr>")
    rows = []
    for process, resources in summary["series"].items():
        for resource, row in resources.items():
            s = row.get("slope")
            look = swatch({"grows": "fail", "flat": "pass"}.get(row["verdict"], "unknown"))
            rows.append(
                f"<tr><td class='l'>{_e(process)}</td><td class='l'>{_e(resource)}</td>"
                f"<td class='l' style='color:{look.strong}'>{look.glyph} {_e(row['verdict'])}</td>"
                f"<td>{row['first']:g}</td><td>{row['last']:g}</td>"
                f"<td>{'' if s is None else format(s['per_1000'], '+.2f')}</td>"
                f"<td>{'' if s is None else format(s['lo'], '+.2f') + ' .. ' + format(s['hi'], '+.2f')}</td>"
                f"<td>{row['limit_per_1000']:g}</td><td>{row['points']}</td></tr>")
    return "<table>" + head + "".join(rows) + "</table>"


def render_page(summary: Mapping[str, Any], samples: Sequence[Any], title: str = "mxchaos soak") -> str:
    verdict = summary["verdict"]
    badge = glyph_badge({"flat": "pass", "grows": "fail", "error": "error", "failed_loads": "fail"}.get(verdict, "unknown"),
                        _e(verdict.upper()))
    figures = (f"{summary['transfers']} transfers in {summary['seconds']:g} s "
               f"({summary['transfers_per_s']} /s), {summary['failed_loads']} failed loads, "
               f"{summary['segments']} segment(s), warm-up {summary['warmup_transfers']} transfers per segment")
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(title)}</title><style>{CSS}</style></head><body>",
             f"<h1>{_e(title)} {badge}</h1><p>{_e(figures)}</p>"]
    if summary.get("error"):
        parts.append(f"<p class='growth'>error: {_e(summary['error'])}</p>")
    for g in summary["growths"]:
        parts.append(f"<p class='growth'>{_e(growth_text(g))}</p>")
    untrusted = [p for p, row in summary["audit_crosscheck"].items() if not row["trusted"]]
    if untrusted:
        parts.append(f"<p class='growth'>the NIXL audit of {_e(', '.join(untrusted))} did not keep up with the loads "
                     "the harness counted: its nixl_* series are not judged</p>")
    by_resource: dict[str, dict[str, list[Point]]] = {}
    for process, resources in series_of(samples).items():
        for resource, points in resources.items():
            by_resource.setdefault(resource, {})[process] = points
    for resource, lines in by_resource.items():
        rows = {p: summary["series"].get(p, {}).get(resource, {}) for p in lines}
        parts.append(_chart(resource, lines, rows))
    parts.append("<h2>Every series</h2>" + _table(summary))
    parts.append("<p class='small'>slopes: least squares over the samples past each segment's warm-up, an intercept "
                 "per segment; interval: 95 % (Student's t). samples.jsonl holds every sample; soak-result.json this "
                 "page's figures.</p></body></html>")
    return "".join(parts)
