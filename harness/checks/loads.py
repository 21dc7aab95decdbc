"""Load outcomes: ``loaded``, ``fell_back`` (``integrity``, what readers hold, is ``integrity.py``)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from typing import Literal

from pydantic import Field, model_validator

from harness.checks import (
    CheckParams,
    CheckResult,
    RunFacts,
    ref_or_start,
    register,
    source_matches,
    truthy_integrity,
)
from harness.checks.deadlines import StallBounded, announced_deadlines, bound_text
from harness.record.timeline import History
from harness.spec import Duration, Name, Ref, custom_error, format_seconds


class LoadedParams(CheckParams):
    """The reader completed a load over ``path`` (rdma | disk | any), optionally from
    ``source`` and ``within`` a time of ``from`` (default: the reader's start), verified."""

    reader: Name
    path: Literal["rdma", "disk", "any"] = "rdma"
    source: Name | None = None
    within: Duration | None = None
    from_: Ref | None = Field(default=None, alias="from")
    verified: bool = True

    def process_refs(self) -> Iterable[tuple[str, str, tuple[str, ...] | None]]:
        yield "reader", self.reader, ("reader",)
        if self.source:
            yield "source", self.source, ("source", "reader")

    def label(self, kind: str) -> str:
        return self.name or f"loaded({self.reader}, {self.path}" + (f", from {self.source}" if self.source else "") + ")"


@register("loaded", LoadedParams)
def loaded(p: LoadedParams, h: History, run: RunFacts) -> CheckResult:
    """The reader's first load_done after the reference matches path / source / time / integrity."""
    t_ref, ref_text = ref_or_start(p.from_, h, p.reader)
    if t_ref is None:
        return CheckResult("unknown", f"reference point ({ref_text}) never happened")
    loads = h.select(actor=p.reader, f="load_done", since=t_ref)
    if not loads:
        failed = h.last(actor=p.reader, f="load_failed")
        why = f": load_failed {failed.get('error')!r}" if failed else ""
        return CheckResult(False, f"{p.reader} reported no load_done after {ref_text}{why}")
    load = loads[0]
    problems = []
    path = load.get("path")
    if p.path != "any" and path != p.path:
        problems.append(f"path {path!r}, expected {p.path!r}")
    if p.source and not source_matches(h, load.get("source"), p.source):
        problems.append(f"source {load.get('source')!r} (worker {load.get('worker_id')!r}) is not {p.source}")
    elapsed = load.t - t_ref
    if p.within is not None and elapsed > p.within:
        problems.append(f"took {elapsed:.3f}s after {ref_text}, budget {format_seconds(p.within)}")
    integrity = truthy_integrity(load.get("integrity"))
    if p.verified and integrity is not True:
        problems.append(f"integrity {load.get('integrity')!r}, expected verified")
    details = {"load": dict(load.value), "t": load.t, "elapsed_s": round(elapsed, 6), "reference": ref_text}
    marks = ((load.t, f"{p.reader} loaded ({path})"),)
    if problems:
        return CheckResult(False, f"{p.reader}: " + "; ".join(problems), details, marks)
    return CheckResult(
        True,
        f"{p.reader} loaded over {path} from {load.get('source')} in {elapsed:.3f}s after {ref_text}",
        details,
        marks,
    )


class FellBackParams(StallBounded, CheckParams):
    """The reader fell back to disk: a ``fallback`` event ``within`` / ``not_before`` a time of
    ``from`` (default: the reader's start), optionally for ``reason``, then (``loaded``) a
    verified disk load. A bound may be written in the stall deadlines the reader announced
    (``D`` / ``D1``, held to ``contract`` first: ``harness.checks.deadlines``)."""

    reader: Name
    from_: Ref | None = Field(default=None, alias="from")
    reason: str | None = None
    loaded: bool = True

    def process_refs(self) -> Iterable[tuple[str, str, tuple[str, ...] | None]]:
        yield "reader", self.reader, ("reader",)

    def label(self, kind: str) -> str:
        return self.name or f"fell_back({self.reader})"

    def announcer(self) -> str | None:
        return self.reader


@register("fell_back", FellBackParams)
def fell_back(p: FellBackParams, h: History, run: RunFacts) -> CheckResult:
    """First fallback event after the reference, inside [not_before, within]; then a disk load."""
    t_ref, ref_text = ref_or_start(p.from_, h, p.reader)
    if t_ref is None:
        return CheckResult("unknown", f"reference point ({ref_text}) never happened")
    fallbacks = h.select(actor=p.reader, f="fallback", since=t_ref)
    if not fallbacks:
        load = h.first(actor=p.reader, f="load_done", since=t_ref)
        got = f" (it loaded over {load.get('path')})" if load else ""
        return CheckResult(False, f"{p.reader} did not fall back after {ref_text}{got}")
    fb = fallbacks[0]
    elapsed = fb.t - t_ref
    window = announced_deadlines(p, h, fb.t, run.read_window(p.announcer()))
    problems = list(window.problems)
    if window.within is not None and elapsed > window.within:
        problems.append(f"fell back {elapsed:.3f}s after {ref_text}, later than {bound_text(p.within, window.within)}")
    if window.not_before is not None and elapsed < window.not_before:
        problems.append(f"fell back {elapsed:.3f}s after {ref_text}, before {bound_text(p.not_before, window.not_before)}")
    if p.reason is not None and str(fb.get("reason")) != p.reason:
        problems.append(f"reason {fb.get('reason')!r}, expected {p.reason!r}")
    load = h.first(actor=p.reader, f="load_done", since=fb.t)
    if p.loaded:
        if load is None:
            problems.append("no load_done after the fallback")
        elif load.get("path") != "disk" or truthy_integrity(load.get("integrity")) is not True:
            problems.append(f"load after fallback: path {load.get('path')!r}, integrity {load.get('integrity')!r}")
    details = {"fallback": dict(fb.value), "t": fb.t, "elapsed_s": round(elapsed, 6), "reference": ref_text}
    if window.details:
        details["deadlines"] = dict(window.details)
    marks = ((fb.t, f"{p.reader} fell back"),)
    if problems:
        return CheckResult(False, f"{p.reader}: " + "; ".join(problems), details, marks)
    return CheckResult(True, f"{p.reader} fell back {elapsed:.3f}s after {ref_text} ({fb.get('reason')})", details, marks)


class SpreadParams(CheckParams):
    """The selector's spread in a storm: each of ``readers`` made a verified RDMA load naming one
    of ``sources`` (its first load_done), and no source served more than ``at_most`` of them
    (default: 1.5 x the fair share ceil(R / S), rounded down)."""

    readers: tuple[Name, ...] = Field(min_length=1)
    sources: tuple[Name, ...] = Field(min_length=1)
    at_most: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _distinct(self) -> SpreadParams:
        for key, names in (("readers", self.readers), ("sources", self.sources)):
            if len(set(names)) != len(names):
                raise custom_error("distinct", f"{key}: a name is given twice")
        return self

    def bound(self) -> int:
        return self.at_most or int(1.5 * math.ceil(len(self.readers) / len(self.sources)))

    def process_refs(self) -> Iterable[tuple[str, str, tuple[str, ...] | None]]:
        for r in self.readers:
            yield "readers", r, ("reader",)
        for s in self.sources:
            yield "sources", s, ("source", "reader")

    def label(self, kind: str) -> str:
        return self.name or f"spread({len(self.readers)} readers over {len(self.sources)} sources, <= {self.bound()} each)"


@register("spread", SpreadParams)
def spread(p: SpreadParams, h: History, run: RunFacts) -> CheckResult:
    """Count the readers' first loads per source; fail on a reader without a verified RDMA load
    from a named source, or on a source over the bound."""
    served: Counter[str] = Counter()
    problems: list[str] = []
    for reader in p.readers:
        load = h.first(actor=reader, f="load_done")
        if load is None or load.get("path") != "rdma" or truthy_integrity(load.get("integrity")) is not True:
            got = "no load_done" if load is None else f"path {load.get('path')!r}, integrity {load.get('integrity')!r}"
            problems.append(f"{reader}: {got}")
            continue
        named = [s for s in p.sources if source_matches(h, load.get("source"), s)]
        if not named:
            problems.append(f"{reader} loaded from {load.get('source')!r}, none of {', '.join(p.sources)}")
            continue
        served[named[0]] += 1
    counts = {s: served.get(s, 0) for s in p.sources}
    bound = p.bound()
    over = {s: n for s, n in counts.items() if n > bound}
    problems.extend(f"{s} served {n} loads, more than {bound}" for s, n in over.items())
    details = {"served": counts, "at_most": bound}
    text = ", ".join(f"{s} {n}" for s, n in counts.items())
    if problems:
        return CheckResult(False, "; ".join(problems) + f" (served: {text})", details)
    return CheckResult(True, f"served: {text} (at most {bound} each)", details)
