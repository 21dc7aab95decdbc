"""Reports: everything a run leaves in its folder, written even when the run went wrong.

``runs/<scenario>/<stamp>-<id>/``::

    scenario.yaml       the file as given          scenario.json  the validated model
    run.json            id, harness pid, t0        versions.json  NIXL, UCX, torch, Python, host
    timeline.jsonl      every entry (History)      metrics.jsonl  the scrapes only (t, process, samples)
    verdict.json        verdict, reason, checks    junit.xml      one testcase per check (+ the run)
    report.html         timeline picture + tables  procs/<name>.log, procs/<name>.events.jsonl
    stacks/             py-spy dumps (hang, await timeouts)

and ``runs/<scenario>/latest`` -> the newest run folder. ``load_run`` reads a folder back
(``mxchaos check`` re-judges it with the current checks; ``write_verdict_files`` rewrites
only verdict.json, junit.xml and report.html).
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime as dt
import glob
import html
import importlib.metadata
import json
import os
import platform
import socket
import subprocess
import sys
import sysconfig
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from harness.errors import HarnessError
from harness.verdict import RunResult, judge, result_to_json, verdict_of
from harness.scenario import parse_scenario_json
from harness.timeline import Entry, History

__all__ = [
    "RunFolderError",
    "collect_versions",
    "junit_xml",
    "load_run",
    "render_html",
    "rewrite_verdict",
    "saved_verdict",
    "write_junit",
    "write_run_folder",
    "write_verdict_files",
]


# ------------------------------------------------------------------------ versions


def _dist_version(*names: str) -> str | None:
    for name in names:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return f"{importlib.metadata.version(name)} ({name})"
    return None


def _ucx_version() -> str | None:
    """UCX bundled with the NIXL wheel (or on the system), asked in a child process so a
    broken library cannot take the harness down."""
    purelib = sysconfig.get_paths()["purelib"]
    candidates = sorted(glob.glob(os.path.join(purelib, "nixl*.libs", "libucp*.so*")))
    code = (
        "import ctypes,sys\n"
        "lib=ctypes.CDLL(sys.argv[1]); f=lib.ucp_get_version_string; f.restype=ctypes.c_char_p\n"
        "print(f().decode())\n"
    )
    for lib in [*candidates, "libucp.so.0"]:
        try:
            out = subprocess.run(  # noqa: S603
                [sys.executable, "-c", code, lib], capture_output=True, text=True, timeout=10, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and out.stdout.strip():
            return f"{out.stdout.strip()} ({os.path.basename(lib)})"
    return None


def _git_commit() -> str | None:
    try:
        out = subprocess.run(  # noqa: S603,S607
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent.parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


_VERSIONS: dict[str, Any] | None = None


def collect_versions() -> dict[str, Any]:
    """What ran: NIXL, UCX, torch, Python, this package, the host (cached per process)."""
    global _VERSIONS
    if _VERSIONS is None:
        _ = ctypes  # ctypes is used in the child; imported here so a missing module shows early
        _VERSIONS = {
            "nixl": _dist_version("nixl", "nixl-cu12", "nixl-cu13"),
            "nixl_cu": _dist_version("nixl-cu12", "nixl-cu13"),
            "ucx": _ucx_version(),
            "torch": _dist_version("torch"),
            "python": sys.version.split()[0],
            "python_executable": sys.executable,
            "mxchaos": _dist_version("mxchaos"),
            "git_commit": _git_commit(),
            "host": {
                "hostname": socket.gethostname(),
                "platform": platform.platform(),
                "kernel": platform.release(),
                "machine": platform.machine(),
                "cpus": os.cpu_count(),
            },
        }
    return dict(_VERSIONS)


# ------------------------------------------------------------------------ folder


def write_run_folder(result: RunResult) -> Path:
    """Write every report file into ``result.run_dir``; returns the folder."""
    run_dir = result.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    sc = result.scenario
    (run_dir / "scenario.yaml").write_text(sc.text or "")
    (run_dir / "scenario.json").write_text(json.dumps(sc.model_dump(mode="json", by_alias=True), indent=2))
    versions = collect_versions()
    (run_dir / "versions.json").write_text(json.dumps(versions, indent=2))
    result.history.to_jsonl(run_dir / "timeline.jsonl")
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
    verdict = result_to_json(result)
    verdict["versions"] = versions
    verdict.update(extra or {})
    (run_dir / "verdict.json").write_text(json.dumps(verdict, indent=2, default=str))
    write_junit(run_dir / "junit.xml", [result])
    (run_dir / "report.html").write_text(render_html(result, versions))


class RunFolderError(HarnessError):
    """A run folder cannot be read back (missing or unreadable files)."""


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise RunFolderError(f"{path}: cannot read it: {exc}") from None
    return data if isinstance(data, dict) else None


def _run_folder(path: Path) -> Path:
    """``path`` itself, or its ``latest`` run when given a scenario's folder of runs."""
    if not (path / "timeline.jsonl").is_file() and (path / "latest" / "timeline.jsonl").is_file():
        return (path / "latest").resolve()
    return path.resolve()


def load_run(path: str | Path) -> RunResult:
    """Re-judge a saved run: the scenario from ``scenario.json`` (validated by the current
    harness), the ``timeline.jsonl``, the checks run again, the verdict merged again. How the
    run went (completed, a step failed, hang ...) is the timeline's ``outcome`` entry (runs
    recorded before it existed: ``verdict.json``). Raises ``ScenarioInvalid`` when the saved
    scenario is not valid any more, ``RunFolderError`` when a file is missing."""
    run_dir = _run_folder(Path(path))
    for name in ("scenario.json", "timeline.jsonl"):
        if not (run_dir / name).is_file():
            raise RunFolderError(f"{run_dir}: no {name} (is this a run folder? it is written when a run ends)")
    scenario_file = run_dir / "scenario.json"
    scenario = parse_scenario_json(scenario_file.read_text(encoding="utf-8"), scenario_file)
    with contextlib.suppress(OSError):
        scenario._text = (run_dir / "scenario.yaml").read_text(encoding="utf-8")
    try:
        history = History.from_jsonl(run_dir / "timeline.jsonl")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RunFolderError(f"{run_dir / 'timeline.jsonl'}: cannot read it: {exc}") from None
    saved = _read_json(run_dir / "verdict.json") or {}
    info = _read_json(run_dir / "run.json") or {}
    # the file the run came from (where a user would edit it), not the copy in the folder
    scenario._path = Path(info["scenario_path"]) if info.get("scenario_path") else None
    outcome = history.last(actor="harness", f="outcome")
    if outcome is not None:
        status, reason, failed_step = str(outcome.get("status")), str(outcome.get("reason") or ""), outcome.get("failed_step")
    elif "status" in saved:
        status, reason, failed_step = str(saved["status"]), str(saved.get("reason") or ""), saved.get("failed_step")
    else:
        raise RunFolderError(f"{run_dir}: neither an outcome entry in timeline.jsonl nor a verdict.json says how the run went")
    skip = history.last(actor="harness", f="skip")
    checks = [] if status == "skipped" else judge(scenario, history)
    return RunResult(
        scenario=scenario,
        run_id=str(saved.get("run_id") or info.get("run_id") or run_dir.name),
        run_dir=run_dir,
        status=status,
        reason=reason,
        verdict=verdict_of(status, checks, scenario.known_defect),
        history=history,
        checks=checks,
        started_at=str(saved.get("started_at") or info.get("started") or ""),
        seconds=float(saved.get("seconds") or history.end),
        seed=scenario.seed,
        failed_step=failed_step,
        stacks=dict(saved.get("stacks") or {}),
        interrupted_by=saved.get("interrupted_by"),
        missing_capabilities=list(skip.get("missing") or []) if skip is not None else [],
    )


def saved_verdict(run_dir: Path) -> str | None:
    """The verdict recorded in a run folder's verdict.json, if any."""
    with contextlib.suppress(RunFolderError):
        saved = _read_json(run_dir / "verdict.json")
        return str(saved["verdict"]) if saved and "verdict" in saved else None
    return None


def rewrite_verdict(result: RunResult, previous: str | None) -> None:
    """After a re-judge: verdict.json, junit.xml and report.html again, with the versions of
    what ran (versions.json) and a note of the re-judge; nothing else of the folder changes."""
    versions = _read_json(result.run_dir / "versions.json") or {}
    extra = {
        "rejudged": {
            "at": dt.datetime.now(dt.UTC).isoformat(),
            "previous_verdict": previous,
            "harness_git_commit": _git_commit(),
        }
    }
    write_verdict_files(result, versions, extra)


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


def junit_xml(results: Sequence[RunResult]) -> ET.Element:
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
            ("run_dir", str(result.run_dir)),
            ("seed", str(result.seed)),
            ("verdict", result.verdict),
        ):
            ET.SubElement(props, "property", name=key, value=value)
        if result.known_defect:
            ET.SubElement(props, "property", name="known_defect", value=result.known_defect)
        tests = failures = errors = skipped = 0
        # xfail: what failed is expected, so it is reported as skipped with the defect as the reason
        expected = result.verdict == "xfail"
        why_expected = f"xfail: known defect: {result.known_defect}"
        case = ET.SubElement(suite, "testcase", classname=f"mxchaos.{result.scenario.name}", name="run", time=f"{result.seconds:.3f}")
        tests += 1
        if result.verdict == "skip":
            skipped += 1
            ET.SubElement(case, "skipped", message=f"skip: {result.reason}").text = result.reason
        elif expected:
            skipped += 1
            ET.SubElement(case, "skipped", message=why_expected).text = _expected_text(result)
        elif result.status == "step_failed":
            failures += 1
            ET.SubElement(case, "failure", message=f"step {result.failed_step}: {result.reason}").text = result.reason
        elif result.status != "completed":
            errors += 1
            ET.SubElement(case, "error", message=f"{result.status}: {result.reason}").text = result.reason
        elif result.verdict == "xpass":
            ET.SubElement(case, "system-out").text = _xpass_note(result)
        for check in result.checks:
            tests += 1
            case = ET.SubElement(
                suite, "testcase", classname=f"mxchaos.{result.scenario.name}", name=check.name, time=f"{check.seconds:.6f}"
            )
            if check.valid is False and expected:
                skipped += 1
                ET.SubElement(case, "skipped", message=f"xfail: {check.summary}").text = why_expected
            elif check.valid is False:
                failures += 1
                ET.SubElement(case, "failure", message=check.summary).text = json.dumps(dict(check.details), default=str)[:4000]
            elif check.valid != True:  # noqa: E712
                errors += 1
                ET.SubElement(case, "error", message=f"unknown: {check.summary}").text = json.dumps(
                    dict(check.details), default=str
                )[:4000]
        suite.set("tests", str(tests))
        suite.set("failures", str(failures))
        suite.set("errors", str(errors))
        suite.set("skipped", str(skipped))
    return root


def _expected_text(result: RunResult) -> str:
    lines = [f"known defect: {result.known_defect}", "reproduced:"]
    lines += [f"  {c.name}: {c.summary}" for c in result.checks if c.valid is False]
    return "\n".join(lines)


def _xpass_note(result: RunResult) -> str:
    return (
        "XPASS: every check passed, so the known defect did not reproduce in this run; "
        f"it may be fixed (or not hit this time): {result.known_defect}"
    )


def write_junit(path: Path, results: Sequence[RunResult]) -> None:
    tree = ET.ElementTree(junit_xml(results))
    ET.indent(tree)
    tree.write(path, encoding="utf-8", xml_declaration=True)


# ------------------------------------------------------------------------ html

_COLORS = {True: "#1a7f37", False: "#cf222e", "unknown": "#9a6700"}
_VERDICT_COLORS = {
    "pass": "#1a7f37",
    "fail": "#cf222e",
    "unknown": "#9a6700",
    "hang": "#8250df",
    "error": "#6e7781",
    "xfail": "#bc4c00",
    "xpass": "#0969da",
    "skip": "#6e7781",
}
_EVENT_STYLE = {
    "load_done": ("#1a7f37", "load_done"),
    "fallback": ("#bc4c00", "fallback"),
    "transfer_timeout": ("#cf222e", "timeout"),
    "transfer_error": ("#cf222e", "error"),
    "load_failed": ("#cf222e", "load_failed"),
    "peer_disconnected": ("#6639ba", "disconnect"),
    "integrity": ("#0969da", "integrity"),
}


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _valid_text(valid: Any) -> str:
    return "PASS" if valid is True else "FAIL" if valid is False else "UNKNOWN"


def render_html(result: RunResult, versions: dict[str, Any] | None = None) -> str:
    h = result.history
    sc = result.scenario
    versions = versions or {}
    color = _VERDICT_COLORS.get(result.verdict, "#6e7781")
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{_e(sc.name)}: {_e(result.verdict.upper())}</title>",
        "<style>body{font:14px system-ui,sans-serif;margin:24px;color:#1f2328}"
        "table{border-collapse:collapse;margin:8px 0 20px}td,th{border:1px solid #d0d7de;padding:4px 8px;"
        "text-align:left;vertical-align:top}th{background:#f6f8fa}.badge{color:#fff;padding:2px 10px;"
        "border-radius:10px;font-weight:600}code,pre{font:12px ui-monospace,monospace}pre{white-space:pre-wrap}"
        "svg text{font:11px system-ui,sans-serif}</style></head><body>",
        f"<h1>{_e(sc.name)} <span class='badge' style='background:{color}'>{_e(result.verdict.upper())}</span></h1>",
        f"<p>{_e(sc.description)}</p>" if sc.description else "",
    ]
    if result.known_defect:
        note = {
            "xfail": "The known defect reproduced; the failures below are expected.",
            "xpass": "<b>Every check passed: the known defect did not reproduce. It may be fixed "
            "(or was not hit this time); rerun it, and drop <code>known_defect</code> once it stays fixed.</b>",
        }.get(result.verdict, "")
        parts.append(
            f"<p style='border-left:4px solid {color};padding-left:8px'><b>Known defect</b>: "
            f"{_e(result.known_defect)}<br>{note}</p>"
        )
    if result.reason:
        parts.append(f"<p><b>{_e(result.status)}</b>: {_e(result.reason)}</p>")
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
    ]
    parts.append("<table>" + "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in facts) + "</table>")
    parts.append("<h2>Checks</h2><table><tr><th>#</th><th>check</th><th>verdict</th><th>summary</th></tr>")
    for check in result.checks:
        c = _COLORS.get(check.valid, "#9a6700")  # type: ignore[call-overload]
        parts.append(
            f"<tr><td>{check.index + 1}</td><td>{_e(check.name)}</td>"
            f"<td style='color:{c};font-weight:600'>{_valid_text(check.valid)}</td><td>{_e(check.summary)}</td></tr>"
        )
    parts.append("</table>")
    parts.append("<h2>Timeline</h2>")
    parts.append(timeline_svg(h, [p for p in sc.processes], result.checks))
    parts.append(_steps_table(h))
    parts.append(_faults_table(h))
    parts.append(_processes_table(h, sc.roles()))
    if result.stacks:
        parts.append("<h2>Stacks</h2><ul>")
        for name, path in result.stacks.items():
            parts.append(f"<li><a href='{_e(path)}'>{_e(name)}</a></li>")
        parts.append("</ul>")
    parts.append("<h2>Files</h2><ul>")
    for name in ("scenario.yaml", "timeline.jsonl", "metrics.jsonl", "verdict.json", "junit.xml", "versions.json"):
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
    return (
        "<h2>Steps</h2><table><tr><th>step</th><th>action</th><th>t</th><th>took</th><th>outcome</th><th>error</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def _faults_table(h: History) -> str:
    windows = h.fault_windows()
    if not windows:
        return ""
    rows = "".join(
        f"<tr><td>{_e(w.name)}</td><td>{_e(w.kind)}</td><td>{_e(w.target or '')}</td><td>{w.start:.3f}</td>"
        f"<td>{'-' if w.end is None else f'{w.end:.3f}'}</td><td>{'yes' if w.injected else 'no'}</td></tr>"
        for w in windows
    )
    return (
        "<h2>Faults</h2><table><tr><th>fault</th><th>kind</th><th>target</th><th>from</th><th>until</th><th>injected</th></tr>"
        + rows
        + "</table>"
    )


def _processes_table(h: History, roles: dict[str, str]) -> str:
    rows = []
    for name, role in roles.items():
        incs = h.incarnations(name)
        desc = "; ".join(
            f"#{i.incarnation} pid {i.pid}: {i.start:.3f}-{'?' if i.end is None else f'{i.end:.3f}'}s rc {i.rc}"
            + (" (stopped)" if i.stopped_by_harness else "")
            for i in incs
        )
        links = f"<a href='procs/{_e(name)}.log'>log</a>"
        if role != "command":
            links += f" <a href='procs/{_e(name)}.events.jsonl'>events</a>"
        rows.append(f"<tr><td>{_e(name)}</td><td>{_e(role)}</td><td>{_e(desc or 'never started')}</td><td>{links}</td></tr>")
    return (
        "<h2>Processes</h2><table><tr><th>process</th><th>role</th><th>incarnations</th><th>files</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def timeline_svg(h: History, processes: Iterable[str], checks: Sequence[Any] = ()) -> str:
    """A lane per process (plus harness, nemesis and checks); fault windows shaded across
    all lanes; process lifetimes as bars; transfers as thin bars; outcomes as markers."""
    lanes = ["harness", "nemesis", *processes, "checks"]
    left, width, lane_h, top = 110, 900, 34, 24
    end = max(h.end, 0.001)
    height = top + lane_h * len(lanes) + 24
    y = {name: top + i * lane_h for i, name in enumerate(lanes)}

    def x(t: float) -> float:
        return left + max(0.0, min(t, end)) / end * width

    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{left + width + 20}' height='{height}'>"]
    for name in lanes:
        out.append(f"<text x='4' y='{y[name] + 20}'>{_e(name)}</text>")
        out.append(f"<line x1='{left}' x2='{left + width}' y1='{y[name] + lane_h}' y2='{y[name] + lane_h}' stroke='#eaeef2'/>")
    for w in h.fault_windows():
        x0, x1 = x(w.start), x(w.end if w.end is not None else end)
        label = f"{w.name} ({w.kind} {w.target or ''})"
        out.append(
            f"<rect x='{x0:.1f}' y='{top}' width='{max(x1 - x0, 2):.1f}' height='{lane_h * len(lanes)}' "
            f"fill='#cf222e' fill-opacity='0.10'><title>{_e(label)}: {w.start:.3f}-"
            f"{'end' if w.end is None else f'{w.end:.3f}'}s</title></rect>"
        )
        out.append(f"<rect x='{x0:.1f}' y='{y['nemesis'] + 8}' width='{max(x1 - x0, 3):.1f}' height='14' fill='#cf222e'/>")
        out.append(f"<text x='{x0 + 2:.1f}' y='{y['nemesis'] + 6}'>{_e(w.name)}</text>")
        if w.target in y:  # outline the window on the lane of the process it hit
            out.append(
                f"<rect x='{x0:.1f}' y='{y[w.target] + 9}' width='{max(x1 - x0, 3):.1f}' height='16' fill='none' "
                f"stroke='#cf222e' stroke-width='2'><title>{_e(label)}</title></rect>"
            )
    for name in processes:
        for inc in h.incarnations(name):
            x0, x1 = x(inc.start), x(inc.end if inc.end is not None else end)
            out.append(
                f"<rect x='{x0:.1f}' y='{y[name] + 12}' width='{max(x1 - x0, 2):.1f}' height='10' fill='#afb8c1'>"
                f"<title>{_e(name)} #{inc.incarnation} pid {inc.pid} rc {inc.rc}</title></rect>"
            )
        starts: dict[Any, float] = {}
        for entry in h.select(actor=name):
            if entry.f == "transfer_start":
                starts[entry.get("index")] = entry.t
            elif entry.f in ("transfer_done", "transfer_timeout", "transfer_error"):
                t0 = starts.pop(entry.get("index"), None)
                if t0 is not None:
                    c = "#1a7f37" if entry.f == "transfer_done" else "#cf222e"
                    out.append(
                        f"<rect x='{x(t0):.1f}' y='{y[name] + 24}' width='{max(x(entry.t) - x(t0), 2):.1f}' height='5' "
                        f"fill='{c}'><title>transfer {entry.get('index')}: {entry.f} after {entry.t - t0:.3f}s</title></rect>"
                    )
            if entry.f in _EVENT_STYLE:
                c, label = _EVENT_STYLE[entry.f]
                out.append(
                    f"<circle cx='{x(entry.t):.1f}' cy='{y[name] + 17}' r='4' fill='{c}'>"
                    f"<title>{entry.t:.3f}s {_e(label)} {_e(json.dumps(dict(entry.value), default=str)[:200])}</title></circle>"
                )
            elif entry.f == "status_change":
                out.append(
                    f"<text x='{x(entry.t):.1f}' y='{y[name] + 9}' fill='#0969da'>{_e(entry.get('status'))}</text>"
                )
            elif entry.f == "process_exit":
                out.append(
                    f"<text x='{x(entry.t) - 3:.1f}' y='{y[name] + 22}' fill='#cf222e'>x<title>exit rc {entry.get('rc')}</title></text>"
                )
    for entry in h.select(actor="harness", f="step", type="invoke"):
        out.append(
            f"<line x1='{x(entry.t):.1f}' x2='{x(entry.t):.1f}' y1='{y['harness'] + 6}' y2='{y['harness'] + 28}' stroke='#57606a'>"
            f"<title>step {_e(entry.get('step'))}: {_e(entry.get('text'))}</title></line>"
        )
    for entry in h.select(actor="harness", f=("mark", "hang", "await_timeout")):
        label = entry.get("mark") or entry.f
        out.append(f"<text x='{x(entry.t):.1f}' y='{y['harness'] + 30}' fill='#8250df'>{_e(label)}</text>")
    for check in checks:
        c = _COLORS.get(check.valid, "#9a6700")
        for t, label in check.marks:
            out.append(
                f"<circle cx='{x(t):.1f}' cy='{y['checks'] + 17}' r='5' fill='{c}'>"
                f"<title>{_e(check.name)}: {_e(label)} ({_valid_text(check.valid)})</title></circle>"
            )
    for i in range(6):
        t = end * i / 5
        out.append(f"<text x='{x(t) - 8:.1f}' y='{height - 6}' fill='#57606a'>{t:.2f}s</text>")
    out.append("</svg>")
    return "".join(out)
