"""Fault schedules: what ``mxchaos explore`` draws from a template, and the scenario each one is.

A ``Schedule`` is a list of ``DrawnFault`` (which fault of ``explore.faults``, its parameter
values, which window, its offset in milliseconds). ``schedules(template)`` is the Hypothesis
strategy that draws them; every choice is an integer drawn from a range whose low end is the
simplest case, so Hypothesis' shrinker moves a failing schedule towards fewer faults (list
elements deleted), earlier times (offsets towards 0), shorter windows (durations towards the
range's low end) and the first option of each ``one_of``. ``scenario_data`` turns a schedule
into the template's scenario with the faults inserted (a plain scenario: what ``mxchaos run``
reproduces), with a comment above each fault saying where it was drawn from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from harness.explore.template import FaultSpace, Template, fault_step, with_faults
from harness.record.fault_windows import target_text

__all__ = ["DrawnFault", "Schedule", "scenario_data", "schedules"]


@dataclass(frozen=True)
class DrawnFault:
    choice: int  # index into explore.faults
    values: tuple[tuple[str, Any], ...]  # parameter -> drawn value (JSON values)
    window: int  # index into explore.windows
    offset_ms: int

    def describe(self, template: Template) -> str:
        space = template.faults[self.choice]
        window = template.spec.windows[self.window].after
        args = ", ".join(f"{k}={_short(v)}" for k, v in self.values)
        return f"{space.kind}({args}) at +{self.offset_ms} ms after {window.process} {window.event}"

    def to_json(self, template: Template) -> dict[str, Any]:
        space = template.faults[self.choice]
        return {"kind": space.kind, "choice": self.choice, "params": dict(self.values),
                "window": self.window, "offset_ms": self.offset_ms, "text": self.describe(template)}


def _short(value: Any) -> str:
    if isinstance(value, dict) and set(value) == {"source_of"}:
        return str(target_text(value))
    if isinstance(value, float):
        return f"{value:g}s"
    return str(value)


@dataclass(frozen=True)
class Schedule:
    faults: tuple[DrawnFault, ...]

    def key(self) -> str:
        """A canonical text of the schedule (equal schedules, equal keys: a run's cache key)."""
        return json.dumps([[f.choice, list(f.values), f.window, f.offset_ms] for f in self.faults], sort_keys=True)

    def describe(self, template: Template) -> str:
        return "; ".join(f.describe(template) for f in self.faults) or "(no fault)"

    def to_json(self, template: Template) -> list[dict[str, Any]]:
        return [f.to_json(template) for f in self.faults]


def _index(n: int) -> st.SearchStrategy[int]:
    """0..n-1; no draw at all when there is one choice (a draw with a single possible value
    keeps Hypothesis' shrinker from deleting the list element it belongs to)."""
    return st.integers(0, n - 1) if n > 1 else st.just(0)


def _value(param: Any) -> st.SearchStrategy[Any]:
    if param.form == "one_of":
        options = param.options
        return _index(len(options)).map(lambda i: options[i])
    if param.form == "range":
        lo = param.lo_ms
        return _index(param.hi_ms - lo + 1).map(lambda i: (lo + i) / 1000)
    return st.just(param.options[0])


def _fault(template: Template) -> st.SearchStrategy[DrawnFault]:
    windows = template.spec.windows

    @st.composite
    def draw_fault(draw: st.DrawFn) -> DrawnFault:
        choice = draw(_index(len(template.faults)))
        space: FaultSpace = template.faults[choice]
        values = tuple((p.key, draw(_value(p))) for p in space.params)
        window = draw(_index(len(windows)))
        offset = draw(_index(round(windows[window].within * 1000) + 1))
        return DrawnFault(choice, values, window, offset)

    return draw_fault()


def schedules(template: Template) -> st.SearchStrategy[Schedule]:
    """Schedules of ``at_once.min`` .. ``at_once.max`` faults drawn from the template's space."""
    at_once = template.spec.at_once
    return st.lists(_fault(template), min_size=at_once.min, max_size=at_once.max).map(lambda fs: Schedule(tuple(fs)))


def scenario_data(template: Template, schedule: Schedule, *, name: str | None = None) -> tuple[dict[str, Any], dict[int, list[str]]]:
    """The template's scenario with ``schedule``'s faults: per window, after its await step,
    in offset order, each after a ``sleep`` of its offset (less the previous one's). Returns
    the data and comments per top-level step index (for ``harness.scenario.emit``)."""
    data = template.base_data()
    if name is not None:
        data["name"] = name
    by_anchor: dict[int, list[tuple[int, int, DrawnFault]]] = {}
    for n, fault in enumerate(schedule.faults, 1):
        by_anchor.setdefault(template.anchors[fault.window], []).append((fault.offset_ms, n, fault))
    inserts: dict[int, list[dict[str, Any]]] = {}
    notes: dict[tuple[int, int], str] = {}
    for anchor, drawn in by_anchor.items():
        steps: list[dict[str, Any]] = []
        at = 0
        for offset, n, fault in sorted(drawn, key=lambda d: (d[0], d[1])):
            if offset > at:
                steps.append({"sleep": round((offset - at) / 1000, 3)})
                at = offset
            space = template.faults[fault.choice]
            steps.append(fault_step(space, dict(fault.values), f"x{n}"))
            notes[(anchor, len(steps) - 1)] = f"drawn: x{n} = {fault.describe(template)}"
        inserts[anchor] = steps
    out = with_faults(data, inserts)
    comments: dict[int, list[str]] = {}
    index = 0
    for i in range(len(data["steps"])):
        index += 1
        for j in range(len(inserts.get(i, []))):
            if (i, j) in notes:
                comments[index] = [notes[(i, j)]]
            index += 1
    return out, comments
