"""``mxref.events.EVENTS`` (the event schema scenario ``where`` clauses are checked against)
describes exactly what mxref emits: every ``emit("name", field=...)`` call in mxref's
source names a described event and described fields, a literal value of a field with a
fixed set of values is one of them, and every described event is emitted somewhere."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from mxref.events import EVENTS, SOURCE_STATUSES
from mxref.v1 import p2p_pb2

MXREF = Path(__file__).resolve().parents[4] / "mxref"


def _emit_calls() -> Iterator[tuple[str, ast.Call, str]]:
    """(file:line, call, event name) of every emit call with a literal event name."""
    for path in sorted(MXREF.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name not in ("emit", "_emit") or not node.args:  # _emit: the modelexpress adapter's observer
                continue
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                yield f"{path.relative_to(MXREF.parent)}:{node.lineno}", node, first.value


def test_every_emitted_event_and_field_is_described() -> None:
    calls = list(_emit_calls())
    assert len(calls) > 30  # the scan finds mxref's emit calls
    problems = []
    for where, call, event in calls:
        if event not in EVENTS:
            problems.append(f"{where}: event {event!r} is not in EVENTS")
            continue
        fields = EVENTS[event].fields
        for keyword in call.keywords:
            if keyword.arg is None:  # **splat: its keys are checked where they are literal below
                splat = keyword.value
                keys = [str(k.value) for node in ast.walk(splat) if isinstance(node, ast.Dict)
                        for k in node.keys if isinstance(k, ast.Constant)]
                problems += [f"{where}: {event}.{k} is not described" for k in keys if k not in fields]
                continue
            if keyword.arg not in fields:
                problems.append(f"{where}: {event}.{keyword.arg} is not described")
                continue
            allowed = fields[keyword.arg]
            value = keyword.value
            if allowed and isinstance(value, ast.Constant) and value.value not in allowed:
                problems.append(f"{where}: {event}.{keyword.arg}={value.value!r} is not one of {allowed}")
    assert problems == []


def test_every_described_event_is_emitted() -> None:
    emitted = {event for _, _, event in _emit_calls()}
    assert sorted(set(EVENTS) - emitted) == []


def test_statuses_are_the_servers_enum() -> None:
    assert tuple(k.removeprefix("SOURCE_STATUS_") for k, _ in p2p_pb2.SourceStatus.items()) == SOURCE_STATUSES
