"""mxchaos harness: scenario files -> real processes -> faults -> one timeline -> checks -> report.

Data flows one way (scenario -> runner -> timeline -> checks -> verdict -> report), and the
packages stand on floors, each importing only from those below it (bottom first)::

    leaves        errors, exits, spec, locate, counts, wrapped, scrape, toxiproxy, pki
    record/       timeline (History: its frozen view), fault windows, rates, cells, versions, load
    machine/      the state directory, the ledger of live runs, run scopes, process scans, ports
    hosts/ subjects/   where processes run (local, netns, ssh, lab); who plays them (envs, builds)
    checks/ faults/    registries: pure functions of the History; one module per fault kind
    scenario/     YAML -> frozen models, validated completely before any side effect; capabilities
    judge/        RunResult, judge, verdict_of; the integrity oracle (content)
    reports/      the run folder, the console, the pages
    engine/       the runner (phases, signals), the step interpreter, processes, nemesis, waits
    explore/ mutate/ commands/ matrix/ nightly/ cli/   the front ends

Extension points are registries: a fault kind is a module in ``harness/faults/``, a check
kind a module in ``harness/checks/``; a host kind goes behind ``harness.hosts.base.Host``.
Submodules are imported lazily, so ``import harness`` stays cheap for the pytest plugin.
"""

from __future__ import annotations

import importlib
from typing import Any

import mxref  # noqa: F401 - first: it turns gRPC's fork support off before anything imports grpc

__all__ = [
    "CheckResult",
    "Fault",
    "FaultSpec",
    "History",
    "RunResult",
    "Runner",
    "Scenario",
    "ScenarioInvalid",
    "Timeline",
    "load_scenario",
    "write_run_folder",
]

_WHERE = {
    "CheckResult": "harness.checks",
    "Fault": "harness.faults",
    "FaultSpec": "harness.faults",
    "History": "harness.record.timeline",
    "RunResult": "harness.judge.verdict",
    "Runner": "harness.engine.runner",
    "Scenario": "harness.scenario",
    "ScenarioInvalid": "harness.errors",
    "Timeline": "harness.record.timeline",
    "load_scenario": "harness.scenario",
    "write_run_folder": "harness.reports.report",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'harness' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
