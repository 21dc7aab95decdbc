"""The kill matrix: which scenario killed which mutant, by which check, timing-only or not.

A cell (mutant x scenario) is ``killed`` when a run of the scenario failed through a check that
is not a time bound (or a step that failed on what happened, not on a wait running out);
``timing`` when every failure was a time bound (the machine's load can do that: such cells are
rerun, and ``rate`` says in how many runs it failed); ``flaky`` when a kill through a failed step
(a process that crashed, an event that never came: the machine may have done it) did not
reproduce in every rerun (``to_confirm``); ``survived`` when it passed; ``baseline``
when the scenario did not pass with the unmutated subject (it judges nothing then). A mutant is
``killed`` by the scenarios of its killed cells. ``write`` saves ``mutate.json`` and a plain
``mutate.html``.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.mutate.runs import Outcome

__all__ = ["cell", "mutant_row", "to_confirm", "write"]


def to_confirm(runs: Sequence[Outcome]) -> bool:
    """Whether a cell's kills need reruns: every kill so far was timing-only or came with a failed step."""
    killed = [o for o in runs if o.killed]
    return bool(killed) and all(o.timing_only or o.step is not None for o in killed)


def cell(runs: Sequence[Outcome], baseline: Sequence[Outcome]) -> dict[str, Any]:
    """One mutant x scenario cell from its runs (first run, then any reruns)."""
    if not baseline or any(o.killed for o in baseline):
        state = "baseline"
    elif not runs:
        state = "not_run"
    elif any(o.killed and not o.timing_only for o in runs) and (
            not all(o.step is not None for o in runs if o.killed) or all(o.killed for o in runs)):
        state = "killed"
    elif any(o.killed and not o.timing_only for o in runs):
        state = "flaky"
    elif any(o.killed for o in runs):
        state = "timing"
    else:
        state = "survived"
    by = sorted({c.name for o in runs for c in o.failed if not c.timing and c.valid is False})
    steps = sorted({o.step for o in runs if o.step})
    return {"state": state, "by": by, "timing_by": sorted({c.name for o in runs for c in o.failed if c.timing}),
            "steps": steps, "rate": {"k": sum(o.killed for o in runs), "n": len(runs)},
            "runs": [o.to_json() for o in runs]}


def mutant_row(name: str, summary: str, cells: Mapping[str, dict[str, Any]], error: str | None = None) -> dict[str, Any]:
    killed_by = sorted(s for s, c in cells.items() if c["state"] == "killed")
    timing_by = sorted(s for s, c in cells.items() if c["state"] == "timing")
    verdict = "not_applied" if error else "killed" if killed_by else "timing_only" if timing_by else "survived"
    return {"name": name, "summary": summary, "verdict": verdict, "error": error, "killed_by": killed_by,
            "timing_only_by": timing_by, "flaky_by": sorted(s for s, c in cells.items() if c["state"] == "flaky"),
            "cells": dict(cells)}


def write(out: Path, matrix: dict[str, Any]) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    js, page = out / "mutate.json", out / "mutate.html"
    js.write_text(json.dumps(matrix, indent=1, default=str) + "\n")
    page.write_text(_html(matrix))
    return js, page


_COLOURS = {"killed": "#c8f0c8", "timing": "#fff0b0", "flaky": "#ffd8a8", "survived": "#f8c8c8", "baseline": "#e0e0e0",
            "not_run": "#ffffff"}


def _html(matrix: dict[str, Any]) -> str:
    scenarios: list[str] = list(matrix.get("scenarios") or [])
    head = "".join(f"<th>{html.escape(s)}</th>" for s in scenarios)
    rows = []
    for m in matrix.get("mutants") or []:
        tds = []
        for s in scenarios:
            c = (m.get("cells") or {}).get(s)
            if c is None:
                tds.append("<td></td>")
                continue
            words = ", ".join(c["by"]) if c["state"] == "killed" else ", ".join(c["timing_by"] or c["steps"])
            rate = c["rate"]
            tds.append(f'<td style="background:{_COLOURS.get(c["state"], "#fff")}" title="{html.escape(words)}">'
                       f'{html.escape(c["state"])} {rate["k"]}/{rate["n"]}<br><small>{html.escape(words[:160])}</small></td>')
        label = f'<b>{html.escape(m["name"])}</b><br><small>{html.escape(m.get("summary") or "")}</small>'
        if m.get("error"):
            label += f'<br><small style="color:#a00">{html.escape(m["error"][:300])}</small>'
        killers = len(m.get("killed_by") or [])
        rows.append(f'<tr><td>{label}</td><td>{html.escape(m["verdict"])} ({killers})</td>{"".join(tds)}</tr>')
    legend = ("killed: a check that is not a time bound failed; timing: only time bounds failed (rerun: k/n "
              "runs failed); flaky: a kill through a failed step that a rerun did not reproduce; survived: every run passed; baseline: the scenario failed without a mutant")
    return ("<!doctype html><meta charset=utf-8><title>mxchaos mutate</title>"
            "<style>body{font-family:sans-serif}td,th{border:1px solid #999;padding:4px;vertical-align:top;"
            "font-size:13px}table{border-collapse:collapse}</style>"
            f"<h1>mxchaos mutate</h1><p>{html.escape(str(matrix.get('command') or ''))}</p><p>{html.escape(legend)}</p>"
            f"<table><tr><th>mutant</th><th>verdict (killing scenarios)</th>{head}</tr>{''.join(rows)}</table>\n")
