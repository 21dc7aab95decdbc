"""Witnesses: what a fault measured of its own effect, never what the subject says.

A fault records a ``Witness`` under the key ``witness`` of its inject's record and of its
heal's value (``Witness.to_json``): ``effect`` is ``seen`` (the measurement shows the fault
acted: every thread of the target stopped, packets met the chain, the qdisc held bytes
back), ``none`` (it was measured and shows nothing: a chain no packet met, a rate limit on an
idle link) or ``unwitnessed`` (it could not be measured here, ``why`` says why). ``figures``
are the numbers measured (counters, thread states), shown beside it on the page.

``combined`` reads one fault's witnesses (its inject's, its heal's) as one: any ``none`` is
no effect (the fault did not hold while it was meant to), else any ``seen`` is seen, else
unwitnessed. A run one of whose faults shows no effect is NOT EXERCISED
(``harness.judge.verdict``), unless the scenario says ``expect_effect: false`` for it (a
negative control).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["EFFECTS", "Effect", "Witness", "combined"]

Effect = Literal["seen", "none", "unwitnessed"]
EFFECTS: tuple[str, ...] = ("seen", "none", "unwitnessed")


@dataclass(frozen=True, slots=True)
class Witness:
    """One measurement of a fault's effect: ``effect``, ``why`` (what was measured, in words)
    and ``figures`` (the numbers)."""

    effect: Effect
    why: str
    figures: Mapping[str, Any] = field(default_factory=dict)
    at: str = ""  # inject | heal | run: when it was measured

    @classmethod
    def seen(cls, why: str, **figures: Any) -> Witness:
        return cls("seen", why, figures)

    @classmethod
    def none(cls, why: str, **figures: Any) -> Witness:
        return cls("none", why, figures)

    @classmethod
    def unwitnessed(cls, why: str, **figures: Any) -> Witness:
        return cls("unwitnessed", why, figures)

    def to_json(self) -> dict[str, Any]:
        return {"effect": self.effect, "why": self.why, "figures": dict(self.figures)}

    @classmethod
    def of(cls, value: Any, at: str = "") -> Witness | None:
        """The witness a recorded value holds (its ``witness`` key's JSON), None when there is
        none or it is not one (a record is read back from a file: never trusted to be well formed)."""
        if not isinstance(value, Mapping):
            return None
        effect = value.get("effect")
        if effect not in EFFECTS:
            return None
        figures = value.get("figures")
        return cls(effect, str(value.get("why") or ""), dict(figures) if isinstance(figures, Mapping) else {}, at)

    def describe(self) -> str:
        """``no effect: <why>`` / ``effect seen: <why>`` / ``not witnessed: <why>``."""
        word = {"seen": "effect seen", "none": "no effect", "unwitnessed": "not witnessed"}[self.effect]
        return f"{word}: {self.why}" if self.why else word


def combined(witnesses: Iterable[Witness | None]) -> Witness | None:
    """One fault's witnesses as one: the first ``none``, else the last ``seen``, else the last
    ``unwitnessed``; None when there is none at all."""
    found = [w for w in witnesses if w is not None]
    for effect in ("none",):
        for w in found:
            if w.effect == effect:
                return w
    seen = [w for w in found if w.effect == "seen"]
    if seen:
        return seen[-1]
    return found[-1] if found else None
