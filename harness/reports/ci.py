"""What a CI system shows of an invocation: the text of a JUnit failure (plain lines a person
reads in a test tab: the failing check, the rerun command, the page's path, the tail of the log
of the process the check names or that died) and, when ``$GITHUB_STEP_SUMMARY`` names a file, a
markdown summary appended to it (the headline as the exit code says it, the verdict counts, the
closing recap as a table: a row per run, or per ``--repeat N`` cell, that did not pass with its
first failing check, page and rerun command, the paths of the index and the pages).

Paths in JUnit are relative to the folder the XML lies in (``harness.record.saved.relative``);
paths in the step summary are as a person types them from the working folder (the repository
root in a CI job), which is also where the job's uploaded artefact keeps them."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.judge.verdict import RunResult
from harness.record.deaths import log_tail, name_signals
from harness.record.rates import Cell
from harness.record.saved import relative
from harness.reports.invocation import rerun_command
from harness.reports.logs import check_log, telling_logs
from harness.scenario.select import shown

__all__ = ["STEP_SUMMARY", "check_failure_text", "run_failure_text", "step_summary", "write_step_summary"]

STEP_SUMMARY = "GITHUB_STEP_SUMMARY"
_TAIL_LINES = 20


def _page(result: RunResult, base: Path | None) -> str:
    page = result.run_dir / "report.html"
    return relative(page, base) if base is not None else shown(page)


def _tail_block(process: str, why: str, log: Path, base: Path | None) -> list[str]:
    where = relative(log, base) if base is not None else shown(log)
    text = log_tail(log, _TAIL_LINES)
    head = f"log of {process} ({why}): {where}, last {_TAIL_LINES} lines:"
    return [head, *(f"  | {line}" for line in text.splitlines())] if text else [f"{head} (empty)"]


def _header(result: RunResult, base: Path | None) -> list[str]:
    return [f"scenario: {result.scenario.name} (seed {result.seed}, {result.verdict.upper()}, {result.seconds:.1f}s)",
            f"rerun:    {rerun_command(result, passing_too=True)}",  # a known defect's run too
            f"page:     {_page(result, base)}"]


def check_failure_text(result: RunResult, check: Any, base: Path | None = None) -> str:
    """A failing (or unknown) check's JUnit body: the check, the scenario, the rerun command, the
    page, the check's details as ``key: value`` lines and the tail of the log of the process it
    names (else of one that died by a signal)."""
    lines = [f"check:    {check.name}: {name_signals(str(check.summary))}", *_header(result, base)]
    details = dict(getattr(check, "details", {}) or {})
    if details:
        lines.append("details:")
        for key, value in details.items():
            text = name_signals(str(value))
            lines.append(f"  {key}: {text if len(text) <= 300 else text[:297] + '...'}")
    named = check_log(result, check)
    if named is not None:
        lines += _tail_block(named[0], f"named by {check.name}", named[1], base)
    else:
        lines += [block for p, why, log in telling_logs(result)[:1] for block in _tail_block(p, why, log, base)]
    return "\n".join(lines)[:16000]


def run_failure_text(result: RunResult, base: Path | None = None) -> str:
    """The run testcase's body when the run itself failed (a step, a hang, an error): what
    happened, the scenario's lines and the logs that tell it."""
    lines = [f"run:      {result.status}: {name_signals(result.reason)}", *_header(result, base)]
    for process, why, log in telling_logs(result)[:2]:
        lines += _tail_block(process, why, log, base)
    return "\n".join(lines)[:16000]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def step_summary(results: Sequence[RunResult], index: Path, cells: Sequence[Cell] | None = None,
                 title: str = "mxchaos", verdict: str | None = None) -> str:
    """The markdown of an invocation for a CI job's page: the headline (``verdict``, the word of
    the exit code: passed, failed, interrupted; by default from the cells, else the runs), the
    counts, a table of the closing recap (``harness.reports.console.recap_lines``: a row per run
    that did not pass or, given ``cells``, per cell that is not PASS; what fails the job first)
    with the first failing check, page and rerun command, and the index's path."""
    from harness.reports.console import recap_lines

    tally: dict[str, int] = {}
    for word in ([c.name for c in cells] if cells is not None else [r.verdict.upper() for r in results]):
        tally[word] = tally.get(word, 0) + 1
    if verdict is None:
        failing = any(c.fails_run for c in cells) if cells is not None else any(not r.ok for r in results)
        verdict = "failed" if failing else "passed"
    size = (f"{len(cells)} scenario(s), {sum(len(c.runs) for c in cells)} run(s)" if cells is not None
            else f"{len(results)} run(s)")
    lines = [f"### {title}: {verdict}, {size}", "", " · ".join(f"**{n}** {word}" for word, n in tally.items()), ""]
    recap = recap_lines(results, cells)
    if recap:
        lines += ["| verdict | scenario | first failing check | page | rerun |", "|---|---|---|---|---|"]
        for e in recap:
            why = e.why if len(e.why) <= 160 else e.why[:157] + "..."
            scenario = f"{e.scenario} ({e.count})" if e.count else e.scenario
            page = f"`{e.page}`" if e.page else ""
            rerun = f"`{e.rerun}`" if e.rerun else ""
            lines.append(f"| {e.word} | {_cell(scenario)} | {_cell(why)} | {page} | {_cell(rerun)} |")
        lines.append("")
    lines += [f"index: `{shown(index)}` (paths from the working folder, as the uploaded artefact keeps them)", ""]
    return "\n".join(lines)


def write_step_summary(markdown: str, environ: Mapping[str, str] | None = None) -> Path | None:
    """Append ``markdown`` to the file ``$GITHUB_STEP_SUMMARY`` names (None, nothing written,
    when it is unset or empty); an unwritable file is said on stderr, not raised: a summary
    never fails the run."""
    target = (environ if environ is not None else os.environ).get(STEP_SUMMARY)
    if not target:
        return None
    path = Path(target)
    try:
        with path.open("a", encoding="utf-8") as f:
            f.write(markdown if markdown.endswith("\n") else markdown + "\n")
    except OSError as exc:
        import sys

        print(f"mxchaos: ${STEP_SUMMARY} ({target}) not written: {exc}", file=sys.stderr)
        return None
    return path
