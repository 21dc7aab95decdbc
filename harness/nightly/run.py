"""Run a night and write its folder.

``run_night(spec, binding)``:

1. binds every scenario (``harness.nightly.binding``); when none can run, ``NothingToRun``
   says why for each, and no folder is written;
2. runs each bound scenario ``repeat`` times, run i with seed ``seed + i``, through the
   binding (for this machine: ``harness.engine.runner.Runner``; a binding that runs them elsewhere,
   ``--slurm``'s, runs them all in its ``prepare`` first and hands each run back judged from its folder), writes each run folder
   (``harness.reports.report.write_run_folder``) and trims it (``harness.nightly.artifacts``); a
   scenario that skips stops repeating (a missing capability stays missing), an interrupted
   run (SIGINT/SIGTERM, healed and torn down by the runner) ends the night;
3. judges each scenario's runs as one cell (``harness.record.rates.cell_of``, as ``mxchaos run
   --repeat``) and notes its place on each run (``annotate_repeat``); a cell whose every run
   failed before any fault for an environment reason (``harness.judge.envbroken``) is
   ``ENV_BROKEN`` ("environment broken: <reason>"), no verdict on NIXL, and the night exits 4;
4. writes ``DIR/<night>/``: ``runs/`` (the run folders and ``runs/summary.json``, the
   ``--repeat`` contract), ``junit.xml`` (one testcase per scenario: its cell),
   ``nightly.json`` (``harness.reports.night``) with the comparison against the night before
   (``harness.nightly.compare``) and, over every night of ``DIR``, what is still failing and what
   is flaky (``harness.nightly.history``), ``index.html`` (``harness.reports.night_page``); then points
   ``DIR/latest`` at it and rewrites ``DIR/history.html``, a strip per scenario across the nights.

The night before is the one ``DIR/latest`` points at, else the newest folder of ``DIR`` with
a readable ``nightly.json``. A night id is the UTC start time (``20261201T013000Z``; ``-2``,
``-3`` ... when taken). With ``keep`` (``--keep K``), only the newest K night folders stay
(``prune_nights``: folders named as night ids that hold a ``nightly.json``; nothing else).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import os
import shutil
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.exits import EXIT_ENV_BROKEN, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK
from harness.judge.envbroken import LABEL, cell_reason
from harness.nightly.artifacts import LOG_CAP_BYTES, folder_bytes, trim_run_folder
from harness.nightly.binding import Binding, Bound, Observer
from harness.nightly.compare import compare_nights
from harness.nightly.history import history_lines, night_folders, read_night, read_nights, render_history
from harness.record.load import load_sample
from harness.record.rates import Cell, Rate, write_summary
from harness.record.saved import NightDoc, SummaryDoc
from harness.reports.invocation import SuiteProgress
from harness.reports.night import ScenarioNight, night_json, night_passed, run_detail
from harness.reports.night_page import render_night
from harness.scenario import Scenario

__all__ = ["NightOutcome", "NightSpec", "NothingToRun", "find_previous", "new_night_id", "prune_nights", "run_night",
           "write_night"]

ENV_BROKEN_CELL = "ENV_BROKEN"  # a cell whose every run failed before any fault for its environment


class NothingToRun(Exception):
    """No scenario can be bound or run here; the message lists each one and why."""


@dataclass
class NightSpec:
    scenarios: list[Scenario]
    out: Path
    repeat: int = 1
    seed: int | None = None  # --seed, already applied to ``scenarios``; recorded
    command: list[str] = field(default_factory=list)
    hosts: dict[str, Any] = field(default_factory=dict)  # nightly.json "hosts": binding, inventory summary
    log_cap: int = LOG_CAP_BYTES
    keep: int | None = None  # --keep: after the night, delete all but the newest ``keep`` nights of ``out``


@dataclass(frozen=True)
class NightOutcome:
    night_dir: Path
    night: dict[str, Any]
    cells: list[Cell]
    exit_code: int


def new_night_id(out: Path, now: dt.datetime | None = None) -> str:
    base = (now or dt.datetime.now(dt.UTC)).strftime("%Y%m%dT%H%M%SZ")
    night, n = base, 1
    while (out / night).exists():
        n += 1
        night = f"{base}-{n}"
    return night


def _make_night_dir(out: Path, start: dt.datetime) -> tuple[str, Path]:
    """A new night's folder, made here: a night started in the same second elsewhere gets the next id."""
    out.mkdir(parents=True, exist_ok=True)
    for _ in range(100):
        night = new_night_id(out, start)
        try:
            (out / night).mkdir()
        except FileExistsError:
            continue
        return night, out / night
    raise FileExistsError(f"{out}: no free night id for {start.isoformat()}")


def find_previous(out: Path, exclude: str | None = None) -> tuple[Path, NightDoc] | None:
    """The night before: ``out/latest``'s, else the newest night folder with a readable ``nightly.json``."""
    latest = out / "latest"
    candidates: list[Path] = []
    if latest.is_symlink() or latest.is_dir():
        candidates.append(latest.resolve())
    candidates += reversed(night_folders(out))
    for folder in candidates:
        if folder.name == exclude:
            continue
        night = read_night(folder)
        if night is not None:
            return folder, night
    return None


def _shown(path: Path | None) -> str:
    """A scenario path as a person would type it: relative to the working folder when inside it."""
    if path is None:
        return ""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _skip_cell(name: str, why: str) -> Cell:
    return Cell(name, "SKIP", Rate(0, 0), (), note=why)


def _write_junit(path: Path, cells: Sequence[Cell], night: str, started: str) -> None:
    from harness.reports.report import junit_cells_xml

    root = junit_cells_xml(cells)
    for suite in root.iter("testsuite"):
        suite.set("name", "mxchaos.nightly")
        suite.set("timestamp", started)
        suite.set("time", f"{sum(r.seconds for c in cells for r in c.runs):.3f}")
        props = ET.Element("properties")
        ET.SubElement(props, "property", name="night", value=night)
        suite.insert(0, props)
    for case in root.iter("testcase"):
        case.set("classname", "mxchaos.nightly")
    tree = ET.ElementTree(root)
    ET.indent(tree)
    tree.write(path, encoding="utf-8", xml_declaration=True)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _link_latest(out: Path, night: str) -> None:
    link, tmp = out / "latest", out / f".latest-{os.getpid()}"
    with contextlib.suppress(OSError):
        if tmp.is_symlink():
            tmp.unlink()
        tmp.symlink_to(night)
        os.replace(tmp, link)


def _scenario(
    spec: NightSpec, binding: Binding, sc: Scenario, b: Bound, night_dir: Path, runs_dir: Path,
    log: Callable[[str], None], observers: Callable[[str], Sequence[Observer]],
    capped: list[dict[str, Any]], removed: list[dict[str, Any]], progress: SuiteProgress | None = None,
) -> tuple[ScenarioNight, bool]:
    """One scenario's repeats and its cell; True when a run was interrupted (the night ends)."""
    from harness.reports.invocation import first_failing_check
    from harness.reports.report import judge_runs, write_run_folder

    path = _shown(sc.path)
    if b.skip:
        log(f"--- {sc.name}: SKIP  ({b.skip})")
        if progress is not None:  # its runs were counted in N: none of them will run
            progress.skipped_rest(spec.repeat)
        return ScenarioNight(sc.name, path, _skip_cell(sc.name, b.skip), b.hosts, sc.known_defect, b.skip), False
    runs, details = [], []
    interrupted = False
    here = night_dir.resolve()
    for index in range(spec.repeat):
        run_sc = sc.with_seed(sc.seed + index)
        of = f" run {index + 1}/{spec.repeat}"
        if progress is not None:  # the [i/N] lines of `mxchaos run`
            progress.started(f"{sc.name}{of} (seed {run_sc.seed})")
        else:
            log(f"=== {sc.name}{of} (seed {run_sc.seed})")
        result = binding.run(run_sc, runs_dir, observers(sc.name))
        write_run_folder(result)
        trimmed = trim_run_folder(result.run_dir, spec.log_cap)
        rel = str(result.run_dir.relative_to(here)) if result.run_dir.is_relative_to(here) else str(result.run_dir)
        capped += [{**c, "path": f"{rel}/{c['path']}"} for c in trimmed["capped"]]
        removed += [{**r, "path": f"{rel}/{r['path']}"} for r in trimmed["removed"]]
        extra = f"  ({result.reason})" if result.verdict == "skip" else ""
        failing = first_failing_check(result) if not result.ok else None
        extra += f"  first failing: {failing}" if failing else ""
        detail = run_detail(result)
        extra += f"  (machine {detail.load})" if failing and detail.load else ""
        if progress is not None:
            progress.ended(result, f"{sc.name}{of}")
            if result.verdict == "skip":
                progress.skipped_rest(spec.repeat - index - 1)
        else:
            log(f"--- {sc.name}{of}: {result.verdict.upper()} {result.seconds:.1f}s  {result.run_dir}/report.html{extra}")
        runs.append(result)
        details.append(detail)
        if result.status == "interrupted":
            interrupted = True
            break
        if result.verdict == "skip":  # a missing capability stays missing: one skip says it
            break
    cell = judge_runs(sc, runs, spec.repeat)
    skip = runs[0].reason if cell.name == "SKIP" and runs else None
    broken = cell_reason(r.run_dir for r in runs) if cell.fails_run and not interrupted else None
    if broken:  # every run failed before any fault for its environment: no verdict on NIXL
        log(f"--- {sc.name}: {LABEL}: {broken}")
        cell = dataclasses.replace(cell, name=ENV_BROKEN_CELL, note=f"{LABEL}: {broken}")
    return ScenarioNight(sc.name, path, cell, b.hosts, sc.known_defect, skip, tuple(details)), interrupted


def run_night(
    spec: NightSpec,
    binding: Binding,
    *,
    log: Callable[[str], None] = lambda _m: None,
    observers: Callable[[str], Sequence[Observer]] = lambda _n: (),
    clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    progress: SuiteProgress | None = None,
) -> NightOutcome:
    """Run the night (see the module docstring); NothingToRun when no scenario can run."""
    bound: list[tuple[Scenario, Bound]] = [(sc, binding.bind(sc)) for sc in spec.scenarios]
    if all(b.skip for _, b in bound):
        why = "\n".join(f"  {sc.name}: {b.skip}" for sc, b in bound)
        raise NothingToRun(f"no scenario can be bound or run here ({binding.name}):\n{why}")
    start = clock()
    started_mono = time.monotonic()
    start_load = load_sample()
    night, night_dir = _make_night_dir(spec.out, start)
    runs_dir = night_dir / "runs"
    runs_dir.mkdir()
    previous = find_previous(spec.out, exclude=night)
    log(f"night {night}: {len(bound)} scenario(s) x {spec.repeat}, into {night_dir}")
    results: list[ScenarioNight] = []
    capped: list[dict[str, Any]] = []
    removed: list[dict[str, Any]] = []
    interrupted = False
    try:
        binding.prepare([sc for sc, b in bound if not b.skip], runs_dir, spec.repeat, spec.seed)
        for sc, b in bound:
            done, stop = _scenario(spec, binding, sc, b, night_dir, runs_dir, log, observers, capped, removed, progress)
            results.append(done)
            if stop:
                interrupted = True
                break
    except KeyboardInterrupt:  # between runs (a run itself heals, tears down and returns "interrupted")
        interrupted = True
        log("interrupted: the night so far is written")
    end = clock()
    cells = [s.cell for s in results]
    write_summary(SummaryDoc.in_folder(runs_dir), {c.scenario: c for c in cells}, spec.repeat)
    _write_junit(night_dir / "junit.xml", cells, night, start.isoformat(timespec="seconds"))
    exit_code = EXIT_INTERRUPTED if interrupted else (EXIT_OK if night_passed(results, interrupted) else EXIT_FAILED)
    if not interrupted and any(c.name == ENV_BROKEN_CELL for c in cells):
        exit_code = EXIT_ENV_BROKEN
    from harness.record.versions import collect_versions

    doc = night_json(
        night=night, night_dir=night_dir, started=start.isoformat(timespec="seconds"),
        ended=end.isoformat(timespec="seconds"), seconds=time.monotonic() - started_mono, repeat=spec.repeat,
        seed=spec.seed, command=spec.command, scenarios=results, interrupted=interrupted, exit_code=exit_code,
        versions=collect_versions(), hosts=spec.hosts,
        artifacts={"bytes": folder_bytes(night_dir), "log_cap_bytes": spec.log_cap, "capped": capped, "removed": removed},
        previous={"night": previous[0].name, "dir": str(previous[0])} if previous else None,
    )
    doc["load"] = {"start": start_load, "end": load_sample()}  # the machine's: a timing FAIL under load says so
    if previous is not None:
        before = [n for n in read_nights(spec.out) if n[0] != night]
        now = NightDoc.parse(doc, NightDoc.in_folder(night_dir))
        doc["comparison"] = {**compare_nights(previous[1], now), **history_lines(before, (night, now))}
    write_night(night_dir, doc)
    _link_latest(spec.out, night)
    if spec.keep is not None:
        for old in prune_nights(spec.out, spec.keep):
            log(f"pruned night {old.name} (--keep {spec.keep})")
    _atomic_write(spec.out / "history.html", render_history(read_nights(spec.out)))
    return NightOutcome(night_dir, doc, cells, exit_code)


def prune_nights(out: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` (>= 1) night folders of ``out`` (named as night ids and
    holding a ``nightly.json``; nothing else in ``out`` is touched); the folders deleted."""
    if keep < 1:
        raise ValueError(f"keep {keep}: keep at least the newest night")
    nights = [p for p in night_folders(out) if NightDoc.in_folder(p).is_file()]
    doomed = nights[:-keep]
    for folder in doomed:
        shutil.rmtree(folder, ignore_errors=True)
    return doomed


def write_night(night_dir: Path, doc: Mapping[str, Any]) -> None:
    """``nightly.json`` and ``index.html`` of ``doc``, each written atomically."""
    path = NightDoc.in_folder(night_dir)
    NightDoc.parse(doc, path).write(path)
    _atomic_write(night_dir / "index.html", render_night(doc))
