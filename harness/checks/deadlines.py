"""Timing bounds written in the reader's stall deadlines, held to the contract first.

A chunked READ announces its two stall deadlines on every ``transfer_start``: ``stall_s``,
the deadline of a full window (``D``), and ``first_stall_s``, that of its first window
(``D1``; the ramp holds less). A check that judges a stall may write its bounds in them
(``TimeBound``): ``D1``, ``2D1``, ``D + 1.5s``, ``3D1 + 0.5s``, ``D1 - 80ms``, or a plain
duration as before.

An oracle never takes the subject's word for what it judges, so such a check judges twice
(``announced_deadlines``):

1. every deadline the reader (``stall_of``) announced is the contract's: ``contract`` (by
   default mxref's documented rule, docs/mxref.md, for the window the scenario gives that
   reader (``ReadWindow``: its ``read_chunk_mib`` and ``read_window``): ``D1``, the first chunk
   alone (1 MiB) at 100 MB/s plus 0.5 s, and ``D``, a full window at 25 MB/s (the lowest rate a
   window is timed at once the READ has landed a chunk) plus 0.5 s: ``D`` = 1.84 s and ``D1`` = 0.51 s
   for the default 16 MiB chunks, 2 in flight; a deeper window moves them) within ``tolerance`` (5 ms: the contract states them to
   10 ms). A reader that announces 20 x D fails here, however consistently it then waits 20 x D;
2. the time it observed lies within the bounds computed from what the reader announced for
   that READ (the last ``transfer_start`` at or before the end point), so a reader that
   announces D and waits 20 x D fails there. A reader that announced none (a single READ
   handle, a client without chunked READs) is judged at the contract's deadlines
   (``details.not_announced``): as a literal bound would have judged it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, PlainSerializer, PlainValidator, WithJsonSchema, model_validator

from harness.record.timeline import Entry, History
from harness.spec import Duration, Strict, custom_error, format_seconds, parse_duration

__all__ = ["ANNOUNCED", "BROKEN_CONTRACT", "Bound", "ReadWindow", "StallBounded", "StallContract", "TimeBound", "announced_deadlines", "bound_text"]

Deadline = Literal["D", "D1"]
# each deadline and the transfer_start field that announces it
ANNOUNCED: dict[Deadline, str] = {"D": "stall_s", "D1": "first_stall_s"}

# how a check's summary begins a judgement of the announcement, not of a time: a behaviour
# (``harness.reports.invocation.is_time_bound`` does not count it as a time bound)
BROKEN_CONTRACT = "stall deadlines:"

BOUND_RULE = ("a duration (2s, 500ms) or one in the reader's announced stall deadlines: D (a full "
              "window), D1 (the first window), times a factor, plus or minus a duration: D1, 2D1, "
              "D + 1.5s, D1 - 80ms")
_BOUND_RE = re.compile(r"^\s*(?P<k>\d+(?:\.\d+)?)?\s*\*?\s*(?P<d>D1|D)\s*(?:(?P<sign>[+-])\s*(?P<plus>\S+))?\s*$")


@dataclass(frozen=True)
class Bound:
    """``times`` x the deadline ``deadline`` plus ``seconds`` (no deadline: a plain duration)."""

    seconds: float = 0.0
    times: float = 0.0
    deadline: Deadline | None = None

    def resolve(self, deadlines: Mapping[str, float]) -> float:
        """Seconds, given the deadlines (``D``, ``D1``) to use."""
        return self.seconds + (self.times * deadlines[self.deadline] if self.deadline else 0.0)

    def __str__(self) -> str:
        if self.deadline is None:
            return format_seconds(self.seconds)
        text = ("" if self.times == 1 else f"{self.times:g}") + self.deadline
        if self.seconds:
            text += f" {'+' if self.seconds > 0 else '-'} {format_seconds(abs(self.seconds))}"
        return text


def parse_bound(value: Any) -> Bound:
    if isinstance(value, Bound):
        return value
    match = _BOUND_RE.match(value) if isinstance(value, str) else None
    if match is None:
        try:
            return Bound(seconds=parse_duration(value))
        except ValueError:
            raise custom_error("bound", BOUND_RULE) from None
    times = float(match["k"]) if match["k"] else 1.0
    try:
        seconds = parse_duration(match["plus"]) if match["plus"] else 0.0
    except ValueError:
        raise custom_error("bound", BOUND_RULE) from None
    if times <= 0 or not math.isfinite(times):
        raise custom_error("bound", BOUND_RULE)
    deadline: Deadline = "D1" if match["d"] == "D1" else "D"
    return Bound(seconds=-seconds if match["sign"] == "-" else seconds, times=times, deadline=deadline)


def _dump_bound(bound: Bound) -> float | str:
    return bound.seconds if bound.deadline is None else str(bound)


TimeBound = Annotated[
    Bound,
    PlainValidator(parse_bound),
    PlainSerializer(_dump_bound),
    WithJsonSchema({"anyOf": [{"type": "number", "exclusiveMinimum": 0}, {"type": "string"}], "description": BOUND_RULE}),
]


@dataclass(frozen=True)
class ReadWindow:
    """A reader's chunked READ as its scenario configures it (None: mxref's default, 16 MiB
    chunks, 2 in flight; a chunk of 0 is one READ handle, which announces no deadline)."""

    chunk_mib: float | None = None
    window: int | None = None

    FLOOR_BPS = 100e6  # the first window's rate: nothing has landed yet
    PROBE_BYTES = 1 << 20  # the first window: one chunk of this (or a whole chunk, if smaller)
    LEAST_BPS = 25e6  # the lowest rate a later window is timed at (a source shared by many readers)
    SLACK_S = 0.5

    def deadlines(self) -> dict[str, float]:
        """mxref's documented deadlines of this window, to 10 ms: a full window's (``D``, the
        longest after a completion), its bytes at 25 MB/s plus 0.5 s; the first window's
        (``D1``), the 1 MiB probe chunk alone at 100 MB/s plus 0.5 s."""
        chunk = int((self.chunk_mib or 16) * (1 << 20))
        w = self.window or 2
        return {"D": round(w * chunk / self.LEAST_BPS + self.SLACK_S, 2),
                "D1": round(min(self.PROBE_BYTES, chunk) / self.FLOOR_BPS + self.SLACK_S, 2)}


class StallContract(Strict):
    """The stall deadlines a reader must announce: by default mxref's rule for the reader's own
    window (``ReadWindow``), or the ones the check gives."""

    full: Duration | None = Field(None, alias="D")
    first: Duration | None = Field(None, alias="D1")
    tolerance: Duration = 0.005

    def deadlines(self, read: ReadWindow | None = None) -> dict[str, float]:
        rule = (read or ReadWindow()).deadlines()
        return {"D": rule["D"] if self.full is None else self.full, "D1": rule["D1"] if self.first is None else self.first}


class StallBounded(BaseModel):
    """``not_before`` / ``within`` as ``TimeBound``; ``stall_of`` (the reader whose announced
    deadlines a bound in ``D`` / ``D1`` reads) and the ``contract`` they are held to."""

    not_before: TimeBound | None = None
    within: TimeBound | None = None
    contract: StallContract = Field(default_factory=StallContract)

    def announcer(self) -> str | None:
        """The reader whose ``transfer_start`` announces the deadlines."""
        return None

    def deadlines_used(self) -> list[Deadline]:
        return sorted({b.deadline for b in (self.not_before, self.within) if b is not None and b.deadline is not None})

    @model_validator(mode="after")
    def _bounds_fit(self) -> StallBounded:
        used = self.deadlines_used()
        if used and self.announcer() is None:
            raise custom_error("stall_of", f"a bound in {' and '.join(used)} reads the reader's announced stall "
                               "deadlines: name that reader in stall_of")
        nominal = self.contract.deadlines()
        lo, hi = (None if b is None else b.resolve(nominal) for b in (self.not_before, self.within))
        if hi is not None and hi <= 0:
            raise custom_error("window", f"within {self.within} is not after the start (at the contract's deadlines)")
        if lo is not None and hi is not None and lo > hi:
            raise custom_error("window", f"not_before {lo:g}s is after within {hi:g}s"
                               + (" (at the contract's deadlines)" if used else ""))
        return self

    def window_text(self) -> tuple[str, str]:
        """(``X <= ``, `` <= Y``) for labels."""
        return ("" if self.not_before is None else f"{self.not_before} <= ",
                "" if self.within is None else f" <= {self.within}")


@dataclass(frozen=True)
class DeadlineWindow:
    """The bounds of one judgement in seconds, and where the deadlines came from."""

    not_before: float | None
    within: float | None
    problems: tuple[str, ...] = ()
    details: Mapping[str, Any] = field(default_factory=dict)


def announced_deadlines(p: StallBounded, h: History, at: float, read: ReadWindow | None = None) -> DeadlineWindow:
    """The check's bounds in seconds at time ``at`` (its end point); ``problems`` when a bound
    reads the announced deadlines and an announcement differs from the contract (for ``read``,
    the announcing reader's window as its scenario gives it)."""
    used, reader = p.deadlines_used(), p.announcer()
    if not used or reader is None:
        lo, hi = (None if b is None else b.seconds for b in (p.not_before, p.within))
        return DeadlineWindow(lo, hi)
    starts = h.select(actor=reader, f="transfer_start")
    contract, tol = p.contract.deadlines(read), p.contract.tolerance
    problems = [
        f"{BROKEN_CONTRACT} {reader} announced {name} = {format_seconds(float(e.value[key]))} (transfer_start at "
        f"{e.t:.3f}s); the contract's {name} is {format_seconds(contract[name])} (±{format_seconds(tol)})"
        for e in starts
        for name, key in ANNOUNCED.items()
        if _number(e, key) is not None and abs(float(e.value[key]) - contract[name]) > tol
    ]
    current = [e for e in starts if e.t <= at] or starts
    announcement = current[-1] if current else None
    values: dict[str, float] = {}
    silent: list[str] = []
    for name in used:
        value = None if announcement is None else _number(announcement, ANNOUNCED[name])
        if value is None:  # a reader with no such deadline (one READ handle, another client): the contract's
            silent.append(name)
        values[name] = contract[name] if value is None else value
    details: dict[str, Any] = {"announced": {k: v for k, v in values.items() if k not in silent},
                               "contract": {k: contract[k] for k in used}}
    if silent:
        details["not_announced"] = silent
    if problems:  # the first three, the word that marks them a behaviour once
        return DeadlineWindow(None, None, (problems[0], *(t.removeprefix(BROKEN_CONTRACT + " ") for t in problems[1:3])), details)
    lo, hi = (None if b is None else b.resolve(values) for b in (p.not_before, p.within))
    return DeadlineWindow(lo, hi, (), details)


def bound_text(bound: Bound | None, seconds: float, plain: Callable[[float], str] = format_seconds) -> str:
    """``plain(seconds)`` for a plain bound, ``2D1 = 1.504s`` for one in the announced deadlines."""
    if bound is None or bound.deadline is None:
        return plain(seconds)
    return f"{bound} = {seconds:.3f}s"


def _number(entry: Entry, key: str) -> float | None:
    value = entry.value.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
