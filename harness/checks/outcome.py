"""``outcome``: which of several named alternatives happened. A finding, where more than one
behaviour is legitimate and the point of the run is to learn which one this system has (a
one-sided RDMA READ from a SIGSTOPped source may be served by the NIC, or stall).

Each alternative is a chain of references: the first is found on the whole timeline, each next
one at or after the one before it (so ``[{fault: freeze}, {process: r, event: transfer_done}]``
is "a transfer_done after the freeze"). The check passes when at least one alternative
happened and says which (``details.outcome``, and every one that held in ``details.held``); it
fails when none did, naming for each where its chain broke. Write the alternatives so that they
exclude each other, and name each after what it means.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from harness.checks import CheckParams, CheckResult, RunFacts, register, resolve_ref
from harness.record.timeline import History
from harness.spec import Name, Ref


class OutcomeParams(CheckParams):
    """Which of the named alternatives (``of``: name -> a chain of references, each at or after
    the one before) happened: passes when one did, reporting which (a finding); fails when none did."""

    of: Annotated[dict[Name, Annotated[tuple[Ref, ...], Field(min_length=1)]], Field(min_length=2)]

    def label(self, kind: str) -> str:
        return self.name or "outcome(" + " | ".join(self.of) + ")"


def _chain(refs: tuple[Ref, ...], h: History) -> tuple[list[tuple[str, float]], str | None]:
    """The times of the chain's points, and where it broke (None: it held)."""
    points: list[tuple[str, float]] = []
    view = h
    for ref in refs:
        entry = resolve_ref(ref, view)
        if entry is None:
            after = f" after {points[-1][0]} ({points[-1][1]:.3f}s)" if points else ""
            return points, f"{ref.describe()} never happened{after}"
        points.append((ref.describe(), entry.t))
        view = History(e for e in h if e.t >= entry.t)
    return points, None


@register("outcome", OutcomeParams)
def outcome(p: OutcomeParams, h: History, run: RunFacts) -> CheckResult:
    """Each alternative's chain resolved on the timeline; the first that held is the outcome."""
    alternatives: dict[str, Any] = {}
    held: list[str] = []
    marks: list[tuple[float, str]] = []
    for name, refs in p.of.items():
        points, broke = _chain(refs, h)
        alternatives[name] = {"held": broke is None, "points": [[label, round(t, 6)] for label, t in points],
                              **({"broke": broke} if broke else {})}
        if broke is None:
            held.append(name)
            marks += [(t, f"{name}: {label}") for label, t in points]
    details: dict[str, Any] = {"outcome": held[0] if held else None, "held": held, "alternatives": alternatives}
    if not held:
        return CheckResult(False, "none of the outcomes happened: " + "; ".join(
            f"{name}: {alt['broke']}" for name, alt in alternatives.items()), details)
    first = alternatives[held[0]]["points"]
    shown = " < ".join(f"{label} ({t:.3f}s)" for label, t in first)
    also = f" (also held: {', '.join(held[1:])})" if len(held) > 1 else ""
    return CheckResult(True, f"outcome: {held[0]}: {shown}{also}", details, tuple(marks))
