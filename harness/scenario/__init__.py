"""Scenario files: YAML -> frozen pydantic models, validated completely before anything runs.

``load_scenario(path)`` parses, validates the schema (unknown keys rejected), then the
cross-references (process names, roles, fault names, marks, event names and fields,
budgets), and either returns a frozen ``Scenario`` or raises ``ScenarioInvalid`` listing
every problem as ``file:line: key.path: rule (got value)``. ``scenario_json_schema()`` is
the same schema as JSON Schema (``mxchaos schema``). Nothing past this package sees a
dict from YAML. The format reference is ``harness/README.md``.

Modules: ``models`` (hosts, model, budgets, processes, proxies), ``steps`` (the step
registry), ``document`` (``Scenario`` and its checks), ``load`` (parsing, limits, the
JSON schema), ``locate`` (YAML lines, pydantic errors -> issues), ``rules`` (the
cross-reference rules, one module per area).
"""

from __future__ import annotations

from harness.scenario.document import CHECK_MODELS, CheckEntry, Scenario
from harness.scenario.load import MAX_BYTES, MAX_NODES, load_scenario, parse_scenario, parse_scenario_json, scenario_json_schema
from harness.scenario.models import (
    PLACEHOLDER_RE,
    PLACEHOLDERS,
    Budgets,
    CommandProcess,
    HostRequires,
    LocalHostSpec,
    ModelSpec,
    MxrefProcess,
    NetnsHostSpec,
    ProxySpec,
    ReaderProcess,
    RedisProcess,
    ScrapeSpec,
    ServerProcess,
    SourceProcess,
)
from harness.scenario.steps import (
    STEP_KEYS,
    STEPS,
    AwaitEvent,
    AwaitExit,
    AwaitMetric,
    AwaitStep,
    FaultStep,
    HealStep,
    MarkStep,
    MetricCondition,
    ParallelStep,
    RestartStep,
    SleepStep,
    StartStep,
    StepModel,
    StepRef,
    StopStep,
    describe_step,
    iter_steps,
    step,
)

__all__ = [
    "CHECK_MODELS",
    "MAX_BYTES",
    "MAX_NODES",
    "PLACEHOLDERS",
    "PLACEHOLDER_RE",
    "STEPS",
    "STEP_KEYS",
    "AwaitEvent",
    "AwaitExit",
    "AwaitMetric",
    "AwaitStep",
    "Budgets",
    "CheckEntry",
    "CommandProcess",
    "FaultStep",
    "HealStep",
    "HostRequires",
    "LocalHostSpec",
    "MarkStep",
    "MetricCondition",
    "ModelSpec",
    "MxrefProcess",
    "NetnsHostSpec",
    "ParallelStep",
    "ProxySpec",
    "ReaderProcess",
    "RestartStep",
    "Scenario",
    "ScrapeSpec",
    "RedisProcess",
    "ServerProcess",
    "SleepStep",
    "SourceProcess",
    "StartStep",
    "StepModel",
    "StepRef",
    "StopStep",
    "describe_step",
    "iter_steps",
    "load_scenario",
    "parse_scenario",
    "parse_scenario_json",
    "scenario_json_schema",
    "step",
]
