"""Verdicts: what a run came to, judged from its history alone.

``RunResult`` is what a run hands to the report, the console and the pytest plugin;
``judge`` runs a scenario's checks over a history (pure: ``mxchaos check`` re-judges a saved
run with it); ``verdict_of`` merges the run's status and its check results into one verdict.
Nothing here starts a process or a thread, so readers of results never import the runner.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from harness import checks as check_registry
from harness.judge import content
from harness.record.timeline import History
from harness.scenario import Scenario

__all__ = ["OK_VERDICTS", "RUN_STATUSES", "VERDICTS", "RunResult", "RunStatus", "judge", "result_to_json", "verdict_of"]

# pass | fail | unknown | hang | error, and: xfail / xpass (a known_defect scenario failed /
# passed), skip (a capability its faults require is missing; nothing ran), not_exercised (a
# fault's witness shows it had no effect: the scenario did not happen, so it is judged neither way)
VERDICTS = ("pass", "fail", "unknown", "hang", "error", "xfail", "xpass", "skip", "not_exercised")
OK_VERDICTS = ("pass", "xfail", "xpass", "skip")  # what does not fail `mxchaos run`

RunStatus = Literal["completed", "step_failed", "hang", "interrupted", "error", "skipped", "crashed"]
# how a run went; ``crashed``: the harness died mid-run (SIGKILL, OOM): only ``mxchaos check``
# of its folder gives it, judging what the timeline recorded up to then
RUN_STATUSES: tuple[str, ...] = ("completed", "step_failed", "hang", "interrupted", "error", "skipped", "crashed")


@dataclass
class RunResult:
    scenario: Scenario
    run_id: str
    run_dir: Path
    status: str  # a RunStatus
    reason: str
    verdict: str  # one of VERDICTS
    history: History
    checks: list[check_registry.NamedResult]
    started_at: str
    seconds: float
    seed: int
    failed_step: str | None = None
    stacks: dict[str, str] = field(default_factory=dict)
    interrupted_by: int | None = None
    missing_capabilities: list[str] = field(default_factory=list)  # verdict skip: what is missing
    not_exercised: list[str] = field(default_factory=list)  # each fault that had no effect, with its witness

    @property
    def ok(self) -> bool:
        """Whether this run lets ``mxchaos run`` exit 0 (pass, xfail, xpass, skip)."""
        return self.verdict in OK_VERDICTS

    @property
    def known_defect(self) -> str | None:
        return self.scenario.known_defect


def judge(scenario: Scenario, history: History) -> list[check_registry.NamedResult]:
    """Run the scenario's checks (its own, then the implicit ones) over a history (pure; ``mxchaos check`` re-judges with it)."""
    facts = check_registry.RunFacts(roles=scenario.roles(), expected=content.lazy_expected(scenario),
                                    grown=content.lazy_grown(scenario),
                                    players=scenario.players(), read_windows=scenario.read_windows())
    return [
        check_registry.evaluate(i, kind, params, history, facts)
        for i, (kind, params) in enumerate(scenario.judged_entries())
    ]


def verdict_of(status: str, results: Sequence[check_registry.NamedResult], known_defect: str | None = None,
               not_exercised: Sequence[str] = ()) -> str:
    """The run's verdict: ``skip`` (nothing ran), ``hang``, ``error`` (a harness error, an
    interrupt, a failed heal, a crash of the harness), ``not_exercised`` (a fault had no
    effect, ``harness.judge.exercised``: the scenario did not happen, whatever its checks
    say, and whatever step failed because of it, e.g. a drain whose ``drain_started`` never
    came; a known defect's too; the failed step stays in the run's reason), ``fail`` (a step failed or a check is false), ``unknown``
    (a check is unknown), else ``pass``. For a scenario with a ``known_defect``, steps that
    all completed with a false check are ``xfail`` (the defect reproduced) and a pass is
    ``xpass`` (it did not: fixed?); a failed step stays ``fail``: the scenario did not get
    to where it judges the defect (a process that did not start is not the defect)."""
    if status == "skipped":
        return "skip"
    if status == "hang":
        return "hang"
    if status in ("error", "interrupted", "crashed"):
        return "error"
    if not_exercised:
        return "not_exercised"
    merged = check_registry.merge_valid(r.valid for r in results)
    if status == "step_failed":
        return "fail"
    if merged is False:
        return "xfail" if known_defect else "fail"
    if merged == "unknown":
        return "unknown"
    return "xpass" if known_defect else "pass"


def result_to_json(result: RunResult) -> dict[str, Any]:
    return {
        "scenario": result.scenario.name,
        "run_id": result.run_id,
        "run_dir": str(result.run_dir),
        "seed": result.seed,
        "verdict": result.verdict,
        "status": result.status,
        "reason": result.reason,
        "failed_step": result.failed_step,
        "started_at": result.started_at,
        "seconds": round(result.seconds, 3),
        "known_defect": result.scenario.known_defect,
        "missing_capabilities": result.missing_capabilities,
        "not_exercised": result.not_exercised,
        "checks": [r.to_json() for r in result.checks],
        "stacks": result.stacks,
        "interrupted_by": result.interrupted_by,
    }
