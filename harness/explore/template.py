"""Exploration templates: a scenario file with an ``explore:`` section declaring a fault space.

A template is an ordinary scenario (processes, steps without the faults to be found, and
checks: the properties that must hold) plus::

    explore:
      at_once: {min: 1, max: 2}        # faults per schedule (or one number); default 1..2
      windows:                         # where a fault may fire: after an event, within a delay
        - {after: {process: reader-1, event: transfer_start}, within: 500ms}
      faults:                          # the kinds to draw from, with their parameter spaces
        - {kind: pause, target: {one_of: [source-1, source-2]}, duration: {range: [100ms, 1s]}}
        - {kind: tcp_reset, target: reader-1, peer: {source_of: reader-1}}
      if_gone: skip                    # what a drawn fault whose target is gone means (default skip)

A fault parameter is fixed (any value the fault kind takes), ``{one_of: [v, ...]}`` (one
drawn; shrinks towards the first) or ``{range: [lo, hi]}`` (a duration drawn to the
millisecond; shrinks towards ``lo``). A fault takes no ``name`` (drawn faults are named
``x1``, ``x2``, ... in schedule order). A window's ``after`` must be the ``{process, event,
where}`` of exactly one top-level ``await`` step of the template: drawn faults are inserted
right after that step, each after a ``sleep`` of its drawn offset in ``[0, within]`` (``within:
0``: no sleep, no offset drawn: the faults fire back to back, in schedule order).

Templates are named ``*.explore.yaml``: a folder given to ``mxchaos run`` / ``validate`` /
pytest skips them (``is_template``), so a template never runs as an ordinary scenario by
accident; ``mxchaos explore`` runs them. ``load_template`` validates the whole file and
reports every problem as ``file:line: key.path: rule`` (the scenario part by the ordinary
rules; each fault option is checked as a fault of that scenario, and located at its key
under ``explore``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BeforeValidator, Field, TypeAdapter, ValidationError, model_validator

from harness import faults as fault_registry
from harness.errors import Issue, ScenarioInvalid
from harness.explore import TEMPLATE_SUFFIXES, is_template
from harness.locate import did_you_mean, issue_from_pydantic, locate, yaml_problem
from harness.scenario import AwaitEvent, AwaitStep, Scenario, parse_scenario
from harness.scenario.emit import compact_data
from harness.scenario.load import MAX_BYTES
from harness.spec import Duration, Name, Scalar, Strict, custom_error, parse_duration

__all__ = ["TEMPLATE_SUFFIXES", "Anchor", "ExploreSpec", "FaultSpace", "Template", "FireWindow", "is_template", "load_template"]

class Anchor(Strict):
    """The event a window starts at: ``process`` emitting ``event`` (fields equal to ``where``)."""

    process: Name
    event: str
    where: dict[str, Scalar] = Field(default_factory=dict)


def _within(value: Any) -> Any:
    """A window's width: a duration, or 0 (``0``, ``0s``, ``0ms``): its faults fire right after
    the await step, back to back, with no offset to draw (or to shrink)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value == 0:
        return 0.0
    if isinstance(value, str) and re.fullmatch(r"\s*0+(\.0*)?\s*(ms|s|m|h)?\s*", value):
        return 0.0
    return parse_duration(value)


class FireWindow(Strict):
    """A fault fires ``[0, within]`` after ``after`` (to the millisecond; ``within: 0``: at once)."""

    after: Anchor
    within: Annotated[float, BeforeValidator(_within)]


class AtOnce(Strict):
    min: int = Field(1, ge=1, le=8)
    max: int = Field(2, ge=1, le=8)

    @model_validator(mode="after")
    def _ordered(self) -> AtOnce:
        if self.min > self.max:
            raise custom_error("at_once", f"min ({self.min}) is more than max ({self.max})")
        return self


DURATION: TypeAdapter[float] = TypeAdapter(Duration)


def _at_once(value: Any) -> Any:
    return {"min": value, "max": value} if isinstance(value, int) and not isinstance(value, bool) else value


class ExploreSpec(Strict):
    """The ``explore:`` section (fault choices are checked by ``load_template``)."""

    at_once: AtOnce = AtOnce()
    windows: tuple[FireWindow, ...] = Field(min_length=1)
    faults: tuple[dict[str, Any], ...] = Field(min_length=1)
    if_gone: str = "skip"

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if isinstance(data, dict) and "at_once" in data:
            data = {**data, "at_once": _at_once(data["at_once"])}
        return data

    @model_validator(mode="after")
    def _if_gone(self) -> ExploreSpec:
        if self.if_gone not in ("skip", "fail"):
            raise custom_error("if_gone", f"if_gone is skip or fail, not {self.if_gone!r}")
        return self


@dataclass(frozen=True)
class Param:
    """One parameter of a fault choice: ``fixed`` (one value), ``options`` (one_of) or a
    duration range in milliseconds (``lo_ms``..``hi_ms``)."""

    key: str
    form: str  # fixed | one_of | range
    options: tuple[Any, ...] = ()
    lo_ms: int = 0
    hi_ms: int = 0

    def corners(self) -> Iterator[tuple[tuple[str | int, ...], Any]]:
        """(location below the parameter's key, value) of each value to validate."""
        if self.form == "one_of":
            for j, option in enumerate(self.options):
                yield ("one_of", j), option
        elif self.form == "range":
            yield ("range", 0), self.lo_ms / 1000
            yield ("range", 1), self.hi_ms / 1000
        else:
            yield (), self.options[0]

    def first(self) -> Any:
        return self.lo_ms / 1000 if self.form == "range" else self.options[0]


@dataclass(frozen=True)
class FaultSpace:
    """One entry of ``explore.faults``: a kind and its parameters' spaces."""

    kind: str
    params: tuple[Param, ...]
    if_gone: str | None  # the if_gone drawn faults of this kind get (None: the kind takes none)

    def describe(self) -> str:
        parts = []
        for p in self.params:
            if p.form == "one_of":
                parts.append(f"{p.key} one of {len(p.options)}")
            elif p.form == "range":
                parts.append(f"{p.key} {p.lo_ms}..{p.hi_ms} ms")
            else:
                parts.append(f"{p.key}={p.options[0]}")
        return f"{self.kind}({', '.join(parts)})"


@dataclass(frozen=True)
class Template:
    """A validated template: the base scenario, its space, and where each window anchors."""

    path: Path
    base: Scenario
    spec: ExploreSpec
    faults: tuple[FaultSpace, ...]
    anchors: tuple[int, ...]  # per window: the index of the top-level await step it follows

    @property
    def name(self) -> str:
        return self.base.name

    def base_data(self) -> dict[str, Any]:
        return compact_data(self.base)

    def space_json(self) -> dict[str, Any]:
        return self.spec.model_dump(mode="json")


def _blank_section(text: str, root: yaml.MappingNode, key: str) -> str:
    """``text`` with the lines of the top-level block ``key`` blanked (line numbers kept)."""
    for key_node, value_node in root.value:
        if key_node.value == key:
            first = key_node.start_mark.line
            end = value_node.end_mark
            last = end.line if end.column > 0 else end.line - 1
            lines = text.split("\n")
            for i in range(first, min(last, len(lines) - 1) + 1):
                lines[i] = ""
            return "\n".join(lines)
    return text


def _param(key: str, value: Any, loc: tuple[str | int, ...], issues: list[tuple[tuple[str | int, ...], str]]) -> Param | None:
    if isinstance(value, dict) and set(value) == {"one_of"}:
        options = value["one_of"]
        if not isinstance(options, list) or not options:
            issues.append(((*loc, "one_of"), "one_of is a non-empty list of values to draw from"))
            return None
        return Param(key, "one_of", tuple(options))
    if isinstance(value, dict) and set(value) == {"range"}:
        bounds = value["range"]
        if not isinstance(bounds, list) or len(bounds) != 2:
            issues.append(((*loc, "range"), "range is [lo, hi], two durations (e.g. [100ms, 2s])"))
            return None
        try:
            lo, hi = (DURATION.validate_python(b) for b in bounds)
        except ValidationError as exc:
            issues.append(((*loc, "range"), f"range bounds are durations: {exc.errors()[0]['msg']}"))
            return None
        if lo > hi:
            issues.append(((*loc, "range"), f"range [lo, hi] needs lo <= hi (got {lo:g}s > {hi:g}s)"))
            return None
        return Param(key, "range", lo_ms=round(lo * 1000), hi_ms=round(hi * 1000))
    return Param(key, "fixed", (value,))


def _fault_spaces(spec: ExploreSpec, issues: list[tuple[tuple[str | int, ...], str]]) -> list[FaultSpace | None]:
    out: list[FaultSpace | None] = []
    for i, raw in enumerate(spec.faults):
        loc: tuple[str | int, ...] = ("explore", "faults", i)
        kind = raw.get("kind")
        if not isinstance(kind, str) or kind not in fault_registry.REGISTRY:
            known = sorted(fault_registry.REGISTRY)
            hint = did_you_mean(str(kind), known) if kind is not None else ""
            what = "required key is missing" if kind is None else f"{kind!r} is not a fault kind{hint}"
            issues.append(((*loc, "kind"), f"{what} (known: {', '.join(known)})"))
            out.append(None)
            continue
        bad = [k for k in ("name", "if_gone") if k in raw]
        for k in bad:
            why = ("drawn faults are named x1, x2, ... by the explorer" if k == "name"
                   else "set explore.if_gone for every drawn fault")
            issues.append(((*loc, k), f"a fault of explore.faults takes no {k}: {why}"))
        params = [_param(k, v, (*loc, k), issues) for k, v in raw.items() if k not in ("kind", *bad)]
        if any(p is None for p in params):
            out.append(None)
            continue
        ok = [p for p in params if p is not None]
        takes_if_gone = "if_gone" in fault_registry.REGISTRY[kind].Spec.model_fields
        out.append(FaultSpace(kind, tuple(ok), spec.if_gone if takes_if_gone else None))
    return out


def _anchors(base: Scenario, spec: ExploreSpec, issues: list[tuple[tuple[str | int, ...], str]]) -> list[int]:
    found: list[int] = []
    for w, window in enumerate(spec.windows):
        a = window.after
        hits = [
            i for i, step in enumerate(base.steps)
            if isinstance(step, AwaitStep) and isinstance(step.await_, AwaitEvent)
            and (step.await_.process, step.await_.event, dict(step.await_.where)) == (a.process, a.event, dict(a.where))
        ]
        if len(hits) != 1:
            where = "".join(f", where: {{{k}: {v}}}" for k, v in a.where.items())
            why = ("no top-level await step waits for it" if not hits
                   else f"{len(hits)} top-level await steps wait for it (steps {', '.join(str(h + 1) for h in hits)})")
            issues.append((("explore", "windows", w, "after"),
                           f"a window starts at a top-level await step of the template, and {why}: "
                           f"add `- await: {{process: {a.process}, event: {a.event}{where}}}` to steps"))
            found.append(-1)
        else:
            found.append(hits[0])
    return found


def with_faults(data: dict[str, Any], inserts: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    """``data`` (a scenario as data) with ``inserts[i]`` (steps) placed after top-level step ``i``."""
    steps: list[Any] = []
    for i, step in enumerate(data["steps"]):
        steps.append(step)
        steps += inserts.get(i, [])
    return {**data, "steps": steps}


def fault_step(space: FaultSpace, values: dict[str, Any], name: str) -> dict[str, Any]:
    fault: dict[str, Any] = {"kind": space.kind, "name": name, **values}
    if space.if_gone is not None:
        fault["if_gone"] = space.if_gone
    return {"fault": fault}


def _check_options(template_base: Scenario, spaces: list[FaultSpace | None], anchor: int,
                   issues: list[tuple[tuple[str | int, ...], str]]) -> None:
    """Every option of every fault, as the only fault of the scenario: valid there?"""
    data = compact_data(template_base)
    for i, space in enumerate(spaces):
        if space is None:
            continue
        for p_index, param in enumerate(space.params):
            for sub, value in param.corners():
                values = {p.key: (value if j == p_index else p.first()) for j, p in enumerate(space.params)}
                trial = with_faults(data, {anchor: [fault_step(space, values, "x1")]})
                try:
                    parse_scenario(yaml.safe_dump(trial, sort_keys=False), "<template option>")
                except ScenarioInvalid as exc:
                    prefix = f"steps[{anchor + 1}].fault"
                    for issue in exc.issues:
                        if not issue.path.startswith(prefix):
                            continue
                        rest = issue.path[len(prefix):].lstrip(".")
                        key = rest.split(".")[0].split("[")[0] if rest else ""
                        loc: tuple[str | int, ...] = ("explore", "faults", i)
                        if key == param.key:
                            loc = (*loc, param.key, *sub)
                        elif key:
                            loc = (*loc, key)
                        msg = issue.message + (f" (got {value!r})" if key == param.key and sub else "")
                        entry = (loc, f"as a {space.kind} fault of this scenario: {msg}")
                        if entry not in issues:
                            issues.append(entry)
            if not space.params:
                break


def load_template(path: str | Path) -> Template:
    """Read and validate a template; ``ScenarioInvalid`` lists every problem (file:line: key: rule)."""
    file = Path(path)
    try:
        if file.stat().st_size > MAX_BYTES:
            raise ScenarioInvalid(file, [Issue("", f"the file is over the {MAX_BYTES} byte limit of a scenario file")])
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioInvalid(file, [Issue("", f"cannot read the template: {exc}")]) from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScenarioInvalid(file, [yaml_problem(exc)]) from None
    if not isinstance(data, dict) or not isinstance(root, yaml.MappingNode):
        raise ScenarioInvalid(file, [Issue("", "a template is a scenario mapping with an explore: section", 1)])
    if "explore" not in data:
        raise ScenarioInvalid(file, [Issue("explore", "a template needs an explore: section (the fault space: "
                                           "windows, faults, at_once); a plain scenario runs with mxchaos run", 1)])
    if root.flow_style:
        raise ScenarioInvalid(file, [Issue("", "write a template's top-level mapping in block style (one key per line)", 1)])
    issues: list[Issue] = []
    base: Scenario | None = None
    try:
        base = parse_scenario(_blank_section(text, root, "explore"), file)
    except ScenarioInvalid as exc:
        issues += exc.issues
    spec: ExploreSpec | None = None
    try:
        spec = ExploreSpec.model_validate(data["explore"])
    except ValidationError as exc:
        for err in exc.errors():
            issues.append(issue_from_pydantic({**err, "loc": ("explore", *err["loc"])}, root))
    located: list[tuple[tuple[str | int, ...], str]] = []
    spaces: list[FaultSpace | None] = []
    anchors: list[int] = []
    if spec is not None:
        spaces = _fault_spaces(spec, located)
        if base is not None:
            anchors = _anchors(base, spec, located)
            usable = [a for a in anchors if a >= 0]
            if usable:
                _check_options(base, spaces, usable[0], located)
    issues += [locate(root, loc, message) for loc, message in located]
    if issues or base is None or spec is None:
        issues.sort(key=lambda i: (i.line or 0, i.path))
        raise ScenarioInvalid(file, issues)
    base._path = file.resolve()
    return Template(file, base, spec, tuple(s for s in spaces if s is not None), tuple(anchors))
