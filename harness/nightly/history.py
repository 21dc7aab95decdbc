"""The nights of one ``--out`` folder read together: what a single comparison cannot say.

``night_folders(out)`` lists the night folders (named as night ids, oldest first);
``read_night`` reads one ``nightly.json`` (None when it is not a night's). Over the nights up to
and including a new one, ``history_lines`` gives, per scenario:

* ``still_failing``: its cell fails now and failed the night before (``rates.FAILING_CELLS``):
  "still failing (N nights, since NIGHT)", N counted back to the first night of the streak;
* ``flaky``: its cell is FLAKY now, or over the last ``WINDOW`` nights it both failed and
  passed (a SKIP counts as neither): "flaky: failed K of the last M nights".

(``fixed``, ``newly_failing`` and the rest are the two-night comparison's,
``harness.nightly.compare``.) ``render_history`` is ``DIR/history.html``: a strip per scenario,
a chip per night (its cell's glyph, linked to that night's page; the night, cell, rate, median
and the machine's load in its title), newest on the right, a line of its median run per night
(``trend_svg``; the page also draws each night's whole duration), and a "now" column that always
says something: the streak words, else the newest cell and for how many nights in a row it held.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.record.load import load_text
from harness.record.rates import FAILING_CELLS
from harness.record.saved import NightDoc, NightEntry
from harness.reports.htmlreport.palette import swatch

__all__ = ["NIGHT_ID", "SHOWN", "WINDOW", "history_lines", "night_folders", "night_order", "read_night", "render_history",
           "trend_svg"]

NIGHT_ID = re.compile(r"^\d{8}T\d{6}Z(-\d+)?$")
WINDOW = 7  # nights a flaky scenario is looked for in
SHOWN = 30  # nights on the history page

Night = tuple[str, NightDoc]


def night_order(folder: Path) -> tuple[str, int]:
    """Oldest first: the start stamp, then the ``-N`` of nights started in the same second."""
    stamp, _, n = folder.name.partition("-")
    return stamp, int(n or 1)


def night_folders(out: Path) -> list[Path]:
    """The folders of ``out`` named as night ids, oldest first (links are not followed)."""
    if not out.is_dir():
        return []
    return sorted((p for p in out.iterdir() if p.is_dir() and not p.is_symlink() and NIGHT_ID.match(p.name)),
                  key=night_order)


def read_night(folder: Path) -> NightDoc | None:
    return NightDoc.read_or_none(NightDoc.in_folder(folder))


def read_nights(out: Path) -> list[Night]:
    """Every readable night of ``out``, oldest first."""
    nights: list[Night] = []
    for folder in night_folders(out):
        doc = read_night(folder)
        if doc is not None:
            nights.append((folder.name, doc))
    return nights


def _cells(doc: NightDoc) -> dict[str, str]:
    return {s.name: str(s.cell) for s in doc.scenarios}


def history_lines(before: Sequence[Night], new: Night) -> dict[str, list[dict[str, Any]]]:
    """``still_failing`` and ``flaky`` of the new night over the nights ``before`` it (oldest first)."""
    nights = [*before, new]
    cells = [(name, _cells(doc)) for name, doc in nights]
    still: list[dict[str, Any]] = []
    flaky: list[dict[str, Any]] = []
    for scenario, cell in cells[-1][1].items():
        streak, since = 0, cells[-1][0]
        for name, by in reversed(cells):
            if by.get(scenario) not in FAILING_CELLS:
                break
            streak, since = streak + 1, name
        if streak >= 2:
            still.append({"scenario": scenario, "nights": streak, "since": since, "new": cell,
                          "text": f"still failing ({streak} nights, since {since}): {cell} now"})
        judged = [by[scenario] for _, by in cells[-WINDOW:] if by.get(scenario) not in (None, "SKIP")]
        failed = sum(1 for c in judged if c in FAILING_CELLS)
        if cell == "FLAKY" or 0 < failed < len(judged):
            flaky.append({"scenario": scenario, "failed": failed, "of": len(judged), "new": cell,
                          "text": f"flaky: failed {failed} of the last {len(judged)} nights" + (", FLAKY now" if cell == "FLAKY" else "")})
    return {"still_failing": still, "flaky": flaky}


def _e(value: Any) -> str:
    return html.escape(str(value))


def _chip(night: str, s: NightEntry | None, load: str) -> str:
    if s is None:
        return '<span class="chip" data-cell="none" title="not in this night">&nbsp;</span>'
    cell = str(s.cell)
    look = swatch(cell)
    rate = s.rate or {}
    median = s.median_seconds
    title = (f"{night}: {cell} {rate.get('k', 0)}/{rate.get('n', 0)}"
             + (f", median {median:.1f}s" if isinstance(median, int | float) else "") + (f"; machine {load}" if load else ""))
    return (f'<a class="chip" data-cell="{_e(cell)}" href="{_e(night)}/index.html" title="{_e(title)}" '
            f'style="background:{look.light};border-color:{look.strong}">{look.glyph}</a>')


def render_history(nights: Sequence[Night]) -> str:
    """``DIR/history.html`` over ``nights`` (oldest first; the newest ``SHOWN`` are drawn)."""
    shown = list(nights)[-SHOWN:]
    names: dict[str, None] = {}
    for _, doc in reversed(shown):  # the newest night's order first, then names gone since
        names.update(dict.fromkeys(_cells(doc)))
    by_night = [(name, {s.name: s for s in doc.scenarios}, load_text((doc.load or {}).get("end")))
                for name, doc in shown]
    lines = history_lines(shown[:-1], shown[-1]) if shown else {"still_failing": [], "flaky": []}
    words: dict[str, list[str]] = {}
    for key in ("still_failing", "flaky"):
        for item in lines[key]:
            words.setdefault(item["scenario"], []).append(f'<span class="{key}">{_e(item["text"])}</span>')
    rows = []
    for scenario in names:
        chips = "".join(_chip(night, by.get(scenario), load) for night, by, load in by_night)
        medians = [by[scenario].median_seconds if scenario in by else None for _, by, _ in by_night]
        now = "<br>".join(words.get(scenario, [])) or _e(_now(scenario, [by for _, by, _ in by_night]))
        rows.append(f'<tr data-scenario="{_e(scenario)}"><th class="name">{_e(scenario)}</th>'
                    f'<td><div class="strip">{chips}</div></td><td class="trend">{trend_svg(medians)}</td>'
                    f'<td class="small now">{now}</td></tr>')
    span = f"{_e(shown[0][0])} to {_e(shown[-1][0])}" if shown else "no night yet"
    heads = "".join(f'<a href="{_e(n)}/index.html" title="{_e(n)}">{i + 1}</a>' for i, (n, _) in enumerate(shown))
    whole = trend_svg([doc.seconds for _, doc in shown], width=240)
    return (
        "<!doctype html><html><head><meta charset=utf-8><meta name=viewport content='width=device-width, initial-scale=1'>"
        f"<title>mxchaos nightly history</title><style>{_CSS}</style></head><body>"
        f"<h1>mxchaos nightly history</h1><p class=small>{len(shown)} night(s), {span}; a strip per scenario, a chip per "
        "night (oldest left, newest right), linked to that night's page; its title gives the cell, rate, median run and the "
        "machine's load. A blank chip: the scenario was not in that night.</p>"
        f'<p class="small nights">nights: {heads}</p>'
        f'<p class="small">each night\'s duration: {whole}</p>'
        "<table class=history><tr><th>scenario</th><th>nights</th><th title='the median run of each night, oldest left'>"
        "median run</th><th>now</th></tr>" + "".join(rows) + "</table></body></html>\n"
    )



def _now(scenario: str, nights: Sequence[dict[str, NightEntry]]) -> str:
    """What the "now" column says of a scenario with no streak words: its newest cell and for how
    many nights in a row it has had it, or that the newest night did not hold it."""
    if not nights or scenario not in nights[-1]:
        last = next((i for i in range(len(nights) - 1, -1, -1) if scenario in nights[i]), None)
        return "not in the newest night" + (f" (last seen {len(nights) - 1 - last} night(s) before)" if last is not None else "")
    cell = str(nights[-1][scenario].cell)
    streak = 0
    for by in reversed(nights):
        if scenario not in by or str(by[scenario].cell) != cell:
            break
        streak += 1
    return f"{cell}, {streak} night{'s' if streak != 1 else ''} in a row" + ("" if streak < len(nights) else " (every night shown)")


def trend_svg(values: Sequence[float | None], width: int = 96, height: int = 20) -> str:
    """A line of ``values`` (oldest left; a missing one leaves a gap) scaled from 0 to their
    largest, with the newest value after it; '-' when there is none."""
    known = [v for v in values if v is not None]
    if not known:
        return "-"
    top = max(known) or 1.0
    step = width / max(1, len(values) - 1)
    segments: list[list[str]] = [[]]
    for i, v in enumerate(values):
        if v is None:
            segments.append([])
            continue
        segments[-1].append(f"{i * step if len(values) > 1 else width / 2:.1f},{height - 2 - (height - 4) * v / top:.1f}")
    lines = "".join(f"<polyline points='{' '.join(seg)}' fill='none' stroke='#0969da' stroke-width='1.5'/>" if len(seg) > 1
                    else f"<circle cx='{seg[0].split(',')[0]}' cy='{seg[0].split(',')[1]}' r='2' fill='#0969da'/>"
                    for seg in segments if seg)
    title = " · ".join("-" if v is None else f"{v:.1f}s" for v in values)
    return (f"<svg class='trend' xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
            f"viewBox='0 0 {width} {height}'><title>{_e(title)}</title>{lines}</svg> "
            f"<span class='small'>{known[-1]:.1f}s</span>")


_CSS = (
    "body{font:14px system-ui,sans-serif;margin:16px;color:#1f2328}table{border-collapse:collapse;max-width:100%}"
    "td,th{border:1px solid #d0d7de;padding:4px 6px;vertical-align:top;text-align:left;overflow-wrap:anywhere}"
    "th{background:#f6f8fa}.small{font-size:12px;color:#57606a}.strip{display:flex;flex-wrap:wrap;gap:2px}"
    ".chip{display:inline-block;width:18px;height:18px;line-height:18px;text-align:center;border:1px solid;"
    "border-radius:3px;font-size:12px;text-decoration:none;color:#1f2328}.nights a{margin-right:6px}"
    ".still_failing{color:#cf222e;font-weight:600}.flaky{color:#bc4c00}td.trend{white-space:nowrap}"
)
