"""Repeats and rates: N runs of one scenario judged as one cell, by a stated rule.

``mxchaos run --repeat N`` (and pytest's ``--mxchaos-repeat N``) runs every scenario N times,
run i (0-based) with seed ``seed + i`` (the scenario's seed, or ``--seed``), each a full run
with its own run folder; ``cell_of`` turns the N verdicts into one cell:

plain scenario (no ``known_defect``); k = runs that passed, n = runs that did not skip:
  ``PASS``   k == n (only N/N passes)
  ``FLAKY``  0 < k < n: it passes sometimes; fails the run (the failing run folders are listed)
  0 == k:    the worst verdict of the runs: ``HANG`` > ``ERROR`` > ``UNKNOWN`` > ``FAIL`` >
             ``NOT_EXERCISED`` (a fault had no effect in every run: nothing was judged; fails the run)
  ``SKIP``   every run skipped (a capability is missing); skip stays skip

``known_defect`` scenario; k = runs where the defect showed (verdict xfail), n = runs that
did not skip; ``measured`` is the rate the scenario states (``defect_rate: 4/6``):
  a run that did not get to where the defect is judged (fail, hang, error, unknown) makes
  the cell the worst such verdict, as for a plain scenario (it fails the run)
  ``XFAIL``           k >= 1 (the defect showed, as expected; the run's word, ``harness.record.vocabulary``)
  ``FIXED?``          k == 0 and the upper confidence bound on the defect's rate is below the
                      measured rate: it did not show in enough runs to doubt it is still there;
                      does not fail the run (drop ``known_defect`` once it stays fixed)
  ``XPASS``           k == 0 but N is too small to call it fixed (bound >= measured, or no
                      measured rate is stated); does not fail the run

The bound (``upper_bound``) is the one-sided 95% Clopper-Pearson upper bound on a binomial
rate: the p at which seeing at most k of n has probability 0.05; at k == 0 it is
``1 - 0.05 ** (1 / n)`` (e.g. 0.632 at n = 3, 0.259 at n = 10). ``bound`` is given for every
known-defect cell, ``None`` for plain ones. A cell fails the run (``FAILING_CELLS``) when it is
FAIL, FLAKY, HANG, ERROR, UNKNOWN or NOT_EXERCISED; ``mxchaos run`` exits 1 then.

The run-level summary (``--summary FILE``, default ``<out>/summary.json``), a contract other
tools read (the NIXL-version matrix); its shape is exactly::

    {"repeat": N,
     "scenarios": {NAME: {"cell": str, "rate": {"k": int, "n": int}, "bound": float | null,
                          "measured": {"k": int, "n": int} | null,
                          "runs": [{"verdict": str, "run_dir": str, "seed": int, "seconds": float,
                                   "not_exercised": [str]}]}}}

Pure: nothing here runs a scenario; ``RunRecord.of`` reads what a run's result holds (``Judged``:
``harness.judge.verdict.RunResult`` is one; a protocol, so this module imports none of the harness).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from harness.record.saved import SummaryDoc
from harness.record.vocabulary import OUTCOMES

__all__ = [
    "CELLS",
    "CONFIDENCE",
    "FAILING_CELLS",
    "Cell",
    "Judged",
    "Rate",
    "RunRecord",
    "cell_of",
    "parse_rate",
    "runs_to_call_fixed",
    "summary_json",
    "upper_bound",
    "write_summary",
]

CONFIDENCE = 0.95  # one-sided Clopper-Pearson
CELLS = ("PASS", "FLAKY", "FAIL", "UNKNOWN", "ERROR", "HANG", "SKIP", "XFAIL", "FIXED?", "XPASS", "NOT_EXERCISED")
FAILING_CELLS = frozenset(o.name for o in OUTCOMES if o.fails_run)
_WORST_FIRST = ("hang", "error", "unknown", "fail", "not_exercised")  # 0/N of a plain scenario: the worst of these
_RATE_RE = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


@dataclass(frozen=True)
class Rate:
    """k of n runs."""

    k: int
    n: int

    def __post_init__(self) -> None:
        if self.n < 0 or not 0 <= self.k <= max(self.n, 0):
            raise ValueError(f"a rate is k/n with 0 <= k <= n, not {self.k}/{self.n}")

    @property
    def value(self) -> float:
        return self.k / self.n if self.n else 0.0

    def __str__(self) -> str:
        return f"{self.k}/{self.n}"

    def to_json(self) -> dict[str, int]:
        return {"k": self.k, "n": self.n}


def parse_rate(text: str) -> Rate:
    """``"4/6"`` -> ``Rate(4, 6)``; ValueError unless it is k/n with n >= 1 and 0 <= k <= n."""
    match = _RATE_RE.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a rate: write k/n, e.g. 4/6 (the defect showed in 4 of 6 runs)")
    k, n = int(match[1]), int(match[2])
    if n < 1 or k > n:
        raise ValueError(f"{text!r}: a rate k/n needs n >= 1 and k <= n")
    return Rate(k, n)


def _binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p)."""
    return math.fsum(math.comb(n, i) * math.pow(p, i) * math.pow(1 - p, n - i) for i in range(k + 1))


def upper_bound(k: int, n: int, confidence: float = CONFIDENCE) -> float:
    """One-sided Clopper-Pearson upper bound on a rate after k of n: the p with
    P(X <= k | n, p) = 1 - confidence (1.0 at k == n; closed form at k == 0)."""
    Rate(k, n)
    if n == 0 or k == n:
        return 1.0
    alpha = 1.0 - confidence
    if k == 0:
        return 1.0 - math.pow(alpha, 1.0 / n)
    lo, hi = k / n, 1.0  # the cdf falls as p grows; the bound lies above the point estimate
    for _ in range(200):
        mid = (lo + hi) / 2
        if _binom_cdf(k, n, mid) > alpha:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-13:
            break
    return (lo + hi) / 2


def runs_to_call_fixed(measured: Rate, confidence: float = CONFIDENCE) -> int | None:
    """The least N at which 0 of N puts the bound below ``measured`` (None: never, at rate 0)."""
    if measured.value <= 0:
        return None
    n = 1
    while upper_bound(0, n, confidence) >= measured.value:
        n += 1
    return n


class Judged(Protocol):
    """What the summary reads of one judged run (``harness.judge.verdict.RunResult``)."""

    @property
    def verdict(self) -> str: ...
    @property
    def run_dir(self) -> Path: ...
    @property
    def seed(self) -> int: ...
    @property
    def seconds(self) -> float: ...


@dataclass(frozen=True)
class RunRecord:
    """One of the N runs, as the summary lists it."""

    verdict: str
    run_dir: str
    seed: int
    seconds: float
    not_exercised: tuple[str, ...] = ()  # verdict not_exercised: each fault that had no effect

    @classmethod
    def of(cls, result: Judged) -> RunRecord:
        unexercised = tuple(str(why) for why in getattr(result, "not_exercised", ()) or ())
        return cls(result.verdict, str(result.run_dir), result.seed, round(result.seconds, 3), unexercised)

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "run_dir": self.run_dir, "seed": self.seed, "seconds": self.seconds,
                "not_exercised": list(self.not_exercised)}


@dataclass(frozen=True)
class Cell:
    """A scenario's N runs judged together: ``name`` (one of ``CELLS``), its rate, the bound
    (known defects), the measured rate the scenario states, the runs and a one-line note."""

    scenario: str
    name: str
    rate: Rate
    runs: tuple[RunRecord, ...]
    known_defect: bool = False
    bound: float | None = None
    measured: Rate | None = None
    note: str = ""

    @property
    def fails_run(self) -> bool:
        return self.name in FAILING_CELLS

    @property
    def failing_runs(self) -> tuple[RunRecord, ...]:
        """The runs that did not go the good way: not passed (plain), or did not get to judge the defect."""
        good = ("xfail", "xpass", "skip") if self.known_defect else ("pass", "skip")
        return tuple(r for r in self.runs if r.verdict not in good)

    def to_json(self) -> dict[str, Any]:
        return {
            "cell": self.name,
            "rate": self.rate.to_json(),
            "bound": None if self.bound is None else round(self.bound, 6),
            "measured": None if self.measured is None else self.measured.to_json(),
            "runs": [r.to_json() for r in self.runs],
        }


def _worst(verdicts: Sequence[str]) -> str:
    for verdict in _WORST_FIRST:
        if verdict in verdicts:
            return verdict.upper()
    return "FAIL"


def cell_of(scenario: str, runs: Sequence[RunRecord], known_defect: bool = False, measured: Rate | None = None) -> Cell:
    """The cell of ``runs`` by the rule in this module's docstring."""
    counted = [r for r in runs if r.verdict != "skip"]
    n = len(counted)
    verdicts = [r.verdict for r in counted]
    if not known_defect:
        k = verdicts.count("pass")
        rate = Rate(k, n)
        if n == 0:
            return Cell(scenario, "SKIP", rate, tuple(runs), note="every run skipped")
        if k == n:
            return Cell(scenario, "PASS", rate, tuple(runs), note=f"passed {rate}")
        if k > 0:
            return Cell(scenario, "FLAKY", rate, tuple(runs), note=f"passed in {k} of {n} runs; a plain scenario passes only at {n}/{n}")
        return Cell(scenario, _worst(verdicts), rate, tuple(runs), note=f"passed {rate}")
    k = verdicts.count("xfail")
    rate = Rate(k, n)
    if n == 0:
        return Cell(scenario, "SKIP", rate, tuple(runs), True, None, measured, "every run skipped")
    bound = upper_bound(k, n)
    unjudged = [v for v in verdicts if v not in ("xfail", "xpass")]
    if unjudged:
        note = f"{len(unjudged)} of {n} runs did not get to where the defect is judged ({', '.join(sorted(set(unjudged)))})"
        return Cell(scenario, _worst(unjudged), rate, tuple(runs), True, bound, measured, note)
    if k >= 1:
        return Cell(scenario, "XFAIL", rate, tuple(runs), True, bound, measured, f"the defect showed in {rate}")
    if measured is None:
        note = "not reproduced; no measured rate stated (defect_rate), so it cannot be called fixed"
        return Cell(scenario, "XPASS", rate, tuple(runs), True, bound, measured, note)
    if bound < measured.value:
        note = f"0/{n}: the {CONFIDENCE:.0%} upper bound {bound:.3f} < measured {measured} ({measured.value:.3f})"
        return Cell(scenario, "FIXED?", rate, tuple(runs), True, bound, measured, note)
    need = runs_to_call_fixed(measured)
    note = (
        f"N too small to call it fixed: bound {bound:.3f} >= measured {measured} ({measured.value:.3f})"
        + (f"; needs N >= {need}" if need else "")
    )
    return Cell(scenario, "XPASS", rate, tuple(runs), True, bound, measured, note)


def summary_json(cells: Mapping[str, Cell], repeat: int) -> dict[str, Any]:
    """The run-level summary (the shape in this module's docstring)."""
    return {"repeat": repeat, "scenarios": {name: cell.to_json() for name, cell in cells.items()}}


def write_summary(path: Path, cells: Mapping[str, Cell], repeat: int,
                  resolved: Sequence[Mapping[str, Any]] = ()) -> None:
    """Write the summary atomically (a reader never sees half a file). ``resolved``: what a
    spelling such as ``modelexpress@latest-nightly`` resolved to (``harness.subjects.releases``), a
    key of its own only where there is one (a saved document keeps a key it does not declare)."""
    doc = summary_json(cells, repeat)
    if resolved:
        doc["resolved"] = [dict(r) for r in resolved]
    SummaryDoc.parse(doc, path).write(path)
