"""The report of an exploration: ``explore.json`` (what other tools read) and ``explore.html``.

Both say: the template and its fault space, the seed, runs and budget, every schedule tried
(its faults, verdict, false checks, a link to its run folder's report and the scenario file
it ran), the failures found, the shrinking path (first failure -> each smaller failing
schedule -> the minimal one), the minimal scenario file and its reproduction rate with its
95% interval. Paths in the HTML are relative to the report, so the folder can be moved.
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path
from typing import Any

from harness.explore.search import Exploration, Trial

__all__ = ["exploration_json", "write_report"]


def exploration_json(ex: Exploration) -> dict[str, Any]:
    t = ex.template
    trials = [tr.to_json(t) for tr in ex.trials]
    return {
        "template": str(t.path),
        "name": t.name,
        "seed": ex.seed,
        "runs": ex.runs,
        "budget_s": ex.budget_s,
        "repeat": ex.repeat,
        "shrinker": ex.shrinker,
        "started_at": ex.started_at,
        "seconds": round(ex.seconds, 3),
        "outcome": ex.outcome,
        "stop_reason": ex.stop_reason,
        "space": t.space_json(),
        "trials": trials,
        "failures": [tr.index for tr in ex.trials if tr.failed],
        "target": sorted(ex.target) if ex.target else None,
        "first_failure": ex.first_failure,
        "shrink_path": ex.shrink_path,
        "cache_hits": ex.cache_hits,
        "answered_without_run": ex.answered_without_run,
        "minimal": None if ex.minimal is None else {
            "trial": ex.minimal,
            "file": ex.minimal_file,
            "faults": next((tr["faults"] for tr in trials if tr["index"] == ex.minimal), []),
            "reproduction": {"runs": [tr.to_json(t) for tr in ex.reproduction], "rate": ex.rate()},
        },
    }


_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#222;max-width:1300px}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:22px 0 6px}
table{border-collapse:collapse;width:100%} td,th{border-bottom:1px solid #e4e4e4;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f6f6f6;font-weight:600} .muted{color:#777} code{font-size:12px}
.v{font-weight:600;padding:1px 6px;border-radius:3px;font-size:12px}
.pass{background:#dff3e3;color:#1d6b31} .fail,.xfail,.hang,.unknown{background:#fbe0e0;color:#9b1c1c}
.error{background:#fdeccc;color:#8a5300} .skip,.none{background:#eee;color:#555}
.path{display:flex;flex-direction:column;gap:2px;align-items:flex-start} .step{border:1px solid #d88;border-radius:4px;padding:4px 8px;background:#fff6f6}
.arrow{color:#999} tr.min td{background:#fff8e1} .box{border:1px solid #ddd;border-radius:6px;padding:10px 14px;background:#fafafa}
"""


def _rel(target: str | None, base: Path) -> str | None:
    if not target:
        return None
    try:
        return os.path.relpath(target, base)
    except ValueError:
        return target


def _verdict(v: str | None) -> str:
    cls = v or "none"
    return f'<span class="v {html.escape(cls)}">{html.escape((v or "not run").upper())}</span>'


def _trial_row(tr: Trial, ex: Exploration, base: Path) -> str:
    report = _rel(tr.run_dir and str(Path(tr.run_dir) / "report.html"), base)
    scenario = _rel(tr.scenario_file, base)
    links = []
    if report:
        links.append(f'<a href="{html.escape(report)}">run</a>')
    if scenario:
        links.append(f'<a href="{html.escape(scenario)}">scenario</a>')
    faults = "<br>".join(html.escape(f"x{n}: {f.describe(ex.template)}") for n, f in enumerate(tr.schedule.faults, 1))
    marks = []
    if tr.index == ex.first_failure:
        marks.append("first failure")
    if tr.index == ex.minimal:
        marks.append("minimal")
    if tr.note:
        marks.append(tr.note)
    cls = ' class="min"' if tr.index == ex.minimal else ""
    return (
        f"<tr{cls}><td>{tr.index}</td><td>{html.escape(tr.phase)}</td><td>{faults or '(no fault)'}</td>"
        f"<td>{_verdict(tr.verdict)}</td><td>{html.escape(', '.join(tr.false_checks))}"
        f"{'<br><span class=muted>' + html.escape(tr.reason[:200]) + '</span>' if tr.reason else ''}</td>"
        f"<td>{tr.seconds:.1f}s</td><td>{' · '.join(links)}</td><td>{html.escape('; '.join(marks))}</td></tr>"
    )


def _page(ex: Exploration, base: Path) -> str:
    t = ex.template
    by_index = {tr.index: tr for tr in [*ex.trials, *ex.reproduction]}
    rate = ex.rate()
    parts = [
        "<!doctype html><html><head><meta charset=utf-8>",
        f"<title>explore {html.escape(t.name)}</title><style>{_CSS}</style></head><body>",
        f"<h1>mxchaos explore: {html.escape(t.name)}</h1>",
        f'<div class="muted">template {html.escape(str(t.path))} · seed {ex.seed} · --runs {ex.runs} · '
        f"budget {ex.budget_s:g}s · shrinker {html.escape(ex.shrinker)} · took {ex.seconds:.0f}s · started {html.escape(ex.started_at)}</div>",
        f'<h2>Outcome: {html.escape(ex.outcome.replace("_", " "))}</h2>',
    ]
    summary = [f"{len(ex.trials)} schedules run, {sum(1 for tr in ex.trials if tr.failed)} failing"]
    if ex.cache_hits or ex.answered_without_run:
        summary.append(f"{ex.cache_hits} answered from the cache, {ex.answered_without_run} not run (budget)")
    if ex.stop_reason:
        summary.append(f"stopped: {ex.stop_reason}")
    parts.append(f"<p>{html.escape('; '.join(summary))}</p>")
    if ex.minimal is not None:
        best = by_index[ex.minimal]
        link = _rel(ex.minimal_file, base)
        rate_text = "not measured"
        if rate is not None:
            rate_text = (f"fails in {rate['k']}/{rate['n']} reruns "
                         f"(95% interval {rate['lower']:.2f}..{rate['upper']:.2f})")
        parts += [
            '<h2>Minimal failing schedule</h2><div class="box">',
            "<ul>" + "".join(f"<li>{html.escape(f'x{n}: ' + f.describe(t))}</li>"
                             for n, f in enumerate(best.schedule.faults, 1)) + "</ul>",
            f"<p>false: {html.escape(', '.join(best.false_checks) or best.status)}"
            + (f' — <a href="{html.escape(_rel(str(Path(best.run_dir) / "report.html"), base) or "")}">its run</a>'
               if best.run_dir else "") + "</p>",
            f'<p>scenario: <a href="{html.escape(link or "")}"><code>{html.escape(ex.minimal_file or "")}</code></a>'
            f" — <code>mxchaos run {html.escape(ex.minimal_file or '')}</code></p>",
            f"<p>reproduction: {html.escape(rate_text)}</p></div>",
            "<h2>Shrinking path</h2><div class=path>",
        ]
        steps = []
        for i in ex.shrink_path:
            tr = by_index[i]
            steps.append(f'<span class=step>#{i}: {len(tr.schedule.faults)} fault(s)<br>'
                         f"<span class=muted>{html.escape(tr.schedule.describe(t))}</span></span>")
        parts.append('<span class="arrow">↓</span>'.join(steps) + "</div>")
    if ex.reproduction:
        parts.append("<h2>Reproduction runs</h2><table><tr><th>#</th><th>phase</th><th>faults</th><th>verdict</th>"
                     "<th>false checks</th><th>time</th><th>links</th><th></th></tr>")
        parts += [_trial_row(tr, ex, base) for tr in ex.reproduction]
        parts.append("</table>")
    parts.append("<h2>Schedules tried</h2><table><tr><th>#</th><th>phase</th><th>faults</th><th>verdict</th>"
                  "<th>false checks</th><th>time</th><th>links</th><th></th></tr>")
    parts += [_trial_row(tr, ex, base) for tr in ex.trials]
    parts.append("</table>")
    space = json.dumps(t.space_json(), indent=2)
    parts.append(f"<h2>Fault space</h2><pre>{html.escape(space)}</pre></body></html>")
    return "\n".join(parts)


def write_report(ex: Exploration) -> tuple[Path, Path]:
    """Write ``explore.json`` and ``explore.html`` into the exploration's folder."""
    out = ex.out_dir
    out.mkdir(parents=True, exist_ok=True)
    json_path, html_path = out / "explore.json", out / "explore.html"
    json_path.write_text(json.dumps(exploration_json(ex), indent=2) + "\n", encoding="utf-8")
    html_path.write_text(_page(ex, out), encoding="utf-8")
    return json_path, html_path
