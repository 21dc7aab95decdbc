"""``index.html``: one self-contained page (inline CSS, no script) of a ``nightly.json``.

Top to bottom: the night's verdict (PASSED / FAILED) and headline counts (scenarios, ran,
skipped, failing, each cell kind: a link that shows only that kind's rows, by CSS ``:target``); what changed since the night before (newly failing first,
then fixed, rates moved beyond their bounds, other changes, slower, new and gone scenarios)
with links to that night's page; then the table, a row per scenario and a column per repeat:
the cell, its rate (and bound, for a known defect), the median duration, a "since" mark, and
the runs as a strip of chips that wraps (a chip per run: its glyph and number, linked to the
run's ``report.html``; its verdict, duration and seed in its title), then under the strip why
each run that did not pass failed (its first checks, and the machine's load when it had more
runnable tasks than CPUs); a skipped scenario's row gives the reason. Last, what ran
(versions, host, inventory) and the artifacts (size, the log cap, what was cut). Links are
relative, so the output folder can move whole. Verdict colours and glyphs are the one palette
of every page (``harness.reports.htmlreport.palette``); the table style is the matrix page's.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from harness.record.load import load_text
from harness.reports.htmlreport.palette import glyph_badge, swatch
from harness.reports.matrix_page import CSS

__all__ = ["render_night"]

EXTRA_CSS = """
.badge{display:inline-block;padding:2px 10px;border-radius:4px;font-size:18px;vertical-align:middle}
.passed{background:#c8f0c8}.failed{background:#f5b5b5}
.counts span,.counts a{display:inline-block;border:1px solid #999;border-radius:4px;padding:4px 8px;margin:2px 4px 2px 0}
.counts a.filter{color:#1f2328;text-decoration:none}.counts a.filter:hover{border-color:#0969da}i.target{display:none}
.since{font-size:12px;font-weight:bold}.newfail{color:#a00000}.fixed{color:#006000}
ul.changes li{margin:2px 0}td.run{min-width:170px}
.why{font-size:11px;color:#600;overflow-wrap:anywhere}td.note{max-width:240px}th.name{max-width:320px}
.verdict{color:#fff;padding:1px 8px;border-radius:10px;font-weight:600;white-space:nowrap}
.chips{display:flex;flex-wrap:wrap;gap:3px;max-width:420px}
.chip{display:inline-block;min-width:34px;padding:1px 4px;border:1px solid;border-radius:3px;font-size:12px;
text-align:center;text-decoration:none;color:#1f2328}
.load{font-size:11px;color:#6e7781}table{max-width:100%}td,th.name,h1,h2,p{overflow-wrap:anywhere}
tr.group th{text-align:left;background:#fff;border:none;padding-top:12px;font-size:15px}
@media (max-width:700px){body{margin:6px}th.name{max-width:none}}
"""

SECTIONS = (
    ("newly_failing", "Newly failing", "newfail"),
    ("still_failing", "Still failing", "newfail"),
    ("flaky", "Flaky (failed some nights, passed others)", ""),
    ("fixed", "Fixed", "fixed"),
    ("rates_moved", "Rates moved beyond their 95% confidence bounds", ""),
    ("other", "Other cell changes", ""),
    ("slower", "Slower (median run duration; noisy on a loaded machine)", ""),
)


def _e(value: Any) -> str:
    return html.escape(str(value))


def _colour(verdict: Any) -> str:
    return swatch(verdict).light


def _chip(r: Mapping[str, Any]) -> str:
    """One run: its glyph and number, linked to its page; verdict, duration and seed in its title."""
    verdict = str(r.get("verdict"))
    look = swatch(verdict)
    title = f"run {r.get('index')}: {verdict.upper()}, {r.get('seconds')}s, seed {r.get('seed')}"
    return (f'<a class="chip" data-verdict="{_e(verdict)}" href="{_e(r.get("report"))}" title="{_e(title)}" '
            f'style="background:{look.light};border-color:{look.strong}">{look.glyph} {_e(r.get("index"))}</a>')


def _mib(n: Any) -> str:
    return f"{n / (1 << 20):.1f} MiB" if isinstance(n, int | float) else "?"


def _rate(s: Mapping[str, Any]) -> str:
    """The same count on every row: the runs whose checks all passed (``pass``, or ``xpass`` for a
    known defect) of the runs that ran; a known defect's row adds how often it showed, its bound
    and its measured rate (``harness.record.rates``)."""
    runs = [r for r in s.get("runs") or [] if isinstance(r, Mapping) and r.get("verdict") != "skip"]
    rate = s.get("rate") or {}
    if runs:
        text = f"{sum(1 for r in runs if r.get('verdict') in ('pass', 'xpass'))}/{len(runs)}"
    elif s.get("known_defect"):  # a record without its runs: the defect's k counts the runs that did not pass
        text = f"{rate.get('n', 0) - rate.get('k', 0)}/{rate.get('n', 0)}"
    else:
        text = f"{rate.get('k', 0)}/{rate.get('n', 0)}"
    if s.get("known_defect"):
        text += f"; the defect showed in {rate.get('k', 0)}/{rate.get('n', 0)}"
        if isinstance(s.get("bound"), int | float):
            text += f" (bound {s['bound']:.3f}"
            measured = s.get("measured")
            text += f", measured {measured['k']}/{measured['n']})" if measured else ")"
    return text


def _counts(night: Mapping[str, Any]) -> str:
    c = night.get("counts") or {}
    parts = [f"<span><b>{c.get(k, 0)}</b> {label}</span>" for k, label in
             (("scenarios", "scenarios"), ("ran", "ran"), ("skipped", "skipped"), ("runs", "runs"), ("failing", "failing"))]
    cells = c.get("cells") or {}
    for cell, n in cells.items():  # a link that shows only that cell's rows (CSS :target, no script)
        parts.append(f'<a class="filter" href="#only-{_slug(cell)}" title="show only the {_e(cell)} rows" '
                     f'style="background:{_colour(cell)}"><b>{n}</b> {_e(cell)}</a>')
    if len(cells) > 1:
        parts.append('<a class="filter" href="#" title="show every row">all</a>')
    return f'<div class="counts">{"".join(parts)}</div>'


def _comparison(night: Mapping[str, Any]) -> str:
    comp = night.get("comparison")
    prev = night.get("previous")
    if not comp or not prev:
        return "<h2>Since the night before</h2><p>The first night in this folder: nothing to compare.</p>"
    link = f'<a href="../{_e(prev["night"])}/index.html">{_e(prev["night"])}</a>'
    out = [f'<h2>Since night {link}</h2><p class=small><a href="../history.html">every night of this folder</a></p>']
    any_change = False
    for key, title, cls in SECTIONS:
        items = comp.get(key) or []
        if not items:
            continue
        any_change = True
        out.append(f"<h3>{_e(title)} ({len(items)})</h3><ul class=changes>")
        for item in items:
            runs = " ".join(f'<a href="{_e(r.get("report"))}">run {_e(r.get("index"))}: {_e(r.get("verdict"))}</a>'
                            for r in item.get("failing_runs") or [])
            css = f' class="{cls}"' if cls else ""
            out.append(f"<li{css}><b>{_e(item['scenario'])}</b>: {_e(item['text'])} {runs}</li>")
        out.append("</ul>")
    for key, title in (("new_scenarios", "New scenarios"), ("gone_scenarios", "Gone since then")):
        names = comp.get(key) or []
        if names:
            any_change = True
            out.append(f"<p><b>{title}:</b> {_e(', '.join(names))}</p>")
    if not any_change:
        out.append("<p>No change: every scenario has the cell it had, no rate moved beyond its bounds.</p>")
    return "".join(out)


def _since_marks(night: Mapping[str, Any]) -> dict[str, str]:
    comp = night.get("comparison") or {}
    marks: dict[str, str] = {}
    for key, text, cls in (("rates_moved", "rate moved", ""), ("other", "changed", ""), ("flaky", "flaky", ""),
                           ("still_failing", "still failing", "newfail"),
                           ("fixed", "fixed", "fixed"), ("newly_failing", "newly failing", "newfail")):
        for item in comp.get(key) or []:
            marks[item["scenario"]] = f'<div class="since {cls}">{text}</div>'
    for name in comp.get("new_scenarios") or []:
        marks.setdefault(name, '<div class="since">new</div>')
    return marks


def _runs(s: Mapping[str, Any], repeat: int) -> str:
    """The runs cell: a strip of chips, then why each run that did not pass failed."""
    runs = s.get("runs") or []
    chips = "".join(_chip(r) for r in runs)
    missing = repeat - len(runs)
    if missing > 0:
        look = swatch("not run")
        chips += "".join(f'<span class="chip" data-verdict="not run" style="border-color:{look.strong}" '
                         f'title="not run (the run was interrupted, or a run skipped)">{look.glyph}</span>'
                         for _ in range(missing))
    lines = []
    for r in runs:
        verdict = str(r.get("verdict"))
        if len(runs) == 1:
            lines.append(f'<div class="small">{_e(r.get("seconds"))}s, seed {_e(r.get("seed"))}</div>')
        if verdict in ("pass", "xfail", "skip", "xpass"):
            continue
        why = [str(r["reason"])] if r.get("reason") else []
        why += list(r.get("failed_checks") or [])
        load = f' <span class="load">(machine {_e(r["load"])})</span>' if r.get("load") else ""
        for w in why[:3]:
            lines.append(f'<div class="why">run {_e(r.get("index"))}: {_e(w)}{load}</div>')
            load = ""
    return f'<td class="run"><div class="chips">{chips}</div>{"".join(lines)}</td>'


def _table(night: Mapping[str, Any]) -> str:
    repeat = int(night.get("repeat") or 1)
    scenarios: Sequence[Mapping[str, Any]] = night.get("scenarios") or []
    marks = _since_marks(night)
    rows = ["<tr><th>scenario</th><th>cell</th><th title='runs whose checks all passed / runs that ran (not skipped)'>"
            "passed / ran</th><th>median</th><th>runs</th></tr>"]
    for group, members in _groups(scenarios):
        if len(members) < len(scenarios):
            cells = " ".join(sorted({_slug(s.get("cell")) for s in members}))
            rows.append(f'<tr class="group" data-cells="{cells}"><th colspan="5">{_e(group)} ({len(members)})</th></tr>')
        rows += [_row(s, repeat, marks) for s in members]
    # the count chips' targets: siblings before the table, so "#only-X:target ~ table" hides the other rows
    kinds = sorted({_slug(s.get("cell")) for s in scenarios})
    targets = "".join(f'<i id="only-{k}" class="target"></i>' for k in kinds)
    hide = "".join(f'#only-{k}:target ~ table.scenarios tr[data-cells]:not([data-cells~="{k}"]){{display:none}}'
                   f'#only-{k}:target ~ h2 .shown::after{{content:" (only {k.replace("_", "?")})"}}' for k in kinds)
    return (f"<style>{hide}</style>{targets}<h2>Scenarios x runs<span class=shown></span></h2><table class=scenarios>"
            + "".join(rows) + "</table>")


def _slug(cell: Any) -> str:
    """A cell's name as an id and a class word (``FIXED?`` is ``FIXED_``)."""
    return "".join(ch if ch.isalnum() else "_" for ch in str(cell))


# the index's groups, in order: what fails first, then the known defects together, then the rest
_GROUPS = ("Failing", "Known defects", "Passed", "Skipped")


def _groups(scenarios: Sequence[Mapping[str, Any]]) -> list[tuple[str, list[Mapping[str, Any]]]]:
    """The scenarios in ``_GROUPS``, each group in the order it ran; empty groups left out."""
    def group(s: Mapping[str, Any]) -> str:
        if s.get("fails_night"):
            return "Failing"
        if s.get("known_defect"):
            return "Known defects"
        return "Skipped" if s.get("skip") or s.get("cell") == "SKIP" else "Passed"

    by: dict[str, list[Mapping[str, Any]]] = {g: [] for g in _GROUPS}
    for s in scenarios:
        by[group(s)].append(s)
    return [(g, members) for g, members in by.items() if members]


def _row(s: Mapping[str, Any], repeat: int, marks: Mapping[str, str]) -> str:
    defect = (f'<details class="small"><summary>known defect</summary>{_e(s["known_defect"])}</details>'
              if s.get("known_defect") else "")
    name = f'<th class="name">{_e(s["name"])}{marks.get(s["name"], "")}{defect}<div class="small">{_e(s.get("path") or "")}</div></th>'
    note = f'<div class="small">{_e(s["note"])}</div>' if s.get("note") and s.get("cell") not in ("PASS", "SKIP") else ""
    look = swatch(s.get("cell"))
    cell = (f'<td class="note" style="background:{look.light}"><span class="v">{look.glyph} {_e(s.get("cell"))}</span>'
            f"{note}</td>")
    median = s.get("median_seconds")
    row = [name, cell, f"<td>{_e(_rate(s))}</td>", f"<td>{f'{median:.1f}s' if isinstance(median, int | float) else '-'}</td>"]
    if s.get("skip"):
        row.append(f'<td class="small">skipped: {_e(s["skip"])}</td>')
    else:
        row.append(_runs(s, repeat))
    return f'<tr data-cells="{_slug(s.get("cell"))}">' + "".join(row) + "</tr>"


def _about(night: Mapping[str, Any]) -> str:
    v = night.get("versions") or {}
    host = v.get("host") or {}
    hosts = night.get("hosts") or {}
    inv = hosts.get("inventory")
    rows = [("mxchaos", v.get("mxchaos")), ("git commit", v.get("git_commit")), ("NIXL", v.get("nixl")),
            ("UCX", v.get("ucx")), ("Python", v.get("python")), ("torch", v.get("torch")),
            ("host", f"{host.get('hostname', '?')} ({host.get('platform', '?')}, {host.get('cpus', '?')} CPUs)"),
            ("binding", hosts.get("binding")),
            ("inventory", f"{inv['path']} (machines: {', '.join(inv.get('machines') or []) or '?'}; sha256 {inv['sha256'][:12]})"
             if inv else "none (this machine's local and netns hosts)"),
            ("command", " ".join(night.get("command") or [])),
            ("machine load", "; ".join(f"at {k} {load_text(v)}" for k, v in (night.get("load") or {}).items() if load_text(v)) or "-")]
    body = "".join(f"<tr><th>{_e(k)}</th><td>{_e(val if val is not None else '-')}</td></tr>" for k, val in rows)
    art = night.get("artifacts") or {}
    if not art:  # an invocation of `mxchaos run` trims nothing
        return f"<h2>What ran</h2><table>{body}</table>"
    capped = art.get("capped") or []
    removed = art.get("removed") or []
    lines = [f"{_mib(art.get('bytes'))} in this night's folder; logs capped at {_e(art.get('log_cap_bytes'))} bytes each; "
             f"{len(capped)} log(s) cut, {len(removed)} checkpoint cop{'y' if len(removed) == 1 else 'ies'} removed"]
    lines += [f"cut {_e(c['path'])}: {_e(c['cut'])} of {_e(c['bytes'])} bytes" for c in capped[:20]]
    return (f"<h2>What ran</h2><table>{body}</table><h2>Artifacts</h2><p class=small>"
            + "<br>".join(lines) + "</p>")


def render_night(night: Mapping[str, Any]) -> str:
    """The page (see the module docstring)."""
    passed = bool(night.get("passed"))
    kind = "run" if night.get("kind") == "run" else "nightly"  # harness.reports.invocation writes the same shape (no comparison)
    badge = glyph_badge("passed" if passed else "failed")
    interrupted = " (interrupted)" if night.get("interrupted") else ""
    seed = f"; --seed {night['seed']}" if night.get("seed") is not None else ""
    out = [
        "<!doctype html><html><head><meta charset=utf-8><meta name=viewport content='width=device-width, initial-scale=1'>"
        f"<title>mxchaos {kind} {_e(night.get('night'))}</title>"
        f"<style>{CSS}{EXTRA_CSS}</style></head><body>",
        f"<h1>mxchaos {kind} {_e(night.get('night'))} {badge}{_e(interrupted)}</h1>",
        f"<p class=small>{_e(night.get('started'))} to {_e(night.get('ended'))} ({_e(night.get('seconds'))}s); "
        f"--repeat {_e(night.get('repeat'))}{_e(seed)}; a plain scenario passes only at N/N (FLAKY fails the {_e(kind)}); "
        "a known defect is XFAIL at k &ge; 1 and FIXED? only at 0/N with its 95% bound below the measured rate; "
        "exit code " + _e(night.get("exit_code")) + "</p>",
        _counts(night),
        _comparison(night) if kind == "nightly" else "",
        _table(night),
        _about(night),
        "</body></html>",
    ]
    return "\n".join(out) + "\n"
