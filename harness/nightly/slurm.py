"""``mxchaos nightly --slurm``: the night's scenarios spread over a SLURM cluster as one job array.

``SlurmBinding`` is a night binding (``harness.nightly.binding``) whose runs happen before the
night's loop asks for them. ``prepare`` places the scenarios that can run (``place``): the shared
ones dealt into lanes (``plan_column``; at most one lane per node of the partition, less one node
per ``alone`` scenario), and every ``alone`` scenario a lane of its own. Each lane is one task of
one ``sbatch --array`` (``harness.hosts.slurm_dispatch``): ``mxchaos run --repeat N --out <lane
folder> PATHS`` on a node of its own. When every task has ended, ``run`` hands the night each run
folder in turn, moved into the night's ``runs/`` and judged again from its files
(``harness.reports.report.load_run``: the dispatcher takes no lane's word for a verdict), so
``nightly.json``, ``junit.xml`` and the pages are written by the same code as a local night.

A lane that SLURM ended twice for a reason that is not the tests' (``slurm_dispatch``) gives each
of its runs a folder of its own that says so (``infrastructure.json``): the cell is
``environment broken: SLURM job J ... on node N ended NODE_FAIL`` (``harness.judge.envbroken``),
exit 4, never FAIL. The lanes' folders live in the night's folder (``<night>/slurm/``, with the
manifest and SLURM's output file of each task): the nodes must see it (a shared file system; a
lane whose folder the dispatcher cannot see is an infrastructure verdict that says so).
``nightly.json``'s ``hosts.slurm`` records each lane: its scenarios, job, node, attempts, the time
from submission to its start, and the time the gathering took.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.hosts.slurm_array import Group, partition_nodes
from harness.hosts.slurm_dispatch import FOLDER, Options, Outcome, dispatch
from harness.judge.envbroken import INFRA_FILE
from harness.judge.verdict import RunResult
from harness.nightly.binding import Bound, HereBinding, Observer
from harness.record.timeline import History
from harness.scenario import Scenario
from harness.scenario.placement import place, spread

__all__ = ["SlurmBinding", "lanes_of"]


def lanes_of(scenarios: Sequence[Scenario], nodes: int) -> list[tuple[str, tuple[Scenario, ...]]]:
    """(lane name, its scenarios): ``harness.scenario.placement.spread`` of the night's scenarios."""
    by_name = {sc.name: sc for sc in scenarios}
    return [(name, tuple(by_name[n] for n in names)) for name, names in spread([place(sc) for sc in scenarios], nodes)]


@dataclass
class SlurmBinding:
    """The night on SLURM (module docstring); ``bind`` is this machine's (the nodes run what it runs)."""

    options: Options
    log: Callable[[str], None] = lambda _m: None
    record: dict[str, Any] = field(default_factory=dict)  # nightly.json's "hosts": the dispatch goes in as "slurm"
    name: str = "slurm"

    def __post_init__(self) -> None:
        self._here = HereBinding()
        self._runs: dict[tuple[str, int], Path] = {}
        self._infra: dict[str, str] = {}
        self.outcomes: list[Outcome] = []

    def bind(self, scenario: Scenario) -> Bound:
        return self._here.bind(scenario)

    def prepare(self, scenarios: Sequence[Scenario], runs_dir: Path, repeat: int, seed: int | None) -> None:
        """Run every scenario's repeats on the cluster (bounded), then gather their run folders into
        ``runs_dir``, before the night asks for them."""
        spool = runs_dir.parent / "slurm"  # the lanes' folders, their manifest and SLURM's output files
        lanes = lanes_of(scenarios, self.options.lane_slots(partition_nodes(self.options.conf, self.options.partition)))
        seeded = ["--seed", str(seed)] if seed is not None else []
        groups = [Group(name, (sys.executable, "-m", "harness.cli", "run", "--repeat", str(repeat), "--out", FOLDER,
                               "-q", *seeded, *[str(Path(str(sc.path)).resolve()) for sc in members]), Path(FOLDER))
                  for name, members in lanes]
        for name, members in lanes:
            self.log(f"{name}: {', '.join(sc.name for sc in members)}")
        self.outcomes = dispatch(groups, spool, self.options, self.log)
        started = time.monotonic()
        for out, (_name, members) in zip(self.outcomes, lanes):
            if out.infra is not None:
                for sc in members:
                    self._infra[sc.name] = out.infra
                continue
            for sc in members:
                for run in sorted((out.folder / sc.name).glob("*/scenario.json")):
                    try:
                        run_seed = int(json.loads(run.read_text())["seed"])
                    except (OSError, ValueError, KeyError, TypeError):
                        continue
                    if (sc.name, run_seed) in self._runs:
                        continue
                    target = runs_dir / sc.name / run.parent.name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.move(str(run.parent), target)
                    self._runs[(sc.name, run_seed)] = target
        gather_s = time.monotonic() - started
        self.record["slurm"] = {
            "partition": self.options.partition, "time": self.options.time_limit, "gather_s": round(gather_s, 3),
            "nodes_per_lane": self.options.nodes_per_lane,
            "lanes": [{"name": name, "scenarios": [sc.name for sc in members], "job": out.job, "node": out.node,
                       "nodes": out.nodelist,
                       "rc": out.rc, "infra": out.infra, "attempts": out.attempts, "ends": out.ends, "gathered": out.gathered,
                       "folder": str(out.folder),
                       "queued_to_start_s": None if out.queued_to_start_s is None else round(out.queued_to_start_s, 3)}
                      for out, (name, members) in zip(self.outcomes, lanes)],
        }
        starts = [o.queued_to_start_s for o in self.outcomes if o.queued_to_start_s is not None]
        self.log(f"gathered {len(self._runs)} run folder(s) in {gather_s:.2f}s"
                 + (f"; submission to a lane's start: {min(starts):.2f}-{max(starts):.2f}s" if starts else ""))

    def run(self, scenario: Scenario, out_dir: Path, observers: Sequence[Observer]) -> RunResult:
        from harness.reports.report import load_run

        found = self._runs.get((scenario.name, scenario.seed))
        if found is not None:
            return load_run(found)
        why = self._infra.get(scenario.name) or (
            f"SLURM: no run of {scenario.name} seed {scenario.seed} came back from its lane")
        return _infra_result(scenario, out_dir, why)


def _infra_result(scenario: Scenario, out_dir: Path, why: str) -> RunResult:
    """A run folder that says the infrastructure ended this run (no verdict on NIXL)."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    run_dir = out_dir / scenario.name / f"{stamp}-infra-{scenario.seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / INFRA_FILE).write_text(json.dumps({"reason": why}))
    return RunResult(scenario=scenario, run_id=run_dir.name, run_dir=run_dir, status="error", reason=why,
                     verdict="error", history=History([]), checks=[], started_at=dt.datetime.now(dt.UTC).isoformat(),
                     seconds=0.0, seed=scenario.seed)
