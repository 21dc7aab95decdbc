"""Which scenarios of a matrix column (or a night on SLURM) run side by side, and how many at once.

A column used to be one ``mxchaos run`` of every scenario, one after another. Most scenarios
share nothing but the CPU (each run has its own processes, ports, folders and stores), so a
column deals them into lanes that run at once, at most ``jobs`` lanes (two per core of the machine
by default: ``default_jobs``), and then runs, one at a time with nothing beside it, every scenario
that must run alone (``LanePlacement.alone``):

* one that says so: ``schedule: alone`` in its file (``schedule: shared`` overrides what would
  be inferred);
* one whose faults or hosts touch state the whole machine shares: a capability in
  ``GLOBAL_CAPABILITIES`` (network namespaces, iptables, tc, ss socket kills, lab hosts, a GPU
  or RDMA device; ``harness.scenario.capabilities.scenario_requirements`` names them). Root is a
  privilege, not shared state: every fault that acts on the machine's network names its tool
  beside it, and the faults that need root alone act on what one run owns (a FUSE mount over
  its own checkpoint folder, one process's time namespace, one traced process);
* one with ``command`` processes (CPU hogs, arbitrary programs: load and state we cannot bound);
* one whose timing windows are tight: an ``elapsed`` check bounded ``within`` at most
  ``TIGHT_WITHIN_S``. Its verdict is about latency; a neighbour's load would move it.

Lanes are balanced longest first on the cells' ``seconds`` of an earlier matrix when one is
given (``--baseline``), else on equal weights in file order. ``plan_column`` decides (pure);
``harness.matrix.schedule.run_plan`` runs a plan through the matrix's runner: each lane and the lone set one
``mxchaos run`` into a folder of its own under the column's, their ``summary.json`` joined into
the column's (``merge_summaries``), which the matrix reads as before.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.checks.deadlines import Bound
from harness.scenario.capabilities import scenario_requirements

__all__ = ["GLOBAL_CAPABILITIES", "LANES_PER_CORE", "TIGHT_WITHIN_S", "LanePlacement", "Plan", "default_jobs", "place",
           "plan_column", "spread"]

# capabilities whose faults or hosts act on what every process of the machine shares
GLOBAL_CAPABILITIES = frozenset({"netns", "iptables", "tc", "ss", "inventory", "cuda", "rdma"})
TIGHT_WITHIN_S = 3.0  # an elapsed check bounded within this is a latency verdict: its scenario runs alone


@dataclass(frozen=True)
class LanePlacement:
    """Whether a scenario may run beside others in a column, and why not."""

    name: str
    alone: bool
    reason: str  # why alone ("" when shared)


def place(scenario: Any) -> LanePlacement:
    """``scenario``'s placement: its own ``schedule`` when given, else inferred (module docstring)."""
    name = str(scenario.name)
    declared = getattr(scenario, "schedule", None)
    if declared == "alone":
        return LanePlacement(name, True, "declared schedule: alone")
    if declared == "shared":
        return LanePlacement(name, False, "")
    reason = _inferred_reason(scenario)
    return LanePlacement(name, bool(reason), reason)


def _inferred_reason(scenario: Any) -> str:
    needs = scenario_requirements(scenario)
    touched = sorted(set(needs) & GLOBAL_CAPABILITIES)
    if touched:
        cap = touched[0]
        return f"needs {', '.join(touched)} ({'; '.join(needs[cap])})"
    commands = sorted(name for name, spec in scenario.processes.items() if getattr(spec, "role", "") == "command")
    if commands:
        return f"runs commands ({', '.join(commands)})"
    tight = _tight_check(scenario)
    if tight:
        return tight
    return ""


def _tight_check(scenario: Any) -> str:
    for entry in getattr(scenario, "checks", ()):
        body = _check_body(entry, "elapsed")
        within = getattr(body, "within", None) if body is not None else None
        if isinstance(within, Bound):  # in the reader's stall deadlines: at the contract's
            within = within.resolve(body.contract.deadlines())
        if within is not None and float(within) <= TIGHT_WITHIN_S:
            label = getattr(body, "name", None) or "elapsed"
            return f"timing window within {float(within):g}s ({label})"
    return ""


def _check_body(entry: Any, kind: str) -> Any:
    """The parameters of a check entry of ``kind`` (``{elapsed: {...}}``), else None."""
    root = getattr(entry, "root", entry)
    if isinstance(root, Mapping):
        return root.get(kind)
    return getattr(root, kind, None)


LANES_PER_CORE = 2
"""A shared scenario mostly waits (for heartbeats to time out, a reaper's interval, a budget)
and takes a core only while its processes start and its READs poll: a whole column on 2 cores
used 1.0 core on average with 2 lanes (437 CPU-s in 436 s). With 4 lanes it took 317 s instead
of 436 s, every cell as before, and its 55 shared scenarios passed 3 runs of 3 each (1.7 cores
used; 2026-12-03). The scenarios whose verdicts a neighbour's load would move run alone anyway."""


def default_jobs() -> int:
    """Lanes at once: ``LANES_PER_CORE`` per core of the machine."""
    return max(1, (os.cpu_count() or 1) * LANES_PER_CORE)


@dataclass(frozen=True)
class Plan:
    """A column's order: ``lanes`` run at once (each its scenarios one after another), then
    ``alone`` one at a time with nothing beside them."""

    lanes: tuple[tuple[str, ...], ...]
    alone: tuple[str, ...]

    @property
    def side_by_side(self) -> bool:
        return len(self.lanes) > 1


def plan_column(placements: Sequence[LanePlacement], jobs: int, seconds: Mapping[str, float] | None = None) -> Plan:
    """Deal the shared scenarios into at most ``jobs`` lanes, longest first onto the least loaded
    lane (``seconds``: an earlier run's duration per scenario; unknown ones weigh the median,
    or 1 when none is known); each lane keeps file order. ``jobs`` 1: one lane, as before."""
    if jobs < 1:
        raise ValueError(f"jobs {jobs}: at least 1 lane")
    shared = [p.name for p in placements if not p.alone]
    alone = tuple(p.name for p in placements if p.alone)
    count = min(jobs, len(shared))
    if count <= 1:
        return Plan((tuple(shared),) if shared else (), alone)
    known = sorted(float(v) for v in (seconds or {}).values() if v and v > 0)
    default = known[len(known) // 2] if known else 1.0
    weight = {n: float((seconds or {}).get(n) or default) for n in shared}
    order = {n: i for i, n in enumerate(shared)}
    loads = [0.0] * count
    members: list[list[str]] = [[] for _ in range(count)]
    for name in sorted(shared, key=lambda n: (-weight[n], order[n])):
        lane = min(range(count), key=lambda i: (loads[i], i))
        loads[lane] += weight[name]
        members[lane].append(name)
    return Plan(tuple(tuple(sorted(m, key=order.__getitem__)) for m in members), alone)




def spread(placements: Sequence[LanePlacement], nodes: int) -> list[tuple[str, tuple[str, ...]]]:
    """Lanes for a cluster of ``nodes`` (``--slurm``), each a node of its own: the shared scenarios
    dealt into at most ``nodes`` less one per lone scenario (at least one), and each lone scenario
    a lane of its own. (lane name, its scenario names), the lone ones last."""
    alone = [p.name for p in placements if p.alone]
    plan = plan_column(placements, max(1, nodes - len(alone)))
    return [(f"lane-{i + 1}", lane) for i, lane in enumerate(plan.lanes)] + [(f"alone-{n}", (n,)) for n in plan.alone]
