"""The timeline of the HTML report (``timeline_svg``) and its legend (``legend_html``).

A lane per process plus harness, nemesis and checks, on the time axis of ``axis``, in
inline SVG; the legend is built from the same style tables, so every mark and colour on
the timeline is named.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from harness.checks import NamedResult
from harness.htmlreport.axis import _Axis, _rows, _rows_in_order, _union
from harness.htmlreport.style import (
    _ALIVE,
    _AMBER,
    _CHAR_W,
    _CHECK_COLORS,
    _EVENT_STYLE,
    _FAULT,
    _GREEN,
    _GREY,
    _LEFT,
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
from harness.timeline import Entry, History


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
