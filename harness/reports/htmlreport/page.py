"""The whole HTML page of one run (``render_html``) and its tables.

Top to bottom: the verdict badge and why; the checks, failed first; the timeline and its
legend; the metric charts; then run facts, steps, faults, processes, stacks, files and
every event.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from harness.checks import NamedResult
from harness.judge.exercised import fault_witness
from harness.judge.verdict import RunResult
from harness.record.deaths import log_tail, name_signals, signal_name
from harness.record.load import run_load
from harness.record.saved import VERDICT, VERSIONS, relative
from harness.record.timeline import Entry, FaultWindow, History
from harness.reports.htmlreport.charts import metric_charts
from harness.reports.htmlreport.palette import glyph_badge, swatch
from harness.reports.htmlreport.style import (
    _CELL_COLORS,
    _CSS,
    _GREY,
    _RED,
    _VERDICT_COLORS,
    _by_severity,
    _e,
    _valid_text,
)
from harness.reports.htmlreport.timeline import legend_html, timeline_svg, zoom_window
from harness.reports.logs import telling_logs


def _check_rows(checks: Sequence[NamedResult], interrupted: bool = False) -> str:
    rows = []
    for check in _by_severity(checks):
        word = _valid_text(check.valid, interrupted, check.not_judged)
        look = swatch(word)
        cls = {"pass": "pass", "fail": "fail", "neutral": "neutral"}.get(look.kind, "unknown")
        details = ""
        if check.valid is not True and check.details:
            details = (
                "<details><summary>details</summary><pre>"
                + _e(json.dumps(dict(check.details), default=str, indent=1)[:4000])
                + "</pre></details>"
            )
        rows.append(
            f"<tr class='{cls}'><td>{check.index + 1}</td><td>{_e(check.name)}</td>"
            f"<td class='word' style='color:{look.strong}'><span aria-hidden='true'>{look.glyph}</span> {word}</td>"
            f"<td>{_e(name_signals(str(check.summary)))}{details}</td></tr>"
        )
    return "".join(rows)


def _back(result: RunResult) -> str:
    """A link back to the index of the invocation the run belongs to (``<invocation>/<scenario>/
    <run>/``, its ``index.html`` there from the invocation's start: ``harness.reports.invocation``);
    nothing for a run outside one (the pytest plugin's)."""
    if not (Path(result.run_dir).parent.parent / "index.html").is_file():
        return ""
    return "<p class='back'><a href='../../index.html'>&larr; all runs of this invocation</a></p>"


def _why(result: RunResult) -> str:
    """Right under the badge: what went wrong, so no one has to scroll for it (a red box; amber
    for a known defect that reproduced, grey for a skip or an interrupted run)."""
    interrupted = result.status == "interrupted"
    bad = [c for c in _by_severity(result.checks) if c.valid is not True]
    items = [f"<li><b>not exercised</b>: {_e(why)}</li>" for why in result.not_exercised]
    if result.reason:
        items.append(f"<li><b>{_e(result.status)}</b>: {_e(result.reason)}</li>")
    for c in bad:
        items.append(f"<li><b>{_valid_text(c.valid, interrupted, c.not_judged)}</b> #{c.index + 1} {_e(c.name)}: {_e(name_signals(str(c.summary)))}</li>")
    if not items:
        return ""
    kind = {"skip": " neutral", "xfail": " warn"}.get(result.verdict, " neutral" if interrupted else "")
    head = f"{len(bad)} of {len(result.checks)} checks did not pass" if bad else "the run did not complete"
    if interrupted:
        head = f"the run was interrupted: {len(bad)} of {len(result.checks)} checks not judged (the run ended before them)"
    elif result.verdict == "skip":
        head = "skipped: nothing ran"
    elif result.verdict == "not_exercised":
        n = len(result.not_exercised)
        head = (f"not exercised: {n} fault{'s' if n != 1 else ''} did not do what the scenario meant, as measured "
                "(its witness below): the checks judged a run that did not happen, neither PASS nor FAIL")
    elif result.verdict == "xfail":
        head = f"the known defect reproduced: {len(bad)} of {len(result.checks)} checks did not pass, as expected"
    return f"<div class='why{kind}'><b>{_e(head)}</b><ul>{''.join(items)}</ul></div>{_load_caveat(result)}"


def _load_caveat(result: RunResult) -> str:
    """A note, not a failure: the machine was oversubscribed and a timing check failed
    (``harness.judge.timing.load_caveat``); nothing when no timing check failed."""
    from harness.judge.timing import load_caveat, timing_checks_failed
    from harness.record.results import command

    caveat = load_caveat(result)
    if not caveat:
        return ""
    names = ", ".join(f"\u201c{name}\u201d" for name in timing_checks_failed(result))
    return (f"<p class='caveat'>Note: the machine was loaded ({_e(caveat)}): more runnable tasks than CPUs, so the "
            f"timing check {_e(names)} may have failed for the machine rather than the subject; "
            f"<code>{_e(command())} run --repeat 5</code> tells.</p>")


def _next(result: RunResult) -> str:
    """What to do next about a run that did not pass (the commands the terminal printed too)."""
    from harness.reports.invocation import next_steps

    steps = next_steps(result)
    if not steps:
        return ""
    return "<div class='next'><b>What next</b><pre>" + _e("\n".join(steps)) + "</pre></div>"


def _ssh_hosts(result: RunResult) -> str:
    """The ssh hosts of the run: machine, data address and device, and each clock's probed offset
    and error bound (remote event times are mapped onto the harness clock with that offset)."""
    entry = result.history.last(actor="harness", f="ssh_clocks") or result.history.last(actor="harness", f="ssh_hosts")
    hosts = dict(entry.get("hosts") or {}) if entry is not None else {}
    if not hosts:
        return ""
    rows = []
    for name, host in hosts.items():
        clock = host.get("clock") or {}
        shown = []
        for when in ("start", "end"):
            probe = clock.get(when)
            if probe:
                shown.append(f"{when}: offset {float(probe['offset_s']) * 1000:+.3f} ms ± {float(probe['error_s']) * 1000:.3f} ms")
        lost = f" <b>lost: {_e(str(host['lost']))}</b>" if host.get("lost") else ""
        rows.append(f"<tr><td>{_e(name)}</td><td>{_e(str(host.get('machine')))} ({_e(str(host.get('ssh')))})</td>"
                    f"<td>{_e(str(host.get('address')))} {_e(str(host.get('device') or ''))}</td>"
                    f"<td>{_e('; '.join(shown))}{lost}</td></tr>")
    return ("<h2>ssh hosts</h2><table><tr><th>host</th><th>machine</th><th>data</th><th>clock vs harness</th></tr>"
            + "".join(rows) + "</table>")


def _repeat(result: RunResult, repeat: dict[str, Any] | None) -> str:
    """A run of ``mxchaos run --repeat N``: its place among the N, the scenario's cell and rate
    (the verdict that counts), and links to the other runs."""
    if not repeat:
        return ""
    cell = str(repeat.get("cell") or "?")
    rate = repeat.get("rate") or {}
    color = _CELL_COLORS.get(cell, _GREY)
    links = []
    here = Path(result.run_dir).resolve()
    for i, run in enumerate(repeat.get("runs") or [], 1):
        there = here / str(run.get("run_dir") or "")  # relative to this run's folder (an absolute one stays)
        text = f"{i}: {str(run.get('verdict') or '?').upper()}"
        if there.resolve() == here:
            links.append(f"<b>{_e(text)} (this run)</b>")
        else:
            href = os.path.relpath(there / "report.html", here)
            links.append(f"<a href='{_e(href)}'>{_e(text)}</a>")
    rate_text = f"{rate.get('k')}/{rate.get('n')}" if rate else "?"
    counted = "runs with the defect" if repeat.get("bound") is not None else "runs passed"
    bound = f", 95% upper bound {float(repeat['bound']):.3f}" if repeat.get("bound") is not None else ""
    measured = repeat.get("measured")
    measured_text = f", measured {measured['k']}/{measured['n']}" if measured else ""
    note = f"<br>{_e(repeat['note'])}" if repeat.get("note") else ""
    return (f"<p class='repeat' style='border-left:4px solid {color};padding-left:8px'>"
            f"Run {_e(repeat.get('index'))} of {_e(repeat.get('of'))} of this scenario "
            f"(<code>--repeat {_e(repeat.get('of'))}</code>). The scenario's verdict is its cell: "
            f"<span class='badge' style='background:{color}'>{_e(cell)}</span> {_e(rate_text)} {counted}"
            f"{_e(bound)}{_e(measured_text)}.{note}<br>Runs: {' · '.join(links)}</p>")


def render_html(result: RunResult, versions: dict[str, Any] | None = None,
                repeat: dict[str, Any] | None = None) -> str:
    """The whole page of one run, self-contained."""
    h = result.history
    sc = result.scenario
    versions = versions or {}
    color = _VERDICT_COLORS.get(result.verdict, _GREY)
    processes = list(sc.processes)
    passed = sum(1 for c in result.checks if c.valid is True)
    crashed = f" <span class='badge' style='background:{_RED}'>CRASHED</span>" if result.status == "crashed" else ""
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>{_e(sc.name)}: {_e(result.verdict.upper())}</title>",
        f"<style>{_CSS}</style></head><body>",
        _back(result),
        f"<h1>{_e(sc.name)} {glyph_badge(result.verdict)}{crashed}</h1>",
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
    parts.append(_repeat(result, repeat))
    parts.append(_why(result))
    parts.append(_next(result))
    parts.append(_ssh_hosts(result))
    parts.append(f"<h2>Checks <small>({passed}/{len(result.checks)} passed)</small></h2>")
    if result.checks:
        parts.append("<table class='checks'><tr><th>#</th><th>check</th><th>verdict</th><th>summary</th></tr>")
        parts.append(_check_rows(result.checks, result.status == "interrupted") + "</table>")
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
        ("machine load", run_load(h) or "-"),
    ]
    parts.append("<h2>Timeline <small>(time in seconds since the run started)</small></h2>")
    host_of = {p: sc.host_of(p) for p in processes}
    interrupted = result.status == "interrupted"
    svgs = [timeline_svg(h, processes, result.checks, host_of, interrupted)]
    parts.append("<div class='fig'>" + svgs[0] + "</div>")
    zoom = zoom_window(h)
    if zoom is not None:  # the crucial seconds, readable: the fault windows on an axis of their own
        svgs.append(timeline_svg(h, processes, result.checks, host_of, interrupted, window=zoom))
        parts.append(f"<h3 id='zoom'>Zoomed: the fault windows, {zoom[0]:.2f} s to {zoom[1]:.2f} s</h3>"
                     f"<div class='fig'>{svgs[1]}</div>")
    parts.append(legend_html(*svgs))
    parts.append(_telling_logs(result))
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
    for name in ("scenario.yaml", "timeline.jsonl", "metrics.jsonl", VERDICT, "junit.xml", VERSIONS):
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


def _telling_logs(result: RunResult) -> str:
    """The last lines of the log of the process the first failing check names and of each one
    that died by a signal (``harness.reports.logs``), inline: no click away."""
    found = telling_logs(result)
    if not found:
        return ""
    parts = ["<h2>Logs that tell</h2>"]
    for process, why, log in found:
        where = relative(log, result.run_dir)
        parts.append(f"<p><b>{_e(process)}</b> ({_e(why)}): the last {_TAIL} lines of <a href='{_e(where)}'>{_e(where)}</a></p>"
                     f"<pre class='tail'>{_e(log_tail(log, _TAIL)) or '(empty)'}</pre>")
    return "".join(parts)


_TAIL = 20


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
        f"<td>{'-' if w.end is None else f'{w.end:.3f}'}</td><td>{_e(_fault_outcome(w))}</td>{_witness_cell(w, h)}</tr>"
        for w in windows
    )
    return _table("Faults", ("fault", "kind", "target", "from (s)", "until (s)", "outcome", "witness"), rows)


def _witness_cell(w: FaultWindow, h: History) -> str:
    """What the fault measured of its effect: the words, coloured (no effect: NOT EXERCISED's
    colour), its figures in the title; a negative control says so."""
    witness = fault_witness(w, h)
    if witness is None:
        return "<td>-</td>"
    control = "" if w.expect_effect else " (negative control: expect_effect false)"
    missed = (witness.effect == "none") == w.expect_effect and witness.effect != "unwitnessed"
    style = f" style='color:{swatch('not_exercised').strong};font-weight:700'" if missed else ""
    figures = json.dumps(dict(witness.figures), default=str)
    return f"<td class='witness'{style} title='{_e(figures)}'>{_e(witness.describe() + control)}</td>"


def _fault_outcome(w: FaultWindow) -> str:
    """``healed (by teardown)``, ``failed: why``...: a fault window's outcome as a cell."""
    text = w.outcome + (" (indeterminate)" if w.indeterminate else "")
    if w.outcome == "healed" and w.heal_reason == "teardown":
        text += " (by teardown)"
    elif w.outcome == "active":
        text += " at the end of the run"
    return text + (f": {w.error}" if w.error else "")


def _processes_table(h: History, roles: dict[str, str]) -> str:
    rows = []
    for name, role in roles.items():
        incs = h.incarnations(name)
        desc = "; ".join(
            f"#{i.incarnation} pid {i.pid}: {i.start:.3f}-{'?' if i.end is None else f'{i.end:.3f}'}s rc {i.rc}"
            + (f" ({signal_name(i.rc)})" if isinstance(i.rc, int) and signal_name(i.rc) else "")
            + (" (stopped)" if i.stopped_by_harness else "")
            for i in incs
        )
        links = f"<a href='procs/{_e(name)}.log'>log</a>"
        if role != "command":
            links += f" <a href='procs/{_e(name)}.events.jsonl'>events</a>"
        rows.append(f"<tr><td>{_e(name)}</td><td>{_e(role)}</td><td>{_e(desc or 'never started')}</td><td>{links}</td></tr>")
    return _table("Processes", ("process", "role", "incarnations", "files"), rows)
