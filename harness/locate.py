"""Where a problem is in the file: YAML node -> line, duplicate keys, pydantic error -> ``Issue``.

Locations are key paths like ``("steps", 3, "fault", "kind")``; ``locate`` follows one
through the composed YAML nodes to the line of the deepest key that exists in the file
(an unknown key is its own line). Parts that are not in the file (union tags, written
``<tag>`` by the models, and normalised shorthands) are skipped.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from harness.errors import Issue

__all__ = ["Loc", "did_you_mean", "duplicate_keys", "expansion_problem", "issue_from_pydantic", "locate", "render_loc", "yaml_problem"]

Loc = tuple[str | int, ...]
"""A key path into a document: ``("steps", 3, "fault", "kind")``."""


def yaml_problem(exc: yaml.YAMLError) -> Issue:
    """What a YAML parser refused, as the issue every file of ours reports it with: ``not valid
    YAML: <problem>`` at the line it names (scenarios, templates, inventories)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    return Issue("", f"not valid YAML: {problem}", mark.line + 1 if mark is not None else None)


def expansion_problem(root: yaml.Node, max_nodes: int, advice: str) -> Issue | None:
    """Whether a composed document's aliases expand it past ``max_nodes`` nodes, or an alias
    refers to the node that contains it: the issue naming the line, else ``None``. Linear in the
    distinct nodes (each node's expanded size is computed once), so a "billion laughs" file is
    refused before ``safe_load`` or any walk over the expanded data (scenarios, templates and
    inventories all call it first). ``advice`` ends the message (``write the scenario out instead``)."""
    sizes: dict[int, int] = {}
    active: set[int] = set()
    # iterative post-order: a deeply nested file cannot exhaust Python's recursion limit here
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            total = 1
            if isinstance(node, yaml.MappingNode):
                total += sum(sizes[id(k)] + sizes[id(v)] for k, v in node.value)
            elif isinstance(node, yaml.SequenceNode):
                total += sum(sizes[id(item)] for item in node.value)
            active.discard(key)
            sizes[key] = total
            if total > max_nodes:
                return Issue("", f"YAML aliases expand the document past {max_nodes} nodes; {advice}",
                             node.start_mark.line + 1)
            continue
        if key in sizes:
            continue
        if key in active:
            return Issue("", "a YAML alias refers to the node that contains it", node.start_mark.line + 1)
        active.add(key)
        stack.append((node, True))
        children: list[yaml.Node] = []
        if isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        stack.extend((child, False) for child in reversed(children) if id(child) not in sizes)
    return None


def duplicate_keys(node: yaml.Node, loc: Loc = ()) -> list[Issue]:
    """Every key given twice in one mapping (YAML would keep the later value silently)."""
    issues: list[Issue] = []
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value)
            if key in seen:
                issues.append(
                    Issue(
                        render_loc((*loc, key)),
                        f"duplicate key {key!r} (first at line {seen[key]}); a later value would silently win",
                        key_node.start_mark.line + 1,
                    )
                )
            else:
                seen[key] = key_node.start_mark.line + 1
            issues += duplicate_keys(value_node, (*loc, key))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            issues += duplicate_keys(item, (*loc, i))
    return issues


def render_loc(loc: Sequence[str | int]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _walk(root: yaml.Node, loc: Sequence[str | int]) -> tuple[list[str | int], int | None]:
    """Follow ``loc`` through the YAML nodes: the path that exists in the file (plus a final
    missing key) and the line of the deepest node reached."""
    node: yaml.Node | None = root
    path: list[str | int] = []
    line = root.start_mark.line + 1
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(part, str) and part.startswith("<") and part.endswith(">"):
            continue  # a union tag
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if str(k.value) == str(part)), None)
            if match is not None:
                path.append(part)
                line = match[0].start_mark.line + 1
                node = match[1]
                continue
            if last:
                path.append(part)
            continue
        if isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if 0 <= part < len(node.value):
                path.append(part)
                node = node.value[part]
                line = node.start_mark.line + 1
            continue
        # scalar (or shorthand): the rest of the location is inside a normalised value
    return path, line


def locate(root: yaml.Node, loc: Loc, message: str, value: Any = None, show_value: bool = False) -> Issue:
    path, line = _walk(root, loc)
    return Issue(render_loc(path), message, line, value, show_value)


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    """``; did you mean 'x'?`` for the closest of ``choices``, or nothing."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def issue_from_pydantic(err: Mapping[str, Any], root: yaml.Node) -> Issue:
    loc: Loc = tuple(err["loc"])
    kind = err["type"]
    ctx = err.get("ctx") or {}
    value = err.get("input")
    show = _is_scalar(value)
    message = str(ctx.get("message", err["msg"]))
    if kind == "missing":
        message, show = "required key is missing", False
    elif kind == "union_tag_invalid":
        key = str(ctx.get("discriminator", "")).strip("'")
        loc = (*loc, key)
        tag = str(ctx.get("tag"))
        expected = str(ctx.get("expected_tags", ""))
        hint = did_you_mean(tag, re.findall(r"'([^']*)'", expected))
        message = f"{tag!r} is not a known {key}{hint} (known: {expected})"
        show = False
    elif kind == "union_tag_not_found":
        key = str(ctx.get("discriminator", "")).strip("'")
        loc = (*loc, key)
        message, show = f"required key is missing (the {key} decides which other keys are allowed)", False
    elif kind == "extra_forbidden":
        message, show = "unknown key", False
    elif kind in ("unknown_key", "step", "check", "ref", "bounds"):
        show = False
    if show and repr(value) in message:
        show = False
    return locate(root, loc, message, value, show)
