"""Which process's log tells what went wrong in a run: the one a check that did not pass names
(its ``process``/``proc``/``reader``/``source`` parameter, or a process named in the check's name),
else one that died by a signal (``harness.record.deaths``). The terminal's next steps, JUnit's
failure bodies, the CI summary and the run page all ask here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.judge.verdict import RunResult
from harness.record.deaths import deaths

__all__ = ["check_log", "process_log", "telling_logs"]


def process_log(run_dir: Path, name: str) -> Path | None:
    """``<run>/procs/<name>.log`` (or wherever under the run folder a ``<name>.log`` lies)."""
    direct = run_dir / "procs" / f"{name}.log"
    if direct.is_file():
        return direct
    found = sorted(run_dir.rglob(f"{name}.log")) if run_dir.is_dir() else []
    return found[0] if found else None


def _named(result: RunResult, check: Any) -> list[str]:
    details = dict(getattr(check, "details", {}) or {})
    wanted = [str(details[k]) for k in ("process", "proc", "reader", "source") if isinstance(details.get(k), str)]
    wanted += [n for n in result.scenario.processes if n in check.name or n in str(check.summary)]
    return list(dict.fromkeys(wanted))


def check_log(result: RunResult, check: Any) -> tuple[str, Path] | None:
    """The process a check names and its log, when the run folder holds one."""
    for name in _named(result, check):
        log = process_log(result.run_dir, name)
        if log is not None:
            return name, log
    return None


def telling_logs(result: RunResult) -> list[tuple[str, str, Path]]:
    """``(process, why, log)``: the process the first check that did not pass names, then each
    process that died by a signal the harness did not send; each once, those with a log only."""
    out: list[tuple[str, str, Path]] = []
    seen: set[str] = set()
    for c in result.checks:
        if c.valid is True:
            continue
        named = check_log(result, c)
        if named is not None:
            out.append((named[0], f"named by the failing check {c.name}", named[1]))
            seen.add(named[0])
        break
    for d in deaths(result.history):
        if d.process in seen:
            continue
        log = process_log(result.run_dir, d.process)
        if log is not None:
            out.append((d.process, f"died by {d.signal} at {d.t:.3f}s", log))
            seen.add(d.process)
    return out
