"""Cross-reference rules of the checks: the processes a check names exist (with a fitting
role), and each timeline reference (``Ref``) names a process event, fault or mark that
the scenario defines."""

from __future__ import annotations

import re
from collections.abc import Iterator

from pydantic import BaseModel

from harness.locate import Loc, did_you_mean
from harness.scenario.rules.context import Context
from harness.spec import Ref

__all__ = ["check_checks"]


def _refs_in(params: BaseModel) -> Iterator[tuple[Loc, Ref]]:
    for key, field in type(params).model_fields.items():
        value = getattr(params, key)
        alias = field.alias or key
        if isinstance(value, Ref):
            yield (alias,), value
        elif isinstance(value, tuple | list):
            for i, item in enumerate(value):
                if isinstance(item, Ref):
                    yield (alias, i), item
        elif isinstance(value, BaseModel):  # references inside a key (``only_if``'s ``before``)
            yield from (((alias, *inner), ref) for inner, ref in _refs_in(value))
        elif isinstance(value, dict):  # named chains of references (``outcome``'s ``of``)
            for name, chain in value.items():
                for i, item in enumerate(chain if isinstance(chain, tuple | list) else ()):
                    if isinstance(item, Ref):
                        yield (alias, name, i), item


def _key_loc(key: str) -> Loc:
    """``expect.reader-1`` / ``by_itself[0]`` -> a location."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"[.\[\]]+", key) if p)


def check_checks(cx: Context) -> None:
    for i, (kind, params) in enumerate(cx.sc.check_entries()):
        base: Loc = ("checks", i, kind)
        for key, name, roles in params.process_refs():
            cx.need_process((*base, *_key_loc(key)), name, roles)
        process, event = getattr(params, "process", None), getattr(params, "event", None)
        if isinstance(process, str) and isinstance(event, str) and process in cx.sc.processes:
            where = getattr(params, "where", None)
            cx.need_event((*base, "event"), process, event, where if isinstance(where, dict) else None, (*base, "where"))
        for key_loc, ref in _refs_in(params):
            where = (*base, *key_loc)
            known = ref.process is not None and cx.need_process((*where, "process"), ref.process)
            if known and ref.process is not None and ref.event is not None:
                cx.need_event((*where, "event"), ref.process, ref.event, ref.where, (*where, "where"))
            if ref.fault is not None and ref.fault not in cx.faults and not cx.unknown("faults", ref.fault):
                cx.add((*where, "fault"), f"no fault named {ref.fault!r}{did_you_mean(ref.fault, list(cx.faults))} "
                       f"(faults: {', '.join(cx.faults) or 'none'})")
            if ref.mark is not None and ref.mark not in cx.marks and not cx.unknown("marks", ref.mark):
                cx.add((*where, "mark"), f"no mark named {ref.mark!r}{did_you_mean(ref.mark, list(cx.marks))} "
                       f"(marks: {', '.join(cx.marks) or 'none'})")
