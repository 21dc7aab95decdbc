"""Event-level checks: ``ordering``, ``count``."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from typing import Any

from pydantic import Field, model_validator

from harness.checks import CheckParams, CheckResult, RunFacts, register, resolve_ref
from harness.checks.deadlines import StallBounded, announced_deadlines, bound_text
from harness.record.timeline import Entry, History
from harness.spec import Name, Ref, Scalar, custom_error


class OrderingParams(CheckParams):
    """The referenced points all happened, in this order (``strict``: no two at the same time)."""

    events: tuple[Ref, ...] = Field(min_length=2)
    strict: bool = False

    def label(self, kind: str) -> str:
        return self.name or "ordering(" + " < ".join(r.describe() for r in self.events) + ")"


@register("ordering", OrderingParams)
def ordering(p: OrderingParams, h: History, run: RunFacts) -> CheckResult:
    """Resolve every reference; times must be non-decreasing (increasing when strict)."""
    times: list[tuple[str, float | None]] = []
    for ref in p.events:
        entry = resolve_ref(ref, h)
        times.append((ref.describe(), entry.t if entry else None))
    details = {"points": [[label, None if t is None else round(t, 6)] for label, t in times]}
    missing = [label for label, t in times if t is None]
    if missing:
        return CheckResult(False, "never happened: " + ", ".join(missing), details)
    for (a, ta), (b, tb) in itertools.pairwise(times):
        assert ta is not None and tb is not None
        if tb < ta or (p.strict and tb == ta):
            return CheckResult(False, f"{b} ({tb:.3f}s) is not after {a} ({ta:.3f}s)", details)
    marks = tuple((t, label) for label, t in times if t is not None)
    return CheckResult(True, " < ".join(f"{label} ({t:.3f}s)" for label, t in times), details, marks)


class CountParams(CheckParams):
    """How many ``event`` entries ``process`` emitted (matching ``where``, with each
    ``contains`` field's text containing its substring and each ``matches`` field's text
    matching its regular expression somewhere), between ``min`` and ``max``; e.g. ``max: 0``
    for "never"."""

    process: Name
    event: str
    where: dict[str, Scalar] = Field(default_factory=dict)
    contains: dict[str, str] = Field(default_factory=dict)  # e.g. {error: "Connection refused"}
    matches: dict[str, str] = Field(default_factory=dict)  # e.g. {error: "for 0\\.(75|84)s"}
    min: int | None = Field(default=None, ge=0)
    max: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _bounds(self) -> CountParams:
        if self.min is None and self.max is None:
            raise custom_error("bounds", "give min, max or both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise custom_error("bounds", f"min {self.min} is greater than max {self.max}")
        for key, pattern in self.matches.items():
            try:
                re.compile(pattern)
            except re.error as exc:
                raise custom_error("matches", f"matches.{key}: {pattern!r} is not a regular expression ({exc})") from exc
        return self

    def process_refs(self) -> Iterable[tuple[str, str, tuple[str, ...] | None]]:
        yield "process", self.process, None

    def label(self, kind: str) -> str:
        lo = "" if self.min is None else f"{self.min} <= "
        hi = "" if self.max is None else f" <= {self.max}"
        return self.name or f"count({lo}{self.process} {self.event}{hi})"


@register("count", CountParams)
def count(p: CountParams, h: History, run: RunFacts) -> CheckResult:
    """Count matching events over the whole run."""
    found = [
        e
        for e in h.select(actor=p.process, f=p.event, where=p.where)
        if all(key in e.value and text in str(e.value[key]) for key, text in p.contains.items())
        and all(key in e.value and re.search(pattern, str(e.value[key])) for key, pattern in p.matches.items())
    ]
    n = len(found)
    details = {"count": n, "times": [round(e.t, 6) for e in found[:50]]}
    if p.min is not None and n < p.min:
        return CheckResult(False, f"{p.process} {p.event}: {n}, expected at least {p.min}", details)
    if p.max is not None and n > p.max:
        first = found[p.max]
        return CheckResult(
            False, f"{p.process} {p.event}: {n}, expected at most {p.max}", details, ((first.t, f"{p.event} #{p.max + 1}"),)
        )
    return CheckResult(True, f"{p.process} {p.event}: {n}", details)


class ElapsedParams(StallBounded, CheckParams):
    """The time from one point to another lies in ``[not_before, within]``: e.g. from a
    frozen source to the reader's next attempt, at least the transfer budget and at most the
    budget plus slack. The timing goal of a scenario, judged on one run's timeline. A bound
    may be written in the stall deadlines ``stall_of`` (a reader) announced, ``D`` / ``D1``
    (``harness.checks.deadlines``): the announcements are held to ``contract`` first."""

    from_: Ref = Field(alias="from")
    to: Ref
    stall_of: Name | None = None

    @model_validator(mode="after")
    def _window(self) -> ElapsedParams:
        if self.not_before is None and self.within is None:
            raise custom_error("window", "give not_before, within or both")
        return self

    def announcer(self) -> str | None:
        return self.stall_of

    def process_refs(self) -> Iterable[tuple[str, str, tuple[str, ...] | None]]:
        if self.stall_of is not None:
            yield "stall_of", self.stall_of, ("reader",)

    def label(self, kind: str) -> str:
        lo, hi = self.window_text()
        return self.name or f"elapsed({lo}{self.from_.describe()} -> {self.to.describe()}{hi})"


@register("elapsed", ElapsedParams)
def elapsed(p: ElapsedParams, h: History, run: RunFacts) -> CheckResult:
    """``to`` is resolved among the entries at or after ``from``."""
    start = resolve_ref(p.from_, h)
    if start is None:
        return CheckResult(False, f"{p.from_.describe()} never happened")
    later = History(e for e in h if e.t >= start.t)
    end = resolve_ref(p.to, later)
    if end is None:
        return CheckResult(False, f"{p.to.describe()} never happened after {p.from_.describe()} ({start.t:.3f}s)")
    delta = end.t - start.t
    details: dict[str, Any] = {"from": round(start.t, 6), "to": round(end.t, 6), "elapsed": round(delta, 6)}
    marks = ((start.t, p.from_.describe()), (end.t, p.to.describe()))
    window = announced_deadlines(p, h, end.t, run.read_window(p.announcer()))
    if window.details:
        details["deadlines"] = dict(window.details)
    if window.problems:
        return CheckResult(False, "; ".join(window.problems), details, marks)
    bound = clock_bound(h, start, end)
    shown = f"{delta:.3f}s"
    if bound is not None:  # the two ends were timed by different hosts' clocks (ssh hosts)
        details["clock_error_s"], details["clock_hosts"] = round(bound[0], 6), bound[1]
        shown += f" (±{bound[0] * 1000:.3f} ms: clocks of {' and '.join(bound[1])})"
    if window.not_before is not None and delta < window.not_before:
        return CheckResult(False, f"{shown}, earlier than {bound_text(p.not_before, window.not_before, _secs)}", details, marks)
    if window.within is not None and delta > window.within:
        return CheckResult(False, f"{shown}, later than {bound_text(p.within, window.within, _secs)}", details, marks)
    return CheckResult(True, shown, details, marks)


def _secs(seconds: float) -> str:
    return f"{seconds:g}s"


def clock_bound(h: History, start: Entry, end: Entry) -> tuple[float, list[str]] | None:
    """The error bound of a time difference whose ends were stamped on different hosts: the sum,
    over the two hosts, of each host's probed offset error plus its offset's drift over the run
    (the ``ssh_hosts`` entry and ``run.json``); None when both ends share a clock."""
    hosts = h.last(actor="harness", f="ssh_clocks") or h.last(actor="harness", f="ssh_hosts")  # end probe, if any
    if hosts is None or hosts.type == "fail":
        return None
    clocks = dict(hosts.get("hosts") or {})

    def host_of(entry: Entry) -> str | None:
        if entry.actor in ("harness", "nemesis"):
            return None  # the harness's own clock
        started = [e for e in h if e.actor == entry.actor and e.f == "start" and e.type == "ok" and e.t <= entry.t]
        return str(started[-1].get("host")) if started else None

    pair = [host_of(start), host_of(end)]
    if pair[0] == pair[1]:
        return None
    total = 0.0
    for name in pair:
        clock = (clocks.get(name) or {}).get("clock") if name else None
        if clock and clock.get("start"):
            total += float(clock["start"]["error_s"])
            if clock.get("end"):
                total += abs(float(clock["end"]["offset_s"]) - float(clock["start"]["offset_s"]))
    return total, [name or "harness" for name in pair]
