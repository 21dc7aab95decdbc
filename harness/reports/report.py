"""Reports: everything a run leaves in its folder, written even when the run went wrong.

``<invocation>/<scenario>/<stamp>-<id>/`` under the results root (``harness.record.results``)::

    scenario.yaml       the file as given          scenario.json  the validated model
    run.json            id, harness pid, t0        versions.json  NIXL, UCX, torch, Python, host
    timeline.jsonl      every entry (History)      metrics.jsonl  the scrapes only (t, process, samples)
    verdict.json        verdict, reason, checks    junit.xml      one testcase per check (+ the run)
    report.html         timeline picture + tables  procs/<name>.log, procs/<name>.events.jsonl
    stacks/             py-spy dumps (hang, await timeouts)

and ``<invocation>/<scenario>/latest`` -> the invocation's newest run folder. What a crash must not lose is
there from the start: ``run.json``, ``scenario.yaml`` and ``scenario.json``
(``write_scenario_files``) are written when the folder is made, and ``timeline.jsonl`` grows
line by line as the run goes (``Timeline.open_sink``); ``write_run_folder`` keeps that file
when it holds the whole history (else it rewrites it atomically). ``load_run`` reads a folder
back (``mxchaos check`` re-judges it with the current checks; ``write_verdict_files`` rewrites
only verdict.json, junit.xml and report.html); a folder whose harness died (no ``outcome``
entry, no verdict.json: SIGKILL, OOM) is judged on what it recorded up to then, with status
``crashed``. The page itself is ``harness.reports.htmlreport`` (``render_html`` and ``timeline_svg``
are importable from here too).

Repeated runs (``mxchaos run --repeat N``, ``harness.record.rates``): each run keeps its own folder;
once the scenario's N runs are judged, ``annotate_repeat`` adds to each run's verdict.json
``repeat: {index, of, cell, rate: {k, n}, bound, measured}`` (index 1-based; a re-judge by
``mxchaos check --write`` keeps it), and ``write_junit_cells`` writes one JUnit testcase per
scenario with its cell (the failing runs in the message).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from harness.errors import HarnessError
from harness.judge.exercised import not_exercised
from harness.judge.verdict import RunResult, judge, result_to_json, verdict_of
from harness.machine import procscan
from harness.record.deaths import name_signals
from harness.record.results import RunNotFound, resolve_run, results_root
from harness.record.saved import VERSIONS, RunInfo, SavedDoc, SavedDocError, VerdictDoc, read_json, relative, write_json
from harness.record.timeline import History
from harness.record.versions import collect_versions, git_commit
from harness.reports.ci import check_failure_text, run_failure_text
from harness.reports.htmlreport import render_html, timeline_svg
from harness.scenario import Scenario, parse_scenario_json
from harness.subjects import subject_versions
from harness.subjects.mx_server import server_versions

if TYPE_CHECKING:
    from harness.record.rates import Cell

__all__ = [
    "RunFolderError",
    "annotate_repeat",
    "judge_runs",
    "collect_versions",
    "junit_cells_xml",
    "junit_xml",
    "load_run",
    "render_html",
    "rewrite_verdict",
    "saved_verdict",
    "timeline_svg",
    "write_junit",
    "write_junit_cells",
    "write_run_folder",
    "write_scenario_files",
    "write_verdict_files",
]


# ------------------------------------------------------------------------ folder


def write_scenario_files(run_dir: Path, scenario: Scenario) -> None:
    """``scenario.yaml`` (the file as given) and ``scenario.json`` (the validated model, what
    ``mxchaos check`` re-judges with); the runner writes them when the run folder is made."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "scenario.yaml").write_text(scenario.text or "")
    (run_dir / "scenario.json").write_text(json.dumps(scenario.model_dump(mode="json", by_alias=True), indent=2))


def _holds_entries(path: Path, count: int) -> bool:
    """Whether ``path`` is a whole timeline file of ``count`` lines (the runner's live file
    when nothing was lost on the way), counted without parsing it."""
    try:
        with open(path, "rb") as src:
            lines = 0
            last = b"\n"
            while chunk := src.read(1 << 20):
                lines += chunk.count(b"\n")
                last = chunk[-1:]
    except OSError:
        return False
    return lines == count and last == b"\n"


def write_run_folder(result: RunResult) -> Path:
    """Write every report file into ``result.run_dir``; returns the folder. The timeline the
    run wrote as it went is kept when it holds every entry of ``result.history``; otherwise
    (no live file, a write failed, entries after its sink closed) it is rewritten atomically."""
    run_dir = result.run_dir
    write_scenario_files(run_dir, result.scenario)
    versions = {**collect_versions(), "subjects": subject_versions(result.scenario),
                "servers": server_versions(result.scenario)}
    write_json(run_dir / VERSIONS, versions)
    timeline_file = run_dir / "timeline.jsonl"
    if not _holds_entries(timeline_file, len(result.history)):
        result.history.to_jsonl(timeline_file)
    with open(run_dir / "metrics.jsonl", "w", encoding="utf-8") as out:
        for entry in result.history:
            if entry.f == "scrape":
                row = {"t": round(entry.t, 6), "process": entry.actor, **entry.value}
                out.write(json.dumps(row, separators=(",", ":")) + "\n")
    write_verdict_files(result, versions)
    _link_latest(run_dir)
    return run_dir


def write_verdict_files(result: RunResult, versions: dict[str, Any], extra: dict[str, Any] | None = None) -> None:
    """verdict.json (plus ``extra`` keys), junit.xml and report.html of ``result.run_dir``."""
    run_dir = result.run_dir
    saved = {**result_to_json(result), "run_dir": "."}  # its own folder: a moved folder still names itself
    verdict = VerdictDoc.parse({**saved, "versions": versions, **(extra or {})}, run_dir)
    verdict.write(VerdictDoc.in_folder(run_dir))
    write_junit(run_dir / "junit.xml", [result])
    (run_dir / "report.html").write_text(render_html(result, versions, repeat=verdict.repeat))


SavedDocT = TypeVar("SavedDocT", bound=SavedDoc)


class RunFolderError(HarnessError):
    """A run folder cannot be read back (missing or unreadable files)."""


def _saved(doc: type[SavedDocT], run_dir: Path) -> SavedDocT | None:
    """``doc`` of the folder (None: it has none); one it cannot read is a ``RunFolderError``."""
    try:
        return doc.read(doc.in_folder(run_dir))
    except SavedDocError as exc:
        raise RunFolderError(str(exc)) from None


def _run_folder(path: Path) -> Path:
    """The run folder ``path`` names (``harness.record.results.resolve_run``: a run folder, a
    scenario's folder of runs, or a scenario's name: its newest run under the results root)."""
    try:
        return resolve_run(path, results_root())
    except RunNotFound as exc:
        raise RunFolderError(str(exc)) from None


def _crash_reason(run_dir: Path, history: History) -> str:
    """What a folder without an outcome says about its end: the harness died, and when."""
    timeline_file = run_dir / "timeline.jsonl"
    parts = ["the harness died before the run ended (its timeline has no outcome entry)"]
    last = history[-1] if len(history) else None
    when = ""
    with contextlib.suppress(OSError):
        mtime = dt.datetime.fromtimestamp(timeline_file.stat().st_mtime, dt.UTC)
        when = f", written at {mtime.isoformat(timespec='milliseconds')}"
    if last is not None:
        parts.append(f"its last entry is at {last.t:.3f}s ({last.actor} {last.type} {last.f}){when}")
    else:
        parts.append(f"it recorded no entry{when}")
    if history.torn_lines:
        parts.append(f"a torn last line of timeline.jsonl was dropped ({history.torn_lines})")
    with contextlib.suppress(OSError):
        marker = (run_dir / "CRASHED").read_text(encoding="utf-8").strip().splitlines()
        if marker:
            parts.append(f"mxchaos cleanup: {marker[0]}")
    return "; ".join(parts)


def _refuse_live(run_dir: Path, info: RunInfo | None) -> None:
    """A folder without an outcome whose harness is still running is a run in progress, not a crash."""
    pid = info.harness_pid if info is not None else None
    if pid is not None and procscan.harness_alive(pid, info.harness_start if info is not None else None):
        raise RunFolderError(f"{run_dir}: this run is still going (its harness, pid {pid}, is alive); check it when it ends")


def load_run(path: str | Path) -> RunResult:
    """Re-judge a saved run: the scenario from ``scenario.json`` (validated by the current
    harness), the ``timeline.jsonl``, the checks run again, the verdict merged again. How the
    run went (completed, a step failed, hang ...) is the timeline's ``outcome`` entry (runs
    recorded before it existed: ``verdict.json``); with neither, the harness died mid-run:
    status ``crashed`` (verdict ``error``), judged on what the timeline holds (a torn last
    line dropped). Raises ``ScenarioInvalid`` when the saved scenario is not valid any more,
    ``RunFolderError`` when a file is missing or its harness is still running."""
    run_dir = _run_folder(Path(path))
    for name in ("scenario.json", "timeline.jsonl"):
        if not (run_dir / name).is_file():
            raise RunFolderError(f"{run_dir}: no {name} (is this a run folder? it is written when a run starts)")
    scenario_file = run_dir / "scenario.json"
    scenario = parse_scenario_json(scenario_file.read_text(encoding="utf-8"), scenario_file)
    with contextlib.suppress(OSError):
        scenario._text = (run_dir / "scenario.yaml").read_text(encoding="utf-8")
    try:
        history = History.from_jsonl(run_dir / "timeline.jsonl")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RunFolderError(f"{run_dir / 'timeline.jsonl'}: cannot read it: {exc}") from None
    saved = _saved(VerdictDoc, run_dir)
    info = _saved(RunInfo, run_dir)
    # the file the run came from (where a user would edit it), not the copy in the folder
    scenario._path = Path(info.scenario_path) if info is not None and info.scenario_path else None
    outcome = history.last(actor="harness", f="outcome")
    if outcome is not None:
        status, reason, failed_step = str(outcome.get("status")), str(outcome.get("reason") or ""), outcome.get("failed_step")
    elif saved is not None and saved.status and saved.status != "crashed":  # a crash is judged again from the files
        status, reason, failed_step = saved.status, saved.reason, saved.failed_step
    else:
        _refuse_live(run_dir, info)
        status, reason, failed_step = "crashed", _crash_reason(run_dir, history), None
    skip = history.last(actor="harness", f="skip")
    checks = [] if status == "skipped" else judge(scenario, history)
    unexercised = [] if status == "skipped" else not_exercised(history)
    return RunResult(
        scenario=scenario,
        run_id=(saved.run_id if saved else "") or (info.run_id if info else "") or run_dir.name,
        run_dir=run_dir,
        status=status,
        reason=reason,
        verdict=verdict_of(status, checks, scenario.known_defect, unexercised),
        history=history,
        checks=checks,
        started_at=(saved.started_at if saved else "") or (info.started if info else ""),
        seconds=float((saved.seconds if saved else None) or history.end),
        seed=scenario.seed,
        failed_step=failed_step,
        stacks=dict(saved.stacks) if saved else {},
        interrupted_by=saved.interrupted_by if saved else None,
        missing_capabilities=list(skip.get("missing") or []) if skip is not None else [],
        not_exercised=unexercised,
    )


def saved_verdict(run_dir: Path) -> str | None:
    """The verdict recorded in a run folder's verdict.json, if any."""
    saved = VerdictDoc.read_or_none(VerdictDoc.in_folder(run_dir))
    return saved.verdict if saved is not None else None


def rewrite_verdict(result: RunResult, previous: str | None) -> None:
    """After a re-judge: verdict.json, junit.xml and report.html again, with the versions of
    what ran (versions.json) and a note of the re-judge; nothing else of the folder changes."""
    try:
        versions = read_json(result.run_dir / VERSIONS) or {}
    except SavedDocError:
        versions = {}
    extra = {
        "rejudged": {
            "at": dt.datetime.now(dt.UTC).isoformat(),
            "previous_verdict": previous,
            "harness_git_commit": git_commit(),
        }
    }
    saved = _saved(VerdictDoc, result.run_dir)
    if saved is not None and saved.repeat is not None:  # a run of a repeated scenario keeps its place among the N
        extra["repeat"] = saved.repeat
    write_verdict_files(result, versions, extra)


def judge_runs(sc: Scenario, runs: Sequence[RunResult], of: int, *, annotate: bool = True) -> Cell:
    """The cell of a scenario's runs (``harness.record.rates``: its rule, the scenario's stated defect
    rate), each run annotated with its place among the ``of`` (``annotate_repeat``)."""
    from harness.record.rates import Rate, RunRecord, cell_of

    measured = Rate(*sc.measured_rate) if sc.measured_rate else None
    cell = cell_of(sc.name, [RunRecord.of(r) for r in runs], bool(sc.known_defect), measured)
    if annotate:
        for index, r in enumerate(runs, 1):
            annotate_repeat(r, index, of, cell)
    return cell


def annotate_repeat(result: RunResult, index: int, of: int, cell: Cell) -> None:
    """Add ``repeat: {index, of, cell, rate, bound, measured, runs}`` to a run's verdict.json
    (atomically) and render its report.html again with that place among the N (the cell, its
    rate and links to the other runs)."""
    run_dir = Path(result.run_dir)
    saved = _saved(VerdictDoc, run_dir)
    if saved is None:
        return
    judged = cell.to_json()
    saved.repeat = {
        "index": index,
        "of": of,
        "cell": judged["cell"],
        "rate": judged["rate"],
        "bound": judged["bound"],
        "measured": judged["measured"],
        "note": cell.note,
        "runs": [{"verdict": r.verdict, "run_dir": relative(r.run_dir, run_dir), "seed": r.seed} for r in cell.runs],  # from here
    }
    saved.write(VerdictDoc.in_folder(run_dir))
    page = run_dir / "report.html"
    tmp = page.with_name(f".report.html.{os.getpid()}.tmp")
    tmp.write_text(render_html(result, saved.versions, repeat=saved.repeat))
    os.replace(tmp, page)


def _link_latest(run_dir: Path) -> None:
    """``latest`` -> this run, replaced atomically (parallel runs may race; last one wins)."""
    link = run_dir.parent / "latest"
    tmp = run_dir.parent / f".latest-{os.getpid()}-{run_dir.name}"
    with contextlib.suppress(OSError):
        if tmp.is_symlink():
            tmp.unlink()
        tmp.symlink_to(run_dir.name)
        os.replace(tmp, link)


# ------------------------------------------------------------------------ junit


def junit_xml(results: Sequence[RunResult], base: Path | None = None) -> ET.Element:
    """A testsuite per run, a testcase for the run and one per check; ``base``: the folder the
    XML is saved in, which its paths are relative to (None: as the results hold them)."""
    root = ET.Element("testsuites")
    for result in results:
        suite = ET.SubElement(
            root,
            "testsuite",
            name=f"mxchaos.{result.scenario.name}",
            timestamp=result.started_at,
            time=f"{result.seconds:.3f}",
        )
        props = ET.SubElement(suite, "properties")
        for key, value in (
            ("run_id", result.run_id),
            ("run_dir", _path(result.run_dir, base)),
            ("seed", str(result.seed)),
            ("verdict", result.verdict),
        ):
            ET.SubElement(props, "property", name=key, value=value)
        if result.known_defect:
            ET.SubElement(props, "property", name="known_defect", value=result.known_defect)
        tests = failures = errors = skipped = 0
        # xfail: what failed is expected, so it is reported as skipped with the defect as the reason
        expected = result.verdict == "xfail"
        unexercised = result.verdict == "not_exercised"
        why_expected = f"XFAIL: known defect: {result.known_defect}"
        case = ET.SubElement(suite, "testcase", classname=f"mxchaos.{result.scenario.name}", name="run", time=f"{result.seconds:.3f}")
        tests += 1
        if result.verdict == "skip":
            skipped += 1
            ET.SubElement(case, "skipped", message=f"skip: {result.reason}").text = result.reason
        elif expected:
            skipped += 1
            ET.SubElement(case, "skipped", message=why_expected).text = _expected_text(result)
        elif unexercised:  # neither a pass nor a failure of the subject: an error of the scenario
            errors += 1
            ET.SubElement(case, "error", type="not_exercised",
                          message=f"not exercised: {result.not_exercised[0]}").text = "\n".join(result.not_exercised)
        elif result.status == "step_failed":
            failures += 1
            ET.SubElement(case, "failure", message=f"step {result.failed_step}: {result.reason}").text = run_failure_text(result, base)
        elif result.status != "completed":
            errors += 1
            ET.SubElement(case, "error", message=f"{result.status}: {result.reason}").text = run_failure_text(result, base)
        elif result.verdict == "xpass":
            ET.SubElement(case, "system-out").text = _xpass_note(result)
        for check in result.checks:
            tests += 1
            case = ET.SubElement(
                suite, "testcase", classname=f"mxchaos.{result.scenario.name}", name=check.name, time=f"{check.seconds:.6f}"
            )
            if check.valid is False and expected:
                skipped += 1
                ET.SubElement(case, "skipped", message=f"XFAIL: {name_signals(check.summary)}").text = why_expected
            elif check.valid is not True and unexercised:
                skipped += 1
                ET.SubElement(case, "skipped", message=f"not judged: the run was not exercised: {check.summary}")
            elif check.valid is False:
                failures += 1
                ET.SubElement(case, "failure", message=name_signals(check.summary)).text = check_failure_text(result, check, base)
            elif check.valid != True:  # noqa: E712
                errors += 1
                ET.SubElement(case, "error", message=f"unknown: {check.summary}").text = check_failure_text(result, check, base)
        suite.set("tests", str(tests))
        suite.set("failures", str(failures))
        suite.set("errors", str(errors))
        suite.set("skipped", str(skipped))
    _total(root)
    return root


def _total(root: ET.Element) -> None:
    """``<testsuites>`` carries the sums of its suites (tests, failures, errors, skipped, time):
    what a CI's test tab shows first."""
    for key in ("tests", "failures", "errors", "skipped"):
        root.set(key, str(sum(int(s.get(key) or 0) for s in root.iter("testsuite"))))
    root.set("time", f"{sum(float(s.get('time') or 0) for s in root.iter('testsuite')):.3f}")


def _expected_text(result: RunResult) -> str:
    lines = [f"known defect: {result.known_defect}", "XFAIL: the checks that showed it:"]
    lines += [f"  {c.name}: {name_signals(c.summary)}" for c in result.checks if c.valid is False]
    return "\n".join(lines)


def _xpass_note(result: RunResult) -> str:
    return (
        "XPASS: every check passed, so the known defect did not reproduce in this run; one run cannot "
        f"call it fixed (`mxchaos run --repeat N` can): {result.known_defect}"
    )


def _path(path: Path | str, base: Path | None) -> str:
    return str(path) if base is None else relative(path, base)


def write_junit(path: Path, results: Sequence[RunResult]) -> None:
    tree = ET.ElementTree(junit_xml(results, path.parent))
    ET.indent(tree)
    tree.write(path, encoding="utf-8", xml_declaration=True)


def _cell_message(cell: Cell) -> str:
    bound = f"; {cell.bound:.3f} upper bound (95%, one-sided)" if cell.bound is not None else ""
    measured = f"; measured {cell.measured}" if cell.measured is not None else ""
    return f"{cell.name} {cell.rate}{bound}{measured}: {cell.note}"


def junit_cells_xml(cells: Sequence[Cell], base: Path | None = None) -> ET.Element:
    """One testsuite ``mxchaos.repeat``, one testcase per scenario: its cell and rate; a cell
    that fails the run is a failure (FAIL, FLAKY, UNKNOWN) or an error (HANG, ERROR) naming
    its failing runs; XFAIL and SKIP are skipped; FIXED? and XPASS pass with a note."""
    root = ET.Element("testsuites")
    suite = ET.SubElement(root, "testsuite", name="mxchaos.repeat")
    counts = {"failures": 0, "errors": 0, "skipped": 0}
    for cell in cells:
        seconds = sum(r.seconds for r in cell.runs)
        case = ET.SubElement(suite, "testcase", classname="mxchaos.repeat", name=cell.scenario, time=f"{seconds:.3f}")
        props = ET.SubElement(case, "properties")
        for key, value in (("cell", cell.name), ("rate", str(cell.rate)), ("bound", cell.bound), ("measured", cell.measured)):
            if value is not None:
                ET.SubElement(props, "property", name=key, value=value if isinstance(value, str) else str(value))
        runs = "\n".join(f"run {i}: {r.verdict.upper()} (seed {r.seed}, {r.seconds:.1f}s) {_path(r.run_dir, base)}"
                         for i, r in enumerate(cell.runs, 1))
        message = _cell_message(cell)
        if cell.fails_run:
            failing = ", ".join(f"{r.verdict.upper()} {_path(r.run_dir, base)}" for r in cell.failing_runs)
            tag = "error" if cell.name in ("HANG", "ERROR") else "failure"
            counts["errors" if tag == "error" else "failures"] += 1
            ET.SubElement(case, tag, message=f"{message}; failing runs: {failing}").text = runs
        elif cell.name in ("XFAIL", "SKIP"):
            counts["skipped"] += 1
            ET.SubElement(case, "skipped", message=message).text = runs
        else:
            ET.SubElement(case, "system-out").text = f"{message}\n{runs}"
    suite.set("tests", str(len(cells)))
    for key, n in counts.items():
        suite.set(key, str(n))
    suite.set("time", f"{sum(r.seconds for cell in cells for r in cell.runs):.3f}")
    _total(root)
    return root


def write_junit_cells(path: Path, cells: Sequence[Cell]) -> None:
    tree = ET.ElementTree(junit_cells_xml(cells, path.parent))
    ET.indent(tree)
    tree.write(path, encoding="utf-8", xml_declaration=True)
