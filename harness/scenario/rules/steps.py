"""Cross-reference rules of the steps: the processes a step names exist, awaited events
(and their ``where`` fields) are mxref's, durations fit the run's budget, fault and mark
names are unique, and a source/reader is started after its server."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from harness.locate import Loc
from harness.scenario.models import Broken
from harness.scenario.rules.context import Context
from harness.scenario.steps import AwaitEvent, AwaitStep, FaultStep, MarkStep, ParallelStep, StartStep, iter_steps

__all__ = ["check_steps", "collect_names"]


def _raw_names(raw: Any) -> Iterator[tuple[str, str]]:
    """("faults" | "marks", name) of every fault name and mark in a step that did not validate."""
    if isinstance(raw, Mapping):
        fault = raw.get("fault")
        if isinstance(fault, Mapping) and isinstance(fault.get("name"), str):
            yield "faults", fault["name"]
        if isinstance(raw.get("mark"), str):
            yield "marks", raw["mark"]
        for value in raw.values():
            yield from _raw_names(value)
    elif isinstance(raw, list | tuple):
        for item in raw:
            yield from _raw_names(item)


def _broken_steps(steps: Sequence[BaseModel]) -> Iterator[Broken]:
    for item in steps:
        if isinstance(item, Broken):
            yield item


def collect_names(cx: Context) -> None:
    """Fault and mark names defined by the steps (each once)."""
    counter = 0
    for ref in iter_steps(cx.sc.steps):
        item = ref.step
        if isinstance(item, FaultStep):
            counter += 1
            name = item.fault.name or f"{item.fault.kind}-{counter}"
            if name in cx.faults:
                cx.add((*ref.loc, "fault", "name"), f"fault name {name!r} is used twice")
            cx.faults[name] = ref.loc
        elif isinstance(item, MarkStep):
            if item.mark in cx.marks:
                cx.add((*ref.loc, "mark"), f"mark {item.mark!r} is used twice")
            cx.marks[item.mark] = ref.loc
    unsure: dict[str, set[str]] = {"faults": set(), "marks": set()}
    for broken in _broken_steps(cx.sc.steps):
        for section, name in _raw_names(broken.raw):
            unsure[section].add(name)
    cx.broken_names = {**cx.broken_names, **{k: frozenset(v) for k, v in unsure.items()}}


def check_steps(cx: Context) -> None:
    sc = cx.sc
    if "budgets" not in cx.broken and sc.budgets.step > sc.budgets.run:
        cx.add(("budgets", "step"), f"{sc.budgets.step:g}s is longer than budgets.run ({sc.budgets.run:g}s)")
    for ref in iter_steps(sc.steps):
        item, loc = ref.step, ref.loc
        for sub, name in item.process_refs():
            ok = cx.need_process((*loc, *sub), name)
            if ok and isinstance(item, AwaitStep) and isinstance(item.await_, AwaitEvent):
                arg = item.await_
                base = (*loc, "await")
                cx.need_event((*base, "event"), arg.process, arg.event, arg.where, (*base, "where"))
        for sub, seconds in item.bounds():
            cx.need_within((*loc, *sub), seconds)
    if "steps" not in cx.broken and not any(True for _ in _broken_steps(sc.steps)):
        _start_order(cx, sc.steps, ("steps",), set())


def _start_order(cx: Context, steps: Sequence[BaseModel], loc: Loc, started: set[str]) -> None:
    """A source/reader needs its server started earlier (or in the same parallel block)."""
    sc = cx.sc
    for i, item in enumerate(steps):
        here = (*loc, i)
        if isinstance(item, StartStep):
            for j, name in enumerate(item.start):
                server = sc.server_of(name) if name in sc.processes else None
                if server is not None and server not in started:
                    cx.add((*here, "start", j), f"{name!r} is started before its server {server!r}")
                started.add(name)
        elif isinstance(item, FaultStep):
            started.update(item.fault.started_refs())  # e.g. a clock fault starts its target
        elif isinstance(item, ParallelStep):
            block = set(started)
            for branch in item.parallel:
                for ref in iter_steps(branch):
                    if isinstance(ref.step, StartStep):
                        block.update(ref.step.start)
            for b, branch in enumerate(item.parallel):
                _start_order(cx, branch, (*here, "parallel", b), set(block))
            started.update(block)
