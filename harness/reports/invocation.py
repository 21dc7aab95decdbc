"""One folder per ``mxchaos run`` invocation, and the suite's terminal lines.

Without ``--out``, an invocation gets a folder of its own, ``runs/<UTC stamp>[-N]/``, made
exclusively (two invocations started in the same second get ``-2``, ``-3``), and
``runs/latest`` points at the newest once it ends; with ``--out DIR`` the folder is ``DIR``
itself (the matrix runs each column into a folder of its choosing). In the folder: every run's
folder (``<scenario>/<stamp>-<id>/``, ``<scenario>/latest``), ``summary.json`` (the shape of
``harness.record.rates``), ``junit.xml``, ``invocation.json`` (a night's shape, ``harness.reports.night``, with
``"kind": "run"``) and ``index.html``, the nightly's page over ``invocation.json``: a row per scenario,
a cell per run linked to its ``report.html``. Nothing a later invocation writes replaces them.

``SuiteProgress`` prints a scenario's start and end as ``[i/N]`` lines with the running tallies
and an estimate of what is left: each scenario's duration in the previous invocation under the
same root (``runs/latest/invocation.json``), else the mean of this invocation's runs so far. A line of
a run that did not pass names its first failing check and what to do next: the exact rerun
command (its seed; ``--repeat 5`` when the failing check is a timing bound), the replay
command, and the log of the process the failing check names.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import shlex
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from harness.judge.timing import is_time_bound, load_caveat, timing_checks_failed
from harness.judge.verdict import RunResult
from harness.record.load import load_sample
from harness.record.results import command as mxchaos_command
from harness.record.results import results_root
from harness.record.saved import INVOCATION, NightDoc, SummaryDoc
from harness.scenario.select import shown

__all__ = ["Invocation", "SuiteProgress", "first_failing_check", "is_time_bound", "json_summary", "load_caveat",
           "next_steps", "open_invocation", "rerun_command", "timing_checks_failed"]

RECORD = INVOCATION
_PASSING = ("pass", "xfail", "xpass", "skip")


@dataclass
class Invocation:
    """Where one ``mxchaos run`` writes: ``folder``; ``root`` holds ``latest`` (None: ``--out``
    named the folder, which then has no ``latest`` of its own)."""

    folder: Path
    root: Path | None
    started: dt.datetime
    started_mono: float = field(default_factory=time.monotonic)
    load: dict[str, Any] = field(default_factory=load_sample)  # the machine's, when it started

    @property
    def name(self) -> str:
        return self.folder.name

    def previous_durations(self) -> dict[str, float]:
        """Each scenario's median run seconds in the previous invocation under the same root."""
        if self.root is None:
            return {}
        doc = NightDoc.read_or_none(self.root / "latest" / RECORD)
        out: dict[str, float] = {}
        for s in doc.scenarios if doc is not None else []:
            if s.median_seconds is not None:
                out[s.name] = s.median_seconds
        return out

    def link_latest(self) -> None:
        """``root/latest`` -> this folder, replaced atomically (the last invocation to end wins)."""
        if self.root is None:
            return
        link, tmp = self.root / "latest", self.root / f".latest-{os.getpid()}"
        with contextlib.suppress(OSError):
            if tmp.is_symlink():
                tmp.unlink()
            tmp.symlink_to(self.folder.name)
            os.replace(tmp, link)


def open_invocation(out: str | Path | None, now: dt.datetime | None = None) -> Invocation:
    """The folder of a new invocation (see the module docstring); ``out``: ``--out`` or None."""
    start = now or dt.datetime.now(dt.UTC)
    if out is not None:
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        _placeholder_index(folder)
        return Invocation(folder.resolve(), None, start)
    root = results_root()
    root.mkdir(parents=True, exist_ok=True)
    base = start.strftime("%Y%m%dT%H%M%SZ")
    for n in range(1, 1000):
        name = base if n == 1 else f"{base}-{n}"
        try:
            (root / name).mkdir()
        except FileExistsError:
            continue
        _placeholder_index(root / name)
        return Invocation((root / name).resolve(), root.resolve(), start)
    raise RuntimeError(f"{root}: 999 invocations already started at {base}")


def _placeholder_index(folder: Path) -> None:
    """An ``index.html`` from the invocation's start (replaced when it ends), so a run page can link
    back to it and a person who opens it early learns why it is empty; an existing one is kept."""
    index = folder / "index.html"
    if not index.exists():
        _atomic_write(index, "<!doctype html><meta charset=utf-8><title>mxchaos run</title>"
                             "<p>This invocation is still running (or was cut before it wrote its index); "
                             "each run's folder holds its own report.html.</p>\n")


def first_failing_check(result: RunResult) -> str | None:
    """``name: summary`` of the first check that did not pass (false first, then unknown)."""
    for wanted in (False, None):
        for c in result.checks:
            if c.valid is wanted:
                return f"{c.name}: {c.summary}"
    return None


def _missed_a_time_bound(result: RunResult) -> bool:
    """Whether the first check that did not pass is a time bound (``is_time_bound``)."""
    for c in result.checks:
        if c.valid is False:
            return is_time_bound(c.kind, c.summary)
    return False


def _process_log(result: RunResult) -> Path | None:
    """The log of the process the first failing check names (``harness.reports.logs``), else of
    one that died by a signal, when the run folder holds one."""
    from harness.reports.logs import telling_logs

    found = telling_logs(result)
    return found[0][2] if found else None


def rerun_command(result: RunResult, mxchaos: str | None = None, *, passing_too: bool = False) -> str:
    """The one command line that reruns a run, its seed (the recap's, the next steps' and CI's
    ``rerun``): ``--repeat 5`` after a missed time bound; '' for a verdict that fails nothing
    (pass, a known defect, skip), unless ``passing_too`` (a JUnit body of a known defect's run):
    then the same command, without the repeats."""
    failing = result.verdict not in _PASSING
    if not failing and not passing_too:
        return ""
    exe = mxchaos or mxchaos_command()
    path = shown(result.scenario.path) if result.scenario.path else result.scenario.name
    repeat = " --repeat 5" if failing and _missed_a_time_bound(result) else ""
    return f"{exe} run {shlex.quote(path)} --seed {result.seed}{repeat}"


def next_steps(result: RunResult, mxchaos: str | None = None) -> list[str]:
    """What to do next about a run that did not pass: rerun, replay, read the log, open the page;
    each command as it runs when typed here (``harness.record.results.command``), each path
    relative to the working folder when inside it."""
    if result.verdict in _PASSING:
        return []
    exe = mxchaos or mxchaos_command()
    steps = [f"rerun:  {rerun_command(result, exe)}",
             f"replay: {exe} replay {shlex.quote(shown(result.run_dir))} -o again.yaml"]
    log = _process_log(result)
    if log is not None:
        steps.append(f"log:    {shown(log)}")
    steps.append(f"page:   {shown(result.run_dir / 'report.html')}")
    return steps


class SuiteProgress:
    """``[i/N]`` lines for a suite (see the module docstring)."""

    def __init__(self, total_runs: int, previous: Mapping[str, float], stream: TextIO | None = None,
                 clock: Any = time.monotonic) -> None:
        self.total = total_runs
        self.previous = dict(previous)
        self.stream = stream or sys.stdout
        self.clock = clock
        self.done = 0
        self.tally: dict[str, int] = {}
        self.seconds: list[float] = []
        self._planned: list[str] = []

    def plan(self, names: Sequence[str]) -> None:
        """The scenario name of every run still to come, in order (for the estimate)."""
        self._planned = list(names)

    def _estimate(self) -> str:
        left = self._planned[self.done:]
        if not left:
            return ""
        mean = statistics.fmean(self.seconds) if self.seconds else None
        total = 0.0
        for name in left:
            guess = self.previous.get(name, mean)
            if guess is None:
                return ""
            total += guess
        return f", ~{_minutes(total)} left"

    def _tallies(self) -> str:
        return " ".join(f"{n} {v.upper()}" for v, n in sorted(self.tally.items())) or "-"

    def skipped_rest(self, runs: int) -> None:
        """The scenario skipped: its ``runs`` repeats still planned will not run."""
        self.done += runs

    def started(self, label: str) -> None:
        self.stream.write(f"[{self.done + 1}/{self.total}] {label}\n")
        self.stream.flush()

    def ended(self, result: RunResult, label: str, quiet: bool = False) -> None:
        self.done += 1
        self.tally[result.verdict] = self.tally.get(result.verdict, 0) + 1
        if result.verdict != "skip":
            self.seconds.append(result.seconds)
        failing = first_failing_check(result)
        why = f"  ({result.reason})" if result.verdict == "skip" else ""
        if result.verdict == "not_exercised":
            why = f"  {result.not_exercised[0]}" if result.not_exercised else ""
        elif result.verdict not in _PASSING:
            why = f"  first failing: {failing}" if failing else f"  {result.status}: {result.reason}"
            caveat = load_caveat(result)
            if caveat:
                why += f"  (a timing check, on a loaded machine: {caveat})"
        line = (f"[{self.done}/{self.total}] {label}: {result.verdict.upper()} {result.seconds:.1f}s{why}"
                f"  [{self._tallies()}{self._estimate()}]")
        if quiet and result.verdict == "pass":
            return
        self.stream.write(line + "\n")
        for step in next_steps(result):
            self.stream.write(f"    {step}\n")
        self.stream.flush()


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f}s" if seconds < 90 else f"{seconds / 60:.1f} min"


def write_record(inv: Invocation, results: Sequence[RunResult], cells: Mapping[str, Any], repeat: int,
                 seed: int | None, command: Sequence[str], interrupted: bool, exit_code: int) -> dict[str, Any]:
    """``invocation.json`` and ``index.html`` of the invocation (each written atomically); the document."""
    from harness.record.versions import collect_versions
    from harness.reports.night import ScenarioNight, night_json, run_detail
    from harness.reports.night_page import render_night

    by_scenario: dict[str, list[RunResult]] = {}
    for r in results:
        by_scenario.setdefault(r.scenario.name, []).append(r)
    scenarios = []
    for name, cell in cells.items():
        runs = by_scenario.get(name, [])
        first = runs[0] if runs else None
        details = tuple(run_detail(r) for r in runs)
        skip = first.reason if cell.name == "SKIP" and first is not None else None
        path = _relative(first.scenario.path) if first is not None and first.scenario.path else ""
        scenarios.append(ScenarioNight(name, path, cell, {}, first.known_defect if first else None, skip, details))
    ended = dt.datetime.now(dt.UTC)
    doc = night_json(
        night=inv.name, night_dir=inv.folder, started=inv.started.isoformat(timespec="seconds"),
        ended=ended.isoformat(timespec="seconds"), seconds=time.monotonic() - inv.started_mono, repeat=repeat,
        seed=seed, command=command, scenarios=scenarios, interrupted=interrupted, exit_code=exit_code,
        versions=collect_versions(), hosts={"binding": "here"}, artifacts={},
    )
    doc["kind"] = "run"
    doc["load"] = {"start": inv.load, "end": load_sample()}
    NightDoc.parse(doc, inv.folder / RECORD).write(inv.folder / RECORD)  # every path in it relative to the folder
    _atomic_write(inv.folder / "index.html", render_night(doc))
    return doc | {"dir": str(inv.folder)}  # where it lies: for the caller, not saved


def json_summary(doc: Mapping[str, Any]) -> dict[str, Any]:
    """What ``run --json`` prints of ``invocation.json``'s document: the folder (relative to the
    working folder when inside it), every other path relative to the invocation's folder (run
    folders, pages, summary), each run's first failing check."""
    folder = Path(str(doc.get("dir") or doc.get("folder") or "."))
    summary = Path(str(doc.get("summary") or SummaryDoc.in_folder(folder)))
    scenarios = []
    for s in doc.get("scenarios") or []:
        runs = [{k: r.get(k) for k in ("index", "seed", "verdict", "status", "seconds", "run_dir", "report")}
                | {"first_failing": (r.get("failed_checks") or [None])[0], "load": r.get("load") or None}
                for r in s.get("runs") or []]
        scenarios.append({"name": s.get("name"), "path": s.get("path"), "cell": s.get("cell"), "rate": s.get("rate"),
                          "fails": s.get("fails_night"), "skip": s.get("skip"), "runs": runs})
    return {"invocation": doc.get("night"), "folder": shown(folder), "index": "index.html",
            "summary": os.path.relpath(summary, folder), "junit": "junit.xml", "passed": doc.get("passed"),
            "exit_code": doc.get("exit_code"), "interrupted": doc.get("interrupted"), "counts": doc.get("counts"),
            "scenarios": scenarios}


def _relative(path: Path | str) -> str:
    """``path`` from the working directory when it lies under it (pages stay short), else whole."""
    full = Path(path).resolve()
    return str(full.relative_to(Path.cwd())) if full.is_relative_to(Path.cwd()) else str(full)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
