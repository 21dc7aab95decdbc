"""The timeline of the HTML report (``timeline_svg``) and its legend (``legend_html``).

A lane per process plus harness, nemesis and checks, on the time axis of ``axis``, in
inline SVG; the legend is built from the same style tables, so every mark and colour on
the timeline is named.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from harness.checks import NamedResult
from harness.record.timeline import Entry, History
from harness.reports.htmlreport.axis import _Axis, _rows, _rows_in_order, _union
from harness.reports.htmlreport.lanes import PHASES, Attempt, attempts, host_hit, interrupt_at, server_view
from harness.reports.htmlreport.palette import NOT_JUDGED, swatch
from harness.reports.htmlreport.style import (
    _ALIVE,
    _CHAR_W,
    _EVENT_STYLE,
    _FAULT,
    _GREEN,
    _GREY,
    _LEFT,
    _ORANGE,
    _PURPLE,
    _RED,
    _RIGHT,
    _STATUS,
    _STEP,
    _WIDTH,
    _by_severity,
    _e,
    _valid_text,
)


def timeline_svg(h: History, processes: Iterable[str], checks: Sequence[NamedResult] = (),
                 host_of: Mapping[str, str] | None = None, interrupted: bool = False,
                 window: tuple[float, float] | None = None) -> str:
    """A lane per process (plus harness, nemesis and checks) on a time axis in seconds.

    Faults: one row each in the nemesis lane (overlapping windows stacked), the time any
    fault is active shaded across all lanes, each window outlined on its target's lane, and
    dashed on every process of a host it hit (``host_of``: process -> host). Processes:
    lifetime bars; status changes as text (the process's own word) and, for a source, the
    server's view of it as a band under the bar; a reader's attempts as labelled bars (index,
    source, outcome; failed ones hatched) in rows of their own, each over a strip of its load
    phases; transfers as thin bars where no attempt was recorded; outcomes as dots (coincident
    dots stacked). Checks: a numbered dot per mark, failures on top; ``interrupted``: checks that
    did not pass are NOT JUDGED, and the interrupt is a line across every lane. ``window``: a
    zoomed view of ``[t0, t1]`` only (``zoom_window``); what lies outside it is left out."""
    processes = list(processes)
    end = max(h.end, 1e-3)
    axis = _Axis.of(end) if window is None else _Axis.between(*window)
    x = axis.x

    def seen(a: float, b: float | None = None) -> bool:  # a moment, or a span, on this axis
        return axis.shows(a) if b is None else not (b < axis.start or a > axis.end)

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
        if not seen(entry.t):
            continue
        body.append(
            f"<line class='step' x1='{x(entry.t):.1f}' x2='{x(entry.t):.1f}' y1='{top + 4:.1f}' y2='{top + 18:.1f}' stroke='{_STEP}' "
            f"stroke-width='1.5'><title>{entry.t:.3f}s step {_e(entry.get('step'))}: {_e(entry.get('text'))}</title></line>"
        )
    marks = [m for m in h.select(actor="harness", f=("mark", "hang", "await_timeout")) if seen(m.t)]
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
    windows = [w for w in h.fault_windows() if seen(w.start, w.end if w.end is not None else end)]
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
    on_host = host_hit(windows, host_of or {})
    views = server_view(h, processes)
    for name in processes:
        top = y
        lane_label(name, top, 23)
        bar = top + 14  # the lifetime bar: bar .. bar + 10
        for inc in h.incarnations(name):
            if not seen(inc.start, inc.end if inc.end is not None else end):
                continue
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
        for w in on_host.get(name, []):
            x0, x1 = x(w.start), x(w.end if w.end is not None else end)
            body.append(
                f"<rect class='host-fault' data-fault='{_e(w.name)}' x='{x0:.1f}' y='{bar - 3:.1f}' width='{max(x1 - x0, 3):.1f}' "
                f"height='16' fill='none' stroke='{_FAULT}' stroke-width='1.5' stroke-dasharray='4 2'>"
                f"<title>{_e(w.name)} ({_e(w.kind)}) on host {_e(w.value.get('host'))}, where {_e(name)} runs</title></rect>"
            )
        below = bar + 12
        if name in views:
            below = _server_band(body, views[name], axis, end, bar + 11) + 1
        tried = [a for a in attempts(h, name) if seen(a.start, a.end if a.end is not None else end)]
        rows_used = _attempt_rows(body, tried, axis, end, below) if tried else 0
        extra = (below - (bar + 12)) + 22 * rows_used
        dots: list[Entry] = []
        starts: dict[Any, float] = {}
        for entry in h.select(actor=name):
            if entry.f == "transfer_start":
                starts[entry.get("index")] = entry.t
            elif entry.f in ("transfer_done", "transfer_timeout", "transfer_error"):
                t0 = starts.pop(entry.get("index"), None)
                if t0 is not None and not tried and seen(t0, entry.t):  # an attempt's READ phase shows its transfer
                    c = _GREEN if entry.f == "transfer_done" else _RED
                    body.append(
                        f"<rect class='transfer' x='{x(t0):.1f}' y='{bar + 14:.1f}' width='{max(x(entry.t) - x(t0) - 1, 2):.1f}' "
                        f"height='4' fill='{c}'><title>transfer {entry.get('index')}: {entry.f} after {entry.t - t0:.3f}s"
                        "</title></rect>"
                    )
            if not seen(entry.t):
                continue
            if entry.f in _EVENT_STYLE:
                dots.append(entry)
            elif entry.f == "status_change":
                body.append(
                    f"<text class='status' x='{x(entry.t):.1f}' y='{bar - 4:.1f}' fill='{_STATUS}'>{_e(entry.get('status'))}"
                    f"<title>{entry.t:.3f}s status {_e(entry.get('status'))} (as the process said)</title></text>"
                )
            elif entry.f == "process_exit":
                body.append(
                    f"<text class='exit' x='{x(entry.t) - 3:.1f}' y='{bar + 9:.1f}' fill='{_RED}' font-weight='700'>x"
                    f"<title>{entry.t:.3f}s exit rc {_e(entry.get('rc'))}</title></text>"
                )
        dot_rows = _rows([(x(d.t) - 4.5, x(d.t) + 4.5) for d in dots], gap=1.0)
        for d, row in zip(dots, dot_rows, strict=True):
            c, text = _EVENT_STYLE[d.f]
            cy = bar + 5 if row == 0 else bar + 26 + extra + 10 * (row - 1)
            if row:  # a stacked dot: a stem back to its time on the bar
                body.append(f"<line class='stem' x1='{x(d.t):.1f}' x2='{x(d.t):.1f}' y1='{bar + 5:.1f}' y2='{cy:.1f}' stroke='{c}'/>")
            body.append(
                f"<circle class='event' cx='{x(d.t):.1f}' cy='{cy:.1f}' r='4' fill='{c}' stroke='#fff'>"
                f"<title>{d.t:.3f}s {_e(text)} {_e(json.dumps(dict(d.value), default=str)[:200])}</title></circle>"
            )
        y = top + 36 + extra + 10 * max(0, max(dot_rows, default=0))
        sep(y)

    # checks: a numbered dot per mark; failed, then unknown, then passed take the first rows
    top = y
    lane_label("checks", top)
    placed = [(check, t, label) for check in _by_severity(checks) for t, label in check.marks if seen(t)]
    check_rows = _rows_in_order([(x(t) - 7, x(t) + 7) for _, t, _ in placed])
    for (check, t, label), row in zip(placed, check_rows, strict=True):
        word = _valid_text(check.valid, interrupted, check.not_judged)
        color = swatch(word).strong
        cy = top + 14 + 16 * row
        body.append(
            f"<g class='check-mark' data-valid='{word}'>{_check_shape(word, x(t), cy, color)}"
            f"<text x='{x(t):.1f}' y='{cy + 3.5:.1f}' text-anchor='middle' fill='#fff' font-size='9'>"
            f"{check.index + 1}</text><title>{t:.3f}s #{check.index + 1} {_e(check.name)}: {_e(label)} ({word})"
            "</title></g>"
        )
    y = top + 28 + 16 * max(0, max(check_rows, default=0))
    y = _brackets(body, checks, axis, y, interrupted)
    sep(y)
    cut = interrupt_at(h)
    if cut is not None and seen(cut):
        body.append(
            f"<g class='interrupt'><line x1='{x(cut):.1f}' x2='{x(cut):.1f}' y1='18' y2='{y:.1f}' stroke='{_INTERRUPT}' "
            f"stroke-width='2' stroke-dasharray='6 3'/><text x='{x(cut) + 4:.1f}' y='30' fill='{_INTERRUPT}' "
            f"font-weight='700'>interrupted</text><title>{cut:.3f}s the harness was interrupted: faults healed, "
            "processes stopped; later steps never ran</title></g>"
        )

    # fault shading across every lane, under everything else
    shade = "".join(
        f"<rect class='fault-shade' x='{x(a):.1f}' y='18' width='{max(x(b) - x(a), 2):.1f}' height='{y - 18:.1f}' "
        f"fill='{_FAULT}' fill-opacity='0.08'/>"
        for a, b in _union((w.start, w.end if w.end is not None else end) for w in windows)
    )
    height = y + 20
    return (
        _svg_open("timeline", height)
        + _DEFS
        + axis.grid(18, y)
        + shade
        + axis.labels(12)
        + axis.labels(y + 14)
        + "".join(labels)
        + "".join(body)
        + "</svg>"
    )


_PHASE_COLORS = {"allocate": "#d4a72c", "register": "#bf3989", "handshake": "#1b7c83", "read": "#0969da",
                 "verify": "#1a7f37"}
_OTHER_PHASE = "#afb8c1"
_SERVER_COLORS = {"READY": _GREEN, "STALE": _ORANGE, "INITIALIZING": _GREY}
_INTERRUPT = "#24292f"
_DARK_RED = "#82071e"
# a failed attempt is hatched (a shape, not only a colour)
_DEFS = (
    "<defs><pattern id='hatch-fail' width='6' height='6' patternUnits='userSpaceOnUse' patternTransform='rotate(45)'>"
    f"<rect width='6' height='6' fill='{swatch('fail').light}'/><line x1='0' y1='0' x2='0' y2='6' stroke='{_RED}' "
    "stroke-width='2'/></pattern></defs>"
)


def _svg_open(cls: str, height: float) -> str:
    """An SVG that scales to its container (the page reflows; text stays legible down to ~640 px)."""
    w = _LEFT + _WIDTH + _RIGHT
    return (f"<svg xmlns='http://www.w3.org/2000/svg' class='{cls}' viewBox='0 0 {w} {height:.0f}' "
            f"width='{w}' height='{height:.0f}' preserveAspectRatio='xMinYMin meet'>")


def zoom_window(h: History, share: float = 0.5) -> tuple[float, float] | None:
    """The span a zoomed view of the fault windows shows: from the first injection to the last
    heal, padded (a sixth of it, at least 0.25 s, each side); None when there is no fault or
    the span is no smaller than ``share`` of the run (the whole timeline shows it well)."""
    end = max(h.end, 1e-3)
    windows = h.fault_windows()
    if not windows:
        return None
    a = min(w.start for w in windows)
    b = max(w.end if w.end is not None else end for w in windows)
    pad = max(0.25, (b - a) / 6)
    lo, hi = max(0.0, a - pad), min(end, b + pad)
    return (lo, hi) if hi - lo < share * end else None


def _brackets(body: list[str], checks: Sequence[NamedResult], axis: _Axis, y: float, interrupted: bool) -> float:
    """Each ``elapsed`` check as a bracket from the moment it measures from to the one it measures
    to, in its check's colour, labelled with its number and the time it measured; the bottom."""
    spans = []
    for check in _by_severity(checks):
        details = dict(getattr(check, "details", {}) or {})
        if check.kind != "elapsed" or not isinstance(details.get("from"), (int, float)) \
                or not isinstance(details.get("to"), (int, float)):
            continue
        spans.append((check, float(details["from"]), float(details["to"])))
    if not spans:
        return y
    x = axis.x
    labels = [f"#{c.index + 1} {b - a:.3f}s" for c, a, b in spans]
    rows = _rows([(x(a) - 2, max(x(b), x(a) + 4) + 4 + _CHAR_W * len(text)) for (_, a, b), text in zip(spans, labels, strict=True)])
    for (check, a, b), text, row in zip(spans, labels, rows, strict=True):
        word = _valid_text(check.valid, interrupted, check.not_judged)
        color = swatch(word).strong
        by = y + 2 + 14 * row + 6
        x0, x1 = x(a), max(x(b), x(a) + 2)
        body.append(
            f"<g class='bracket' data-valid='{word}'><path d='M{x0:.1f} {by - 4:.1f} v4 H{x1:.1f} v-4' fill='none' "
            f"stroke='{color}' stroke-width='1.5'/><text x='{x1 + 4:.1f}' y='{by + 3:.1f}' fill='{color}' font-size='9'>"
            f"{_e(text)}</text><title>#{check.index + 1} {_e(check.name)}: {a:.3f}s to {b:.3f}s, {b - a:.3f}s ({word})"
            "</title></g>"
        )
    return y + 4 + 14 * (max(rows) + 1)


def _check_shape(word: str, cx: float, cy: float, color: str) -> str:
    """A check's mark: a circle when it passed, a square when it failed, a diamond otherwise."""
    if word == "PASS":
        return f"<circle cx='{cx:.1f}' cy='{cy:.1f}' r='7' fill='{color}'/>"
    if word == "FAIL":
        return f"<rect x='{cx - 7:.1f}' y='{cy - 7:.1f}' width='14' height='14' fill='{color}'/>"
    return f"<path d='M{cx:.1f} {cy - 8:.1f} l8 8 l-8 8 l-8 -8 z' fill='{color}'/>"


def _server_band(body: list[str], view: Sequence[tuple[float, str]], axis: _Axis, end: float, y: float) -> float:
    """The server's view of a source as a band at ``y`` (4 px) with its words below where they fit;
    the bottom of what was drawn."""
    for i, (t, status) in enumerate(view):
        t1 = view[i + 1][0] if i + 1 < len(view) else end
        x0, x1 = axis.x(t), axis.x(t1)
        color = _SERVER_COLORS.get(status, _GREY)
        body.append(
            f"<rect class='server-view' data-status='{_e(status)}' x='{x0:.1f}' y='{y:.1f}' width='{max(x1 - x0, 2):.1f}' "
            f"height='4' fill='{color}'><title>{t:.3f}s the server holds this source {_e(status)}</title></rect>"
        )
        if x1 - x0 >= _CHAR_W * (len(status) + 5):
            body.append(f"<text class='server-word' x='{x0 + 2:.1f}' y='{y + 13:.1f}' fill='{color}' font-size='9'>"
                        f"server: {_e(status)}</text>")
    return y + 15


def _attempt_rows(body: list[str], tried: Sequence[Attempt], axis: _Axis, end: float, y0: float) -> int:
    """A reader's attempts from ``y0``, each a labelled bar over its phase strip, in rows so that no
    two touch (a label that does not fit its bar goes after it); the number of rows used."""
    x = axis.x
    shapes = []
    for a in tried:
        x0, x1 = x(a.start) + 1, max(x(a.end if a.end is not None else end) - 1, x(a.start) + 4)
        mark = "" if a.outcome is None else " \u2713" if a.ok else " \u2717"
        label = f"#{a.index} {a.source}{mark}"
        fits = x1 - x0 >= _CHAR_W * len(label) + 6
        shapes.append((x0, x1, label, fits))
    rows = _rows([(x0, x1 if fits else x1 + 4 + _CHAR_W * len(label)) for x0, x1, label, fits in shapes], gap=6.0)
    for a, (x0, x1, label, fits), row in zip(tried, shapes, rows, strict=True):
        ty = y0 + 22 * row
        fill = _GREEN if a.ok else "url(#hatch-fail)" if a.outcome is not None else "#fff"
        until = "the end of the run (no outcome)" if a.end is None else f"{a.end:.3f}s: {a.outcome}"
        tip = f"attempt {a.index} at {a.source}, {a.start:.3f}s to {until}" + (f" ({a.error})" if a.error else "")
        dashed = "" if a.outcome is not None else " stroke-dasharray='3 2'"
        failed = a.outcome is not None and not a.ok
        outcome = a.outcome or "unfinished"
        body.append(
            f"<g class='attempt' data-index='{a.index}' data-source='{_e(a.source)}' data-outcome='{_e(outcome)}'>"
            f"<rect x='{x0:.1f}' y='{ty:.1f}' width='{x1 - x0:.1f}' height='12' rx='2' fill='{fill}' "
            f"stroke='{_RED if failed else _STEP}' stroke-width='{1.2 if failed else 0.8}'{dashed}/>"
        )
        if fits:  # inside its bar: white on green; on the light hatching, dark red with a light halo
            tx, paint = x0 + 3, "fill='#fff'" if a.ok else (f"fill='{_DARK_RED}' stroke='{swatch('fail').light}' "
                                                             "stroke-width='3' paint-order='stroke'")
        else:
            tx, paint = x1 + 4, f"fill='{_GREEN if a.ok else _RED if a.outcome else _STEP}'"
        body.append(f"<text class='attempt-label' x='{tx:.1f}' y='{ty + 10:.1f}' {paint} font-weight='600'>"
                    f"{_e(label)}</text><title>{_e(tip)}</title>")
        for p in a.phases:
            py = ty + 13 if not p.overlapped else ty + 18.5
            height = 5 if not p.overlapped else 2.5
            color = _PHASE_COLORS.get(p.name, _OTHER_PHASE)
            edge = "" if p.ok else f" stroke='{_RED}' stroke-width='1'"
            aside = " (beside the load's path: a prestarted target)" if p.overlapped else ""
            body.append(
                f"<rect class='phase' data-phase='{_e(p.name)}' x='{x(p.start):.1f}' y='{py:.1f}' "
                f"width='{max(x(p.end) - x(p.start), 1):.1f}' height='{height}' fill='{color}'{edge}>"
                f"<title>attempt {a.index} {_e(p.name)}: {p.end - p.start:.3f}s{'' if p.ok else ', failed'}{aside}</title></rect>"
            )
        body.append("</g>")
    return max(rows, default=-1) + 1


def _swatch(inner: str, w: int = 22, h: int = 14) -> str:
    return f"<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}'>{inner}</svg>"


def _drawn(*patterns: str) -> Callable[[str], bool]:
    """A legend item's test: whether any of ``patterns`` (regular expressions) is in the SVG."""
    compiled = [re.compile(p) for p in patterns]
    return lambda svg: any(c.search(svg) for c in compiled)


def _legend_items() -> list[tuple[str, str, Callable[[str], bool]]]:
    """Every symbol the timeline can draw: (swatch, meaning, whether an SVG uses it)."""
    items = [
        (_swatch(f"<rect y='2' width='22' height='10' fill='{_ALIVE}'/>"), "process alive (start to exit)", _drawn("class='alive'")),
        (_swatch(f"<text x='6' y='11' fill='{_RED}' font-weight='700'>x</text>"), "process exit", _drawn("class='exit'")),
        (_swatch(f"<text x='0' y='11' fill='{_STATUS}' font-size='9'>RDY</text>", 24), "status change (text above the bar)",
         _drawn("class='status'")),
        (_swatch(f"<rect y='5' width='22' height='4' fill='{_GREEN}'/>"), "transfer, completed",
         _drawn(f"class='transfer'[^>]*fill='{_GREEN}'")),
        (_swatch(f"<rect y='5' width='22' height='4' fill='{_RED}'/>"), "transfer, timed out or failed",
         _drawn(f"class='transfer'[^>]*fill='{_RED}'")),
    ]
    by_color: dict[str, list[str]] = {}
    for color, text in _EVENT_STYLE.values():
        by_color.setdefault(color, []).append(text)
    for color, texts in by_color.items():
        items.append((_swatch(f"<circle cx='11' cy='7' r='4' fill='{color}'/>"), " / ".join(texts),
                      _drawn(f"class='event'[^>]*fill='{color}'")))
    items += [
        (
            _swatch(f"<circle cx='6' cy='4' r='3' fill='{_GREY}'/><line x1='14' x2='14' y1='4' y2='11' stroke='{_GREY}'/>"
                    f"<circle cx='14' cy='11' r='3' fill='{_GREY}'/>"),
            "events at the same time: stacked below, stem to their time", _drawn("class='stem'"),
        ),
        (_swatch(f"<rect y='2' width='22' height='10' fill='{_FAULT}'/>"), "fault window (nemesis lane, a row per overlapping fault)",
         _drawn("class='fault'")),
        (_swatch(f"<rect x='1' y='1' width='20' height='12' fill='none' stroke='{_FAULT}' stroke-width='2'/>"),
         "fault window on the process it hit", _drawn("class='fault-outline'")),
        (_swatch(f"<rect width='22' height='14' fill='{_FAULT}' fill-opacity='0.15'/>"), "some fault active (all lanes)",
         _drawn("class='fault-shade'")),
        (_swatch(f"<line x1='11' x2='11' y1='0' y2='14' stroke='{_STEP}' stroke-width='1.5'/>"), "step started (harness lane)",
         _drawn("class='step'")),
        (_swatch(f"<path d='M11 2 l4 5 l-4 5 l-4 -5 z' fill='{_PURPLE}'/>"), "mark, hang or await timeout (harness lane)",
         _drawn("class='mark'")),
        (_swatch(f"<rect x='1' y='1' width='20' height='12' fill='none' stroke='{_FAULT}' stroke-width='1.5' "
                 "stroke-dasharray='4 2'/>"), "fault on the host the process runs on", _drawn("class='host-fault'")),
        (_swatch(f"<rect y='5' width='10' height='4' fill='{_GREEN}'/><rect x='11' y='5' width='11' height='4' fill='{_ORANGE}'/>"),
         "the server's view of a source: READY / STALE / INITIALIZING (grey)", _drawn("class='server-view'")),
        (_swatch(f"<rect y='1' width='22' height='12' rx='2' fill='{_GREEN}'/>"), "reader attempt #index at a source, succeeded \u2713",
         _drawn(f"rx='2' fill='{_GREEN}'")),
        (_swatch(f"<rect y='1' width='22' height='12' rx='2' fill='url(#hatch-fail)' stroke='{_RED}'/>"),
         "attempt failed \u2717 (hatched): the reader moved on", _drawn("fill='url\\(#hatch-fail\\)'")),
        (_swatch(f"<rect y='1' width='22' height='12' rx='2' fill='#fff' stroke='{_STEP}' stroke-dasharray='3 2'/>"),
         "attempt with no outcome by the end", _drawn("data-outcome='unfinished'")),
    ]
    for phase in PHASES:
        items.append((_swatch(f"<rect y='5' width='22' height='5' fill='{_PHASE_COLORS[phase]}'/>"),
                      f"load phase: {'READ' if phase == 'read' else phase}", _drawn(f"data-phase='{phase}'")))
    known = "|".join(PHASES)
    items += [
        (_swatch(f"<rect y='5' width='22' height='5' fill='{_OTHER_PHASE}'/>"), "load phase: other (metadata, agent, release ...)",
         _drawn(f"data-phase='(?!(?:{known})')")),
        (_swatch(f"<rect y='6' width='22' height='2.5' fill='{_PHASE_COLORS['allocate']}'/>"),
         "thin: a phase beside the load's path (prestarted target)", _drawn("class='phase'[^>]*height='2.5'")),
        (_swatch(f"<line x1='11' x2='11' y1='0' y2='14' stroke='{_INTERRUPT}' stroke-width='2' stroke-dasharray='6 3'/>"),
         "the harness was interrupted (Ctrl-C)", _drawn("class='interrupt'")),
        (_swatch(f"<line x1='2' x2='20' y1='7' y2='7' stroke='{_STEP}' stroke-width='1.5'/><line x1='2' x2='2' y1='3' y2='11' "
                 f"stroke='{_STEP}' stroke-width='1.5'/><line x1='20' x2='20' y1='3' y2='11' stroke='{_STEP}' stroke-width='1.5'/>"),
         "an elapsed check: a bracket from the moment it measures from to the one it measures to", _drawn("class='bracket'")),
    ]
    for word in ("PASS", "FAIL", "UNKNOWN", NOT_JUDGED):
        items.append((_swatch(_check_shape(word, 11, 7.5, swatch(word).strong).replace("r='7'", "r='6.5'"), 22, 16),
                      f"check #n, {word}", _drawn(f"data-valid='{word}'")))
    return items


def legend_html(*svgs: str) -> str:
    """What every mark and colour on the timeline means (built from the same style tables); given
    the page's SVGs, only the symbols they draw."""
    items = [(sw, text) for sw, text, used in _legend_items() if not svgs or any(used(svg) for svg in svgs)]
    cells = "".join(f"<li>{sw}<span>{_e(text)}</span></li>" for sw, text in items)
    return f"<ul class='legend'>{cells}</ul>"
