"""Terminal output: live progress while a run goes, a verdict table at the end (and, for
``mxchaos run --repeat N`` and ``mxchaos nightly``, the rate table: one cell per scenario,
``harness.record.rates``), each closed by the same recap (``recap_lines``, the one builder of it;
the CI step summary tabulates the same entries) and a tally."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from harness.judge.verdict import RunResult
from harness.record.deaths import name_signals
from harness.record.fault_windows import FaultEntry
from harness.record.results import command
from harness.record.timeline import Entry
from harness.record.vocabulary import meaning
from harness.scenario.select import shown as _shown

if TYPE_CHECKING:
    from harness.record.rates import Cell

__all__ = ["Progress", "RecapEntry", "interrupt_line", "rate_table", "recap_lines", "tell", "verdict_table", "write_recap"]

_VERDICT_PAINT = {
    "pass": "32",
    "fail": "31",
    "unknown": "33",
    "hang": "35",
    "error": "31",
    "xfail": "33",
    "xpass": "1;36",
    "skip": "2",
    "not_exercised": "1;35",
}

_CELL_PAINT = {
    "PASS": "32",
    "FLAKY": "1;31",
    "FAIL": "31",
    "UNKNOWN": "33",
    "HANG": "35",
    "ERROR": "31",
    "SKIP": "2",
    "XFAIL": "33",
    "FIXED?": "1;36",
    "XPASS": "1;36",
    "NOT_EXERCISED": "1;35",
    "ENV_BROKEN": "31",
}

_PROCESS_EVENTS = {
    "status_change": ("status",),
    "load_done": ("path", "source", "seconds", "integrity"),
    "fallback": ("reason",),
    "transfer_timeout": ("index", "seconds"),
    "transfer_error": ("index", "error"),
    "load_failed": ("error",),
    "attempt_outcome": ("index", "outcome"),
}


def tell(line: str) -> None:
    """One line for the person at the terminal, at once (stderr, flushed; never raises: it is
    called from signal handlers)."""
    try:
        sys.stderr.write(f"mxchaos: {line}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def interrupt_line(signum: int, faults: Sequence[str], procs: Sequence[str]) -> str:
    """What an interrupt of a run will heal and stop, in one line."""
    heal = f"healing {len(faults)} fault(s) ({', '.join(faults)})" if faults else "no fault to heal"
    stop = f"stopping {len(procs)} process(es) ({', '.join(procs)})" if procs else "no process to stop"
    again = "; Ctrl-C again to kill them without their grace" if signum == signal.SIGINT and procs else ""
    return f"interrupted ({signal.Signals(signum).name}): {heal}, {stop}{again}"


def _use_color(stream: TextIO) -> bool:
    return hasattr(stream, "isatty") and stream.isatty() and not os.environ.get("NO_COLOR")


class Progress:
    """An observer for ``Runner(observers=[...])``: one line per interesting entry."""

    def __init__(self, stream: TextIO | None = None, scenario: str = "") -> None:
        self.stream = stream or sys.stdout
        self.scenario = scenario
        self.color = _use_color(self.stream)
        self._lock = threading.Lock()

    def _paint(self, text: str, code: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.color else text

    def __call__(self, e: Entry) -> None:
        line = self._line(e)
        if line is None:
            return
        with self._lock:
            self.stream.write(f"{self._paint(f'{e.t:8.3f}s', '2')} {line}\n")
            self.stream.flush()

    def _line(self, e: Entry) -> str | None:
        if e.actor == "harness":
            if e.f == "step" and e.type == "invoke":
                return f"step {e.get('step')}: {e.get('text')}"
            if e.f == "step" and e.type == "fail":
                return self._paint(f"step {e.get('step')} FAILED: {e.get('error')}", "31")
            if e.f in ("hang", "await_timeout"):
                return self._paint(f"{e.f.upper()}: {e.get('reason') or e.get('error')}", "35")
            if e.f == "prepare" and e.type != "invoke":
                return f"prepare checkpoint: {e.type} ({e.get('seconds')}s)"
            if e.f == "toxiproxy" and e.type != "invoke":
                if e.type == "ok":
                    return f"toxiproxy: started (pid {e.get('pid')}, api {e.get('api')})"
                return self._paint(f"toxiproxy: FAILED: {e.get('error')}", "31")
            if e.f == "proxy" and e.type != "invoke":
                if e.type == "ok":
                    return f"proxy {e.get('proxy')}: {e.get('listen')} -> {e.get('upstream')}"
                return self._paint(f"proxy {e.get('proxy')}: FAILED: {e.get('error')}", "31")
            if e.f == "toxiproxy_exit":
                return self._paint(f"toxiproxy: exited (rc {e.get('rc')}) before teardown; its proxies are gone", "31")
            if e.f == "leak_scan" and (e.get("processes") or e.get("ports")):
                return self._paint(f"leaked: {len(e.get('processes'))} process(es), ports {e.get('ports')}", "31")
            return None
        fault = FaultEntry.of(e)
        if fault is not None and fault.type != "invoke":
            what = "injected" if fault.action == "inject" else "healed"
            text = fault.describe()
            if fault.type == "ok":
                return self._paint(f"{text} {what}", "33")
            if fault.skipped:  # its target was gone and its if_gone is skip
                return self._paint(f"{text} skipped: {fault.skipped}", "33")
            return self._paint(f"{text} {fault.action} {fault.type.upper()}: {fault.error or ''}", "31" if fault.type == "fail" else "33")
        if e.f == "start" and e.type == "ok":
            return f"{e.actor}: started (pid {e.get('pid')}, #{e.get('incarnation')})"
        if e.f == "process_exit":  # one the harness stopped gets its "stopped" line next
            if e.get("stopped_by_harness"):
                return None
            how = f"signal {e.get('signal')}" if e.get("signal") else f"rc {e.get('rc')}"
            return f"{e.actor}: exited ({how})"
        if e.f == "stop" and e.type == "ok":
            esc = ", escalated to KILL" if e.get("escalated") else ""
            return f"{e.actor}: stopped (rc {e.get('rc')}{esc})"
        if e.f in _PROCESS_EVENTS:
            fields = " ".join(f"{k}={e.get(k)}" for k in _PROCESS_EVENTS[e.f] if e.get(k) is not None)
            return f"{e.actor}: {e.f} {fields}"
        return None


def verdict_table(results: Sequence[RunResult], stream: TextIO | None = None, *, quiet: bool = False,
                  verbose: bool = False) -> None:
    """The check tables of the runs that did not pass (of every run with ``verbose`` or when
    there is one run), a row per run, and for more than one run the recap (``recap_lines``:
    a line per run that did not pass); the tally last. ``quiet``: the runs that passed get no
    row either (every other verdict, skip and xfail too, still does), the tally counts all."""
    out = stream or sys.stdout
    if not results:
        return
    shown = [r for r in results if not quiet or r.verdict != "pass"]
    detailed = [r for r in shown if verbose or len(results) == 1 or r.verdict != "pass"]
    color = _use_color(out)

    def p(text: str, key: str) -> str:
        return f"\033[{_VERDICT_PAINT.get(key, '0')}m{text}\033[0m" if color else text

    for result in detailed:
        out.write(f"\n{result.scenario.name}  (seed {result.seed}, {result.seconds:.1f}s)  {result.run_dir}\n")
        if result.verdict == "skip":
            out.write(f"  {p('SKIP', 'skip')}: {result.reason}\n")
            continue
        if result.status != "completed":
            out.write(f"  {result.status}: {result.reason}\n")
        if result.known_defect:
            word = result.verdict.upper() if result.verdict in ("xfail", "xpass") else ""
            out.write(f"  known defect{f' ({word})' if word else ''}: {result.known_defect}\n")
        for why in result.not_exercised:
            out.write(f"  {p('NOT EXERCISED', 'not_exercised')} {why}\n")
        width = max([len(c.name) for c in result.checks] + [5])
        cut = result.status == "interrupted"  # a check it did not pass: the run ended before it was judged whole
        for c in result.checks:
            key = "pass" if c.valid is True else "fail" if c.valid is False else "unknown"
            word = "NOT JUDGED" if (cut and c.valid is not True) or c.not_judged else key.upper()
            out.write(f"  {p(f'{word:7}', 'skip' if word == 'NOT JUDGED' else key)} {c.name:{width}}  {name_signals(c.summary)}\n")
    out.write("\n")
    name_w = max([len(r.scenario.name) for r in shown] + [8])
    if shown:
        out.write(f"{'scenario':{name_w}}  verdict  checks (pass/fail/unknown)\n")
    for r in shown:
        n_pass = sum(1 for c in r.checks if c.valid is True)
        n_fail = sum(1 for c in r.checks if c.valid is False)
        n_unk = len(r.checks) - n_pass - n_fail
        note = f"  {meaning(r.verdict)}" if r.verdict in ("xfail", "xpass") else ""
        if r.verdict == "skip":
            note = f"  {r.reason}"
        elif r.verdict == "not_exercised" and r.not_exercised:
            note = f"  {r.not_exercised[0]}"
        out.write(f"{r.scenario.name:{name_w}}  {p(f'{r.verdict.upper():7}', r.verdict)}  {n_pass}/{n_fail}/{n_unk}{note}\n")
    xpassed = [r for r in results if r.verdict == "xpass"]
    if xpassed:
        out.write("\n")
        for r in xpassed:
            out.write(
                p(f"XPASS {r.scenario.name}: every check passed, the known defect did not reproduce in this run.", "xpass")
                + f"\n  defect: {r.known_defect}\n  One run cannot call it fixed: `{command()} run --repeat N` calls it FIXED? only when its "
                f"confidence bound falls below the measured rate; then remove `known_defect` from {r.scenario.path or 'the scenario'}.\n"
            )
    if len(results) > 1:
        write_recap(out, recap_lines(results), color)
    counts: dict[str, int] = {}
    for r in results:
        counts[r.verdict] = counts.get(r.verdict, 0) + 1
    tally = ", ".join(p(f"{n} {verdict.upper()}", verdict) for verdict, n in counts.items())
    total = sum(r.seconds for r in results)
    out.write(f"\n{len(results)} scenario{'s' if len(results) != 1 else ''}: {tally} in {total:.1f}s\n")
    out.flush()


# the recap's order: what fails the run first, then the known defects, then what did not run
_RECAP_ORDER = ("FAIL", "FLAKY", "ERROR", "HANG", "UNKNOWN", "NOT_EXERCISED", "XPASS", "FIXED?", "XFAIL", "SKIP")
_RECAP_WIDTH = 100  # a first failing check's text is cut here on the terminal: the page has it whole


@dataclass(frozen=True)
class RecapEntry:
    """One line of a closing recap: a run (or a cell of ``--repeat N`` runs) that did not pass.
    ``word``: its verdict or cell, upper case; ``count``: a cell's rate as words (``passed 1/2``,
    '' for a single run); ``why``: its first failing check (a skip's reason, a cell that did not
    fail the run its note), whole; ``page``: the path of the page of the run it speaks of, as a
    person types it ('' for a skip); ``rerun``: the command that reruns that run, only for what
    fails the run (nothing to fix in a known defect or a skip)."""

    word: str
    scenario: str
    why: str
    page: str = ""
    rerun: str = ""
    count: str = ""

    def line(self, width: int = _RECAP_WIDTH) -> str:
        why = self.why if len(self.why) <= width else self.why[: width - 3] + "..."
        return "  ".join(part for part in (self.scenario, self.count, why, self.page) if part)


def _rank(word: str) -> int:
    return _RECAP_ORDER.index(word) if word in _RECAP_ORDER else 0  # a word of no outcome (ENV_BROKEN) first


def _why(result: RunResult) -> str:
    from harness.reports.invocation import first_failing_check

    if result.verdict == "skip":
        why = result.reason
    elif result.verdict == "not_exercised" and result.not_exercised:
        why = result.not_exercised[0]
    else:
        why = first_failing_check(result) or f"{result.status}: {result.reason}"
    return name_signals(why)


def _page(run_dir: Path | str) -> str:
    return _shown(Path(run_dir) / "report.html")


def _cell_entry(cell: Cell, by_dir: Mapping[str, RunResult]) -> RecapEntry:
    """A cell's line: the run it speaks of is its first failing run (else its first run where the
    defect showed, else its first run); that run's first failing check, page and rerun command."""
    from harness.reports.invocation import rerun_command

    runs = cell.failing_runs or tuple(r for r in cell.runs if r.verdict == "xfail") or cell.runs
    record = runs[0] if runs else None
    result = by_dir.get(record.run_dir) if record is not None else None
    count = "" if cell.name == "SKIP" else f"{'showed' if cell.known_defect else 'passed'} {cell.rate}"
    if result is None:  # a run this process did not see (a lane of another machine): what the cell holds
        why = cell.note or (record.verdict if record is not None else "")
        page = _page(record.run_dir) if record is not None and record.verdict != "skip" else ""
        return RecapEntry(cell.name, cell.scenario, why, page, "", count)
    why = cell.note if cell.name in ("XPASS", "FIXED?") else _why(result)
    page = "" if result.verdict == "skip" else _page(result.run_dir)
    return RecapEntry(cell.name, cell.scenario, why, page, rerun_command(result) if cell.fails_run else "", count)


def recap_lines(results: Sequence[RunResult], cells: Sequence[Cell] | None = None) -> list[RecapEntry]:
    """The closing recap, what fails the run first: an entry per run that did not pass or, given
    ``cells`` (``--repeat N``: a scenario's runs judged as one), per cell that is not PASS, told
    from its first failing run (``results``: the runs, found by their folder)."""
    from harness.reports.invocation import rerun_command

    if cells is not None:
        by_dir = {str(r.run_dir): r for r in results}
        entries = [_cell_entry(c, by_dir) for c in cells if c.name != "PASS"]
    else:
        entries = [RecapEntry(r.verdict.upper(), r.scenario.name, _why(r), "" if r.verdict == "skip" else _page(r.run_dir),
                              rerun_command(r)) for r in results if r.verdict != "pass"]
    return sorted(entries, key=lambda e: _rank(e.word))


def write_recap(out: TextIO, recap: Sequence[RecapEntry], color: bool = False) -> None:
    """The recap block (``short summary``): a line per entry, the rerun command under it."""
    if not recap:
        return
    out.write(f"\n{'short summary':-^72}\n")
    width = max(len(e.word) for e in recap)
    for e in recap:
        word = f"{e.word:{width}}"
        out.write(f"{_paint(word, _CELL_PAINT.get(e.word, '0'), color)}  {e.line()}\n")
        if e.rerun:
            out.write(f"{'':{width}}  rerun:  {e.rerun}\n")


def _paint(text: str, code: str, color: bool) -> str:
    return f"\033[{code}m{text}\033[0m" if color else text


def rate_table(cells: Sequence[Cell], repeat: int, stream: TextIO | None = None,
               results: Sequence[RunResult] = ()) -> None:
    """One row per scenario: its cell, rate k/n, the bound and measured rate of a known defect,
    and under a cell that fails the run (or a defect's cell) the runs that went wrong; then the
    closing recap (``recap_lines`` of the cells: a line per cell that is not PASS, told from its
    first failing run among ``results``) and the tally last."""
    out = stream or sys.stdout
    if not cells:
        return
    color = _use_color(out)

    def p(text: str, key: str) -> str:
        return f"\033[{_CELL_PAINT.get(key, '0')}m{text}\033[0m" if color else text

    name_w = max([len(c.scenario) for c in cells] + [8])
    cell_w = max(len(c.name) for c in cells)
    out.write(f"\n{'scenario':{name_w}}  {'cell':{cell_w}}  rate    (--repeat {repeat}; bound: one-sided 95% Clopper-Pearson)\n")
    for c in cells:
        what = "passed" if not c.known_defect else "defect showed"
        extra = f"  bound {c.bound:.3f}" if c.bound is not None else ""
        extra += f", measured {c.measured} ({c.measured.value:.3f})" if c.measured is not None else ""
        out.write(f"{c.scenario:{name_w}}  {p(f'{c.name:{cell_w}}', c.name)}  {c.rate!s:6}  {what}{extra}\n")
        if c.name not in ("PASS", "XFAIL", "SKIP"):
            out.write(f"{'':{name_w}}  {c.note}\n")
        if c.fails_run:
            for r in c.failing_runs:
                out.write(f"{'':{name_w}}    {r.verdict.upper():7} seed {r.seed}  {_shown(Path(r.run_dir))}\n")
    write_recap(out, recap_lines(results, cells), color)
    counts: dict[str, int] = {}
    for c in cells:
        counts[c.name] = counts.get(c.name, 0) + 1
    tally = ", ".join(p(f"{n} {name}", name) for name, n in counts.items())
    failing = sum(1 for c in cells if c.fails_run)
    verdict = f"{failing} fail the run" if failing else "none fails the run"
    out.write(f"\n{len(cells)} scenario{'s' if len(cells) != 1 else ''} x {repeat}: {tally}; {verdict}\n")
    out.flush()
