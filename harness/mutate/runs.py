"""Run a scenario selection against one copy of the subject and read back what each run judged.

The selection runs in a child ``mxchaos run`` (``python -I -m harness.cli``): ``-I`` keeps the
harness on its own code, while ``PYTHONPATH`` (which ``-I`` ignores for the harness itself) puts
the scratch copy first for every process the harness starts, so the subject's processes import
the mutant. Every wait is bounded: the child gets ``timeout_s``; past it, SIGINT (the harness
heals its faults and stops its processes), then SIGKILL of its whole session.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.record.saved import RunRecordDoc, SavedDocError, SummaryDoc, VerdictDoc
from harness.reports.invocation import is_time_bound

__all__ = ["FailedCheck", "Outcome", "read_outcomes", "run_selection"]

PASSING = ("pass", "xfail", "xpass", "skip")
# ``python -I -c _FROM_COPY FOLDER ARGS...``: the harness imported from FOLDER (a mutant of its fault injection)
_FROM_COPY = "import sys; sys.path.insert(0, sys.argv.pop(1)); from harness.cli import main; sys.exit(main())"
INTERRUPT_GRACE_S = 60.0
# how a failed step words a wait that ran out (harness.engine.runner): the machine's load may be the cause
_STEP_TIMING = ("within", "budget", "timed out", "deadline")


@dataclass(frozen=True)
class FailedCheck:
    kind: str
    name: str
    summary: str
    timing: bool  # a time bound (``harness.reports.invocation.is_time_bound``)
    valid: Any = False  # False, or "unknown"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "summary": self.summary[:300], "timing": self.timing,
                "valid": self.valid}


@dataclass
class Outcome:
    """One run of one scenario: its verdict and what did not pass."""

    scenario: str
    verdict: str
    run_dir: str = ""
    failed: list[FailedCheck] = field(default_factory=list)
    step: str | None = None  # why a step failed (status step_failed), else None

    @property
    def killed(self) -> bool:
        return self.verdict not in PASSING

    @property
    def timing_only(self) -> bool:
        """Killed, and only by time bounds (a failed step whose wait ran out counts as one)."""
        if not self.killed:
            return False
        behaviour = [c for c in self.failed if not c.timing and c.valid is False]
        step_behaviour = self.step is not None and not any(w in self.step for w in _STEP_TIMING)
        timed = any(c.timing for c in self.failed) or (self.step is not None and not step_behaviour)
        return timed and not behaviour and not step_behaviour

    def to_json(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "verdict": self.verdict, "killed": self.killed,
                "timing_only": self.timing_only, "step": self.step, "run_dir": self.run_dir,
                "failed": [c.to_json() for c in self.failed]}


def run_selection(pythonpath: Path, paths: Sequence[str], out: Path, *, k: str | None = None,
                  timeout_s: float = 1800.0, log: Path | None = None, subject: str | None = None) -> dict[str, list[Outcome]]:
    """``mxchaos run`` of ``paths`` with ``pythonpath`` first on the subject's path (and ``subject``
    as its ``--subject``); the outcomes by scenario (several runs each with ``--repeat``). An empty
    dict when nothing ran."""
    boot = (["-c", _FROM_COPY, str(pythonpath)] if (pythonpath / "harness" / "__init__.py").is_file()
            else ["-m", "harness.cli"])
    argv = [sys.executable, "-I", *boot, "run", "--out", str(out), "-q", *(["-k", k] if k else []),
            *(["--subject", subject] if subject else []), *paths]
    inherited = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pythonpath), *([inherited] if inherited else [])])}
    out.mkdir(parents=True, exist_ok=True)
    with open(log or out / "mutate-run.log", "ab") as sink:
        proc = subprocess.Popen(argv, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop(proc)
    return read_outcomes(out)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT (the harness heals and tears down), then SIGKILL of the child's session."""
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=INTERRUPT_GRACE_S)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


def read_outcomes(out: Path) -> dict[str, list[Outcome]]:
    """The outcomes an ``mxchaos run --out`` folder holds (its ``summary.json`` and each run's
    ``verdict.json``); a run without a verdict is an ``error`` naming why."""
    summary = SummaryDoc.read_or_none(SummaryDoc.in_folder(out))
    found: dict[str, list[Outcome]] = {}
    for name, run in summary.runs() if summary is not None else ():
        found.setdefault(name, []).append(_outcome(name, run))
    return found


def _outcome(name: str, run: RunRecordDoc) -> Outcome:
    run_dir = run.run_dir
    try:
        verdict = VerdictDoc.read(VerdictDoc.in_folder(Path(run_dir)))
    except SavedDocError as exc:
        return Outcome(name, run.verdict or "error", run_dir, step=f"its verdict cannot be read: {exc}")
    if verdict is None:
        return Outcome(name, run.verdict or "error", run_dir, step=f"no {VerdictDoc.FILE} in {run_dir}")
    failed = [FailedCheck(str(c.get("kind")), str(c.get("name")), str(c.get("summary") or ""),
                          is_time_bound(str(c.get("kind")), str(c.get("summary") or "")), c.get("valid"))
              for c in verdict.failed_checks()]
    # a fault whose witness showed no effect: the scenario did not happen (no time bound)
    failed += [FailedCheck("not_exercised", f"NOT EXERCISED {why.split(': ', 1)[0]}", why, False)
               for why in verdict.not_exercised]
    step = verdict.reason if verdict.status not in ("", "completed") else None
    return Outcome(name, verdict.verdict, run_dir, failed, step)
