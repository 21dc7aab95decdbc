"""mxchaos harness: scenario files -> real processes -> faults -> one timeline -> checks -> report.

Data flows one way::

    scenario/     YAML -> frozen models, validated completely before any side effect
    runner.py     a run's phases in order, signals, the step interpreter; the phases are
                  modules of their own: launch (argv + env), checkpoint, processes, proxies,
                  watch (monitor, scraper, watchdog), nemesis (faults), waits (the run clock),
                  ledger (live runs, for cleanup)
    timeline.py   one append-only, monotonic-clock record of everything (History: frozen view)
    checks/       pure functions of the History -> true / false / "unknown"
    verdict.py    RunResult, judge, verdict_of: what readers of results depend on
    report.py     the run folder: timeline, logs, metrics, verdict.json, JUnit (htmlreport/: the page);
                  reads one back to re-judge it (``mxchaos check``)
    capabilities.py  what this machine lets faults do (root, ss, toxiproxy ...): skip, not fail

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
    "History": "harness.timeline",
    "RunResult": "harness.verdict",
    "Runner": "harness.runner",
    "Scenario": "harness.scenario",
    "ScenarioInvalid": "harness.errors",
    "Timeline": "harness.timeline",
    "load_scenario": "harness.scenario",
    "write_run_folder": "harness.report",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'harness' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
