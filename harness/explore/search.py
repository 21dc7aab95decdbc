"""The exploration: draw schedules with Hypothesis, run each as a real run, shrink a failure,
write the minimal scenario and measure how often it reproduces; all within one budget.

``explore(template, seed=, runs=, budget_s=, out_dir=)``:

1. **generate**: Hypothesis (``find``) draws up to ``runs`` schedules (``schedule.schedules``),
   seeded from ``seed`` (the engine's global seed, as ``pytest --hypothesis-seed`` sets it:
   ``hypothesis.seed`` would switch the database off), no per-example deadline, its example
   database under ``out_dir/hypothesis`` (a failure found before replays first when the same
   ``out_dir`` is explored again). Each schedule is written as a scenario file (``out_dir/schedules/``) and
   run by the ordinary runner into ``out_dir/runs/`` (its own run folder, report and all).
2. **failure**: a run whose verdict is fail, xfail, unknown or hang (a check was false, a step
   failed, the run hung). Its *signature* is its false checks (or its status when none was
   false); shrinking keeps to runs that share a false check with the first failure, so it
   shrinks that failure and not another. An ``error`` run (a harness error) is recorded and
   is not a failure; a ``skip`` ends the exploration (this machine lacks a capability).
3. **shrink** (``shrinker="goals"``, the default; ``harness.explore.shrink``): from the first
   failure, by the goals in order: fewest faults (each deletion tried twice), earliest offsets,
   shortest durations, first options; each candidate a real run, a schedule already run
   answered from the cache. ``shrinker="hypothesis"`` leaves it to Hypothesis' shrinker instead
   (it spends real runs on candidates that change a fault before it deletes one: see
   ``harness.explore.shrink``). Either stops at the shrink deadline (the budget less the time
   the reproduction needs): no new candidate runs after it.
4. **minimal**: the last failing schedule is written as ``out_dir/minimal.yaml`` (an ordinary
   scenario, named ``<template>_minimal``), then run ``repeat`` times (seeds seed, seed+1, ...
   like ``mxchaos run --repeat``) while the budget lasts; its rate of failing is stated with a
   95% Clopper-Pearson interval (``harness.record.rates``) in ``explore.json`` and in the file.

Every run is bounded by its scenario's ``budgets.run``, lowered to what is left of the budget
when that is less (a run cut short by it is no failure), and no run starts once the budget is
spent: the exploration ends within ``budget_s`` (plus a run's teardown). Ctrl-C: the run in
progress heals and tears down (the runner), the exploration stops and its report is written
with what it had (``outcome: interrupted``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, find, reject, settings
from hypothesis import core as hypothesis_core
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.errors import NoSuchExample
from hypothesis.internal.conjecture import providers as hypothesis_providers

from harness.engine.play import run_scenario
from harness.explore.schedule import Schedule, scenario_data, schedules
from harness.explore.shrink import GOALS, shrink
from harness.explore.template import Template
from harness.record.rates import upper_bound
from harness.scenario import load_scenario
from harness.scenario.emit import scenario_text

__all__ = ["Exploration", "Trial", "explore"]

FAILING_VERDICTS = ("fail", "xfail", "unknown", "hang")


@contextmanager
def _same_draws_whatever_is_imported() -> Iterator[None]:
    """Make a seed draw the same schedules in any process.

    Hypothesis now and then draws a value from a pool of constants it collects from the
    project's modules loaded so far (``sys.modules``), so a seed's schedules would change with
    what the process happened to import before (under pytest: with which tests ran earlier in
    the same worker). During an exploration that pool is empty (the built-in constants stay);
    without the hook (another Hypothesis) nothing is changed.
    """
    hook = getattr(hypothesis_providers, "_get_local_constants", None)
    cache: Any = getattr(getattr(hypothesis_providers, "CONSTANTS_CACHE", None), "cache", None)
    if hook is None or cache is None:
        yield
        return
    empty = type(hook())()
    hypothesis_providers._get_local_constants = lambda: empty
    cache.clear()
    try:
        yield
    finally:
        hypothesis_providers._get_local_constants = hook
        cache.clear()


@dataclass
class Trial:
    """One schedule the exploration ran (or answered without a run)."""

    index: int
    phase: str  # generate | shrink | reproduce
    schedule: Schedule
    verdict: str | None = None  # None: not run (budget spent, stopped)
    status: str = ""
    reason: str = ""
    false_checks: list[str] = field(default_factory=list)
    run_dir: str | None = None
    scenario_file: str | None = None
    seconds: float = 0.0
    seed: int = 0
    note: str = ""
    inapplicable: str = ""  # a drawn fault could not be injected (e.g. no connection to reset): no verdict on the property

    @property
    def failed(self) -> bool:
        # a false check is a failure even when a later fault could not be injected; a run that only
        # ended early because a drawn fault could not be injected says nothing about the property
        return self.verdict in FAILING_VERDICTS and (bool(self.false_checks) or not self.inapplicable)

    def signature(self) -> frozenset[str]:
        return frozenset(self.false_checks) if self.false_checks else frozenset({f"status: {self.status}"})

    def to_json(self, template: Template) -> dict[str, Any]:
        return {
            "index": self.index, "phase": self.phase, "faults": self.schedule.to_json(template),
            "text": self.schedule.describe(template), "verdict": self.verdict, "status": self.status,
            "reason": self.reason, "false_checks": self.false_checks, "run_dir": self.run_dir,
            "scenario_file": self.scenario_file, "seconds": round(self.seconds, 3), "seed": self.seed,
            "note": self.note, "inapplicable": self.inapplicable,
        }


@dataclass
class Exploration:
    """What an exploration did; ``harness.explore.report`` writes it."""

    template: Template
    seed: int
    runs: int
    budget_s: float
    repeat: int
    out_dir: Path
    shrinker: str = "goals"  # goals (harness.explore.shrink) | hypothesis (Hypothesis' own shrinker)
    started_at: str = ""
    seconds: float = 0.0
    outcome: str = "not_found"  # found | not_found | interrupted | skipped
    stop_reason: str = ""
    trials: list[Trial] = field(default_factory=list)
    target: frozenset[str] | None = None  # the signature being shrunk
    first_failure: int | None = None
    shrink_path: list[int] = field(default_factory=list)  # trial indices, each failing and smaller
    minimal: int | None = None  # trial index of the minimal failing schedule
    minimal_file: str | None = None
    reproduction: list[Trial] = field(default_factory=list)
    cache_hits: int = 0
    answered_without_run: int = 0

    def rate(self) -> dict[str, Any] | None:
        """The minimal scenario's rate of failing over its repeats, with the 95% interval."""
        done = [t for t in self.reproduction if t.verdict is not None and t.verdict not in ("skip", "error")]
        if not done:
            return None
        n = len(done)
        k = sum(1 for t in done if t.failed)
        return {"k": k, "n": n, "rate": round(k / n, 3), "lower": round(1 - upper_bound(n - k, n), 3),
                "upper": round(upper_bound(k, n), 3), "confidence": 0.95}


def _size(schedule: Schedule) -> tuple[int, int, float]:
    """How big a schedule is by the shrinking goals: faults, then total offset, then total duration."""
    durations = sum(float(v) for f in schedule.faults for k, v in f.values if k == "duration" and isinstance(v, int | float))
    return len(schedule.faults), sum(f.offset_ms for f in schedule.faults), durations


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


class _Explorer:
    def __init__(self, ex: Exploration, echo: Callable[[str], None]) -> None:
        self.ex = ex
        self.echo = echo
        self.t0 = time.monotonic()
        self.deadline = self.t0 + ex.budget_s
        self.cache: dict[str, Trial] = {}
        self.stopped = ""  # why no more runs start
        self.interrupted = False
        self.last_failing: Trial | None = None
        self.phase = "generate"
        self.goal_path: list[int] = []
        (ex.out_dir / "schedules").mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------ budget

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def typical_run(self) -> float:
        done = [t.seconds for t in self.ex.trials if t.verdict is not None]
        return statistics.median(done) if done else 0.0

    def reserve(self) -> float:
        """Time kept back for the reproduction runs once a failure is being shrunk."""
        return self.ex.repeat * self.typical_run() if self.ex.target is not None else 0.0

    def may_run(self) -> bool:
        if self.stopped:
            return False
        if self.remaining() - self.reserve() < max(self.typical_run(), 1.0):
            self.stopped = "budget spent" if self.ex.target is None else "shrink deadline (budget less the reproduction)"
            return False
        return True

    # ------------------------------------------------------------------ runs

    def run(self, schedule: Schedule, phase: str, *, seed: int | None = None, scenario_file: Path | None = None) -> Trial:
        ex = self.ex
        trial = Trial(len(ex.trials) + len(ex.reproduction) + 1, phase, schedule)
        if scenario_file is None:
            data, comments = scenario_data(ex.template, schedule)
            header = [f"mxchaos explore: schedule {trial.index} of {ex.template.path} (seed {ex.seed}, {phase})",
                      f"  {schedule.describe(ex.template)}"]
            scenario_file = ex.out_dir / "schedules" / f"{trial.index:03d}.yaml"
            scenario_file.write_text(scenario_text(data, header=header, step_comments=comments, file=scenario_file))
        scenario = load_scenario(scenario_file, seed=seed)
        trial.scenario_file, trial.seed = str(scenario_file), scenario.seed
        left = max(1.0, self.remaining())
        clamped = left < scenario.budgets.run  # the run may not outlast the exploration's budget
        if clamped:
            scenario = scenario.model_copy(update={"budgets": scenario.budgets.model_copy(update={"run": left})})
        self.echo(f"--- [{phase} {trial.index}] {schedule.describe(ex.template)}")
        result = run_scenario(scenario, ex.out_dir / "runs")
        trial.verdict, trial.status, trial.reason = result.verdict, result.status, result.reason
        if clamped and result.verdict == "hang":
            trial.inapplicable = f"cut short at {left:.0f}s by the exploration's budget (budgets.run lowered to fit it)"
        trial.false_checks = [c.name or c.kind for c in result.checks if c.valid is False]
        trial.run_dir, trial.seconds = str(result.run_dir), result.seconds
        refused = [w for w in result.history.fault_windows() if w.outcome == "failed" and not w.indeterminate]
        if refused:
            trial.inapplicable = f"{refused[0].name} ({refused[0].kind}): {refused[0].error}"
            trial.note = "inapplicable: a fault could not be injected"
        failing = f"  false: {', '.join(trial.false_checks)}" if trial.false_checks else ""
        failing += f"  inapplicable: {trial.inapplicable}" if trial.inapplicable else ""
        self.echo(f"    {result.verdict.upper()} in {result.seconds:.1f}s  {result.run_dir}{failing}")
        if result.status == "interrupted":
            self.interrupted, self.stopped = True, "interrupted"
        elif result.verdict == "skip":
            self.stopped = f"skipped: {result.reason}"
        return trial

    def failing(self, schedule: Schedule) -> bool:
        """Hypothesis' condition: whether the schedule shows the failure being shrunk (the
        first failure found sets which one that is)."""
        ex = self.ex
        key = schedule.key()
        trial = self.cache.get(key)
        if trial is not None:
            ex.cache_hits += 1
        elif not self.may_run():
            ex.answered_without_run += 1
            return False
        else:
            trial = self.run(schedule, self.phase)
            ex.trials.append(trial)
            self.cache[key] = trial
            if trial.failed and ex.target is None:
                ex.target, ex.first_failure, self.phase = trial.signature(), trial.index, "shrink"
                self.echo(f"    failure found: {', '.join(sorted(ex.target))}; shrinking")
            elif trial.failed and ex.target is not None and not (trial.signature() & ex.target):
                trial.note = "another failure (not the one being shrunk)"
        if trial.inapplicable and not trial.failed:
            reject()  # Hypothesis: not a valid example (neither passing nor failing)
        if trial.failed and ex.target is not None and trial.signature() & ex.target:
            self.last_failing = trial
            return True
        return False

    def shrink_fails(self, schedule: Schedule, attempt: int) -> bool | None:
        """The goals shrinker's question (``harness.explore.shrink``): does this candidate show
        the failure? A first attempt of a schedule already run is answered from the cache; None
        once no run may start."""
        ex = self.ex
        key = schedule.key()
        trial = self.cache.get(key) if attempt == 0 else None
        if trial is not None:
            ex.cache_hits += 1
        elif not self.may_run():
            return None
        else:
            trial = self.run(schedule, "shrink")
            if attempt:
                trial.note = f"retry {attempt + 1} of a candidate"
            ex.trials.append(trial)
            self.cache[key] = trial
        same = trial.failed and ex.target is not None and bool(trial.signature() & ex.target)
        if same:
            self.last_failing = trial
        elif trial.failed:
            trial.note = "another failure (not the one being shrunk)"
        return same

    def shrink(self) -> None:
        """The goals shrinker from the first failure; the shrinking path is its accepted steps."""
        first = self.last_failing
        if first is None or self.ex.shrinker != "goals":
            return
        self.phase = "shrink"
        self.echo(f"    shrinking: {', '.join(goal for goal, _, _ in GOALS)}")
        steps = shrink(first.schedule, self.ex.template, self.shrink_fails)
        path = [first.index]
        for goal, schedule in steps:
            trial = next(t for t in reversed(self.ex.trials) if t.schedule == schedule and t.failed)
            path.append(trial.index)
            self.last_failing = trial
            self.echo(f"    smaller ({goal}): #{trial.index} {schedule.describe(self.ex.template)}")
        self.goal_path = path

    def search(self) -> None:
        ex = self.ex
        template = ex.template
        # From Hypothesis' own defaults, not the profile loaded in this process: under CI
        # (``CI`` set) Hypothesis loads its "ci" profile, whose ``derandomize`` would replace
        # the seed with a hash of the code, so a seed drew other schedules there.
        config = settings(
            settings.get_profile("default"), derandomize=False,
            max_examples=max(1, ex.runs), deadline=None, database=DirectoryBasedExampleDatabase(str(ex.out_dir / "hypothesis")),
            phases=(Phase.explicit, Phase.reuse, Phase.generate, *((Phase.shrink,) if ex.shrinker == "hypothesis" else ())),
            suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet, print_blob=False,
        )
        # one database key per template and fault space: a failure replays only where it was found
        digest = hashlib.sha256(json.dumps([template.name, template.space_json()], sort_keys=True).encode()).digest()
        # Seeded *and* with a database: ``hypothesis.seed`` / ``derandomize`` would switch the
        # database off, so the seed goes where ``pytest --hypothesis-seed`` puts it (the engine's
        # global seed), while ``find``'s explicit database key keeps the database on.
        previous = hypothesis_core.global_force_seed
        hypothesis_core.global_force_seed = ex.seed  # type: ignore[assignment]  # declared None, read as an int seed
        try:
            with _same_draws_whatever_is_imported():
                find(schedules(template), self.failing, settings=config, database_key=b"mxchaos-explore:" + digest)
        except NoSuchExample:
            pass
        except KeyboardInterrupt:
            self.interrupted, self.stopped = True, "interrupted"
        finally:
            hypothesis_core.global_force_seed = previous

    def chain(self) -> list[int]:
        """The shrinking path: the first failure, then each later failure of the same kind that
        is smaller by the shrinking goals (fewer faults, then earlier offsets, then shorter
        durations), ending at the minimal schedule Hypothesis settled on."""
        ex = self.ex
        if ex.target is None or self.last_failing is None:
            return []
        if self.goal_path:
            return self.goal_path
        same = [t for t in ex.trials if t.failed and t.signature() & ex.target and t.index <= self.last_failing.index]
        path: list[Trial] = []
        for t in same:
            if not path or _size(t.schedule) < _size(path[-1].schedule):
                path.append(t)
        if path[-1].index != self.last_failing.index:
            path.append(self.last_failing)
        return [t.index for t in path]

    def reproduce(self) -> None:
        ex = self.ex
        best = self.last_failing
        if best is None:
            return
        ex.minimal = best.index
        name = f"{ex.template.name}_minimal"
        data, comments = scenario_data(ex.template, best.schedule, name=name)
        path = ex.out_dir / "minimal.yaml"
        ex.minimal_file = str(path)

        def write(rate_line: str) -> None:
            header = [
                f"The minimal schedule `mxchaos explore` found from {ex.template.path} with --seed {ex.seed}",
                f"  found as schedule {ex.first_failure}, shrunk in {len(ex.shrink_path) - 1} step(s) to schedule {best.index}",
                f"  its run: {best.run_dir}",
                f"  false: {', '.join(best.false_checks) or best.status}",
                f"  {rate_line}",
                "Reproduce it: mxchaos run THIS_FILE (--repeat N for a rate)",
            ]
            path.write_text(scenario_text(data, header=header, step_comments=comments, file=path))

        write("reproduction: not measured yet")
        self.stopped = ""  # the reserve was kept for this
        for i in range(ex.repeat):
            if self.interrupted or self.remaining() < max(self.typical_run(), 1.0):
                break
            trial = self.run(best.schedule, "reproduce", seed=best.seed + i, scenario_file=path)
            ex.reproduction.append(trial)
            if self.stopped:
                break
        rate = ex.rate()
        if rate is not None:
            write(f"reproduces in {rate['k']}/{rate['n']} runs (95% interval {rate['lower']:.2f}..{rate['upper']:.2f})")
        else:
            write("reproduction: no repeat ran within the budget")


def explore(
    template: Template, *, seed: int, runs: int, budget_s: float, out_dir: Path, repeat: int = 3,
    shrinker: str = "goals", echo: Callable[[str], None] | None = None,
) -> Exploration:
    """Run the exploration (see the module docstring) and return what it did (not yet written)."""
    say = echo or (lambda line: print(line, flush=True, file=sys.stdout))
    out_dir.mkdir(parents=True, exist_ok=True)
    ex = Exploration(template, seed, runs, budget_s, repeat, out_dir, shrinker=shrinker, started_at=_now())
    explorer = _Explorer(ex, say)
    try:
        explorer.search()
        if not explorer.interrupted:
            explorer.shrink()
        ex.shrink_path = explorer.chain()
        if explorer.last_failing is not None and not explorer.interrupted:
            explorer.reproduce()
    except KeyboardInterrupt:  # between runs (during one, the runner turns it into an interrupted run)
        explorer.interrupted, explorer.stopped = True, "interrupted"
    if explorer.last_failing is not None and ex.minimal is None:
        ex.minimal = explorer.last_failing.index
        ex.shrink_path = ex.shrink_path or explorer.chain()
    ex.seconds = time.monotonic() - explorer.t0
    if explorer.interrupted:
        ex.outcome = "interrupted"
    elif explorer.stopped.startswith("skipped"):
        ex.outcome = "skipped"
    else:
        ex.outcome = "found" if ex.minimal is not None else "not_found"
    ex.stop_reason = explorer.stopped
    return ex
