"""Loading: file -> text -> YAML -> ``Scenario``, or ``ScenarioInvalid`` with every problem.

The schema is validated first; the cross-reference rules then run on whatever validated
(the whole scenario, or the entries of an invalid file that are valid on their own), so
one ``mxchaos validate`` shows both kinds of problem. Before any of that the input is
bounded: at most ``MAX_BYTES``, UTF-8 text, and a YAML document whose aliases do not
expand it past ``MAX_NODES`` nodes (a "billion laughs" file is refused in linear time).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import TypeAdapter, ValidationError

from harness.errors import Issue, ScenarioInvalid
from harness.locate import duplicate_keys, expansion_problem, issue_from_pydantic, locate, yaml_problem
from harness.scenario.document import CheckEntry, Scenario
from harness.scenario.models import Broken, HostSpec, ProcessSpec, ProxySpec
from harness.scenario.rules import Context, cross_references
from harness.scenario.steps import Step
from harness.scenario.stores import with_store

__all__ = ["MAX_BYTES", "MAX_NODES", "load_scenario", "parse_scenario", "parse_scenario_json", "scenario_json_schema"]

MAX_BYTES = 1 << 20  # a scenario is a page or two; anything this big is not one
MAX_NODES = 100_000  # YAML nodes after alias expansion


def load_scenario(path: str | Path, *, seed: int | None = None, store: str | None = None) -> Scenario:
    """Read, parse and validate a scenario file; ``ScenarioInvalid`` lists every problem.
    ``store``: ``redis`` runs it on a Redis store whatever the file says (``harness.scenario.stores``)."""
    file = Path(path)
    try:
        size = file.stat().st_size
        if size > MAX_BYTES:
            raise ScenarioInvalid(file, [Issue("", f"the file is {size} bytes, over the {MAX_BYTES} byte limit "
                                               "of a scenario file")])
        data = file.read_bytes()
    except OSError as exc:
        raise ScenarioInvalid(file, [Issue("", f"cannot read the file: {exc.strerror or exc}")]) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScenarioInvalid(file, [Issue("", f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
                                           "a scenario file is YAML text")]) from None
    try:
        scenario = with_store(parse_scenario(text, file), store)
    except ValueError as exc:
        raise ScenarioInvalid(file, [Issue("store", str(exc))]) from None
    return scenario.with_seed(seed) if seed is not None else scenario


def _too_big(text: str, file_label: str) -> None:
    size = len(text.encode("utf-8", errors="replace"))
    if size > MAX_BYTES:
        raise ScenarioInvalid(file_label, [Issue("", f"the text is {size} bytes, over the {MAX_BYTES} byte limit "
                                                 "of a scenario file")])


def _expanded_size(root: yaml.Node, file_label: str) -> None:
    """Refuse a document whose aliases expand it past ``MAX_NODES`` nodes, or that refers to
    itself (``harness.locate.expansion_problem``, the guard inventories share)."""
    problem = expansion_problem(root, MAX_NODES, "write the scenario out instead")
    if problem is not None:
        raise ScenarioInvalid(file_label, [problem])


def parse_scenario(text: str, file: str | Path = "<string>") -> Scenario:
    file_label = str(file)
    _too_big(text, file_label)
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        if root is not None:
            _expanded_size(root, file_label)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScenarioInvalid(file_label, [yaml_problem(exc)]) from None
    return _validated(data, root, file, text)


# Keys an older harness saved in every run's scenario.json and the scenario language has retired
# (``Scenario.RETIRED_KEYS``: a file saying one is refused). ``defect_subjects`` (until 2026-12-07)
# was the settled model's "whose defect is in force", its defect already copied to the top-level
# known_defect: dropped, an old run folder is judged again as it was.
SAVED_BEFORE = ("defect_subjects",)


def parse_scenario_json(text: str, file: str | Path = "<string>") -> Scenario:
    """A scenario as the runner saved it (``scenario.json`` of a run folder: the validated
    model, seed override applied), validated again with the current harness. Values come
    from JSON; the YAML composer only locates problems (JSON is YAML) for the messages."""
    file_label = str(file)
    _too_big(text, file_label)
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ScenarioInvalid(file_label, [Issue("", f"not valid JSON: {exc}")]) from None
    if isinstance(data, dict):
        for key in SAVED_BEFORE:  # what a run saved by an older harness holds and a file may no longer say
            data.pop(key, None)
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        root = yaml.compose("{}", Loader=yaml.SafeLoader)  # no line numbers then
    return _validated(data, root, file, text)


_ENTRY_ADAPTERS: dict[str, TypeAdapter[Any]] = {
    "processes": TypeAdapter(ProcessSpec),
    "proxies": TypeAdapter(ProxySpec),
    "hosts": TypeAdapter(HostSpec),
}
_ITEM_ADAPTERS: dict[str, TypeAdapter[Any]] = {"steps": TypeAdapter(Step), "checks": TypeAdapter(CheckEntry)}


def _partial(data: Mapping[str, Any], errors: list[Any]) -> Context:
    """The parts of an invalid file that validate on their own, as a ``Context`` for the
    cross-reference rules: a failed mapping entry is left out (its name noted), a failed
    list item becomes ``Broken`` (every other item keeps its index), a failed section is
    left at its default (noted)."""
    failed = {str(e["loc"][0]) for e in errors if e["loc"]}
    values: dict[str, Any] = {}
    broken: set[str] = set()
    broken_names: dict[str, frozenset[str]] = {}
    for name, info in Scenario.model_fields.items():
        key = info.alias or name
        if key not in data:
            if info.is_required():
                values[name] = {} if key == "processes" else ()
                broken.add(key)
            continue
        raw = data[key]
        if key in _ENTRY_ADAPTERS and isinstance(raw, Mapping):
            good: dict[str, Any] = {}
            bad: set[str] = set()
            for entry, value in raw.items():
                try:
                    good[str(entry)] = _ENTRY_ADAPTERS[key].validate_python(value)
                except ValidationError:
                    bad.add(str(entry))
            values[name], broken_names[key] = good, frozenset(bad)
        elif key in _ITEM_ADAPTERS and isinstance(raw, list):
            items: list[Any] = []
            for value in raw:
                try:
                    items.append(_ITEM_ADAPTERS[key].validate_python(value))
                except ValidationError:
                    items.append(Broken(raw=value))
            values[name] = tuple(items)
        elif key in failed:
            broken.add(key)
            if info.is_required():
                values[name] = {} if key == "processes" else ()
        else:
            try:
                form: Any = Annotated[info.annotation, info]  # the field's type with its constraints
                values[name] = TypeAdapter(form).validate_python(raw)
            except ValidationError:  # a field validator's rule; reported by the full validation
                broken.add(key)
    partial = Scenario.model_construct(**values)
    if partial.store == "redis" and "processes" not in broken:
        with contextlib.suppress(ValueError):  # the same processes the valid file would have
            partial = with_store(partial, None)
    return Context(partial, frozenset(broken), broken_names)


def _validated(data: Any, root: yaml.Node | None, file: str | Path, text: str) -> Scenario:
    """Schema, then cross-references; ``ScenarioInvalid`` with every problem located in ``root``."""
    file_label = str(file)
    if not isinstance(data, dict) or root is None:
        raise ScenarioInvalid(file_label, [Issue("", "a scenario file must be a YAML mapping (name, processes, steps, ...)", 1)])
    issues = duplicate_keys(root)
    scenario: Scenario | None = None
    try:
        scenario = Scenario.model_validate(data)
        try:
            scenario = with_store(scenario, None)
        except ValueError as exc:
            raise ScenarioInvalid(file_label, [Issue("store", str(exc), None)]) from None
        context = Context(scenario)
    except ValidationError as exc:
        errors = exc.errors()
        # "should have at least N items after validation" is noise when items themselves failed
        failed = [tuple(e["loc"]) for e in errors if e["type"] != "too_short"]
        errors = [
            e
            for e in errors
            if e["type"] != "too_short"
            or not any(loc[: len(e["loc"])] == tuple(e["loc"]) and len(loc) > len(e["loc"]) for loc in failed)
        ]
        issues += [issue_from_pydantic(err, root) for err in errors]
        context = _partial(data, list(errors))
    issues += [locate(root, loc, message, value, show) for loc, message, value, show in cross_references(context)]
    if issues:
        issues.sort(key=lambda i: (i.line or 0, i.path))
        raise ScenarioInvalid(file_label, issues)
    assert scenario is not None
    from harness.scenario.subjects import settle_subject_defect  # it imports the document: not at module level

    scenario = settle_subject_defect(scenario)
    if isinstance(file, Path):
        scenario._path = file.resolve()
    scenario._text = text
    return scenario


def scenario_json_schema() -> dict[str, Any]:
    schema = Scenario.model_json_schema(by_alias=True)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://mxchaos/scenario.schema.json",
        **schema,
        "title": "mxchaos scenario",
    }
