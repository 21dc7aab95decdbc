"""What changed since the night before: two ``nightly.json`` compared scenario by scenario.

Scenarios are matched by name. Each scenario of the new night lands in at most one of:

* ``newly_failing``: its cell fails the night now (``rates.FAILING_CELLS``) and did not
  before, or it is new and fails;
* ``fixed``: its cell failed the night before and now does not (a SKIP now is not a fix: it
  did not run; it is an ``other`` change);
* ``other``: the cell changed otherwise (XFAIL -> FIXED?, FLAKY -> FAIL, PASS -> SKIP).

Independently of the cells (by ``harness.record.baseline``, the matrix's own rules, fed a
one-column view of each night):

* ``rates_moved``: the failure rate (``night.failures_of``) moved beyond its confidence
  bounds: the 95% Wilson intervals of the two rates do not overlap (2/2 -> 0/2 is no move;
  0/10 -> 6/10 is);
* ``slower``: the median run duration grew by more than 20% and at least 0.5 s (noisy on a
  loaded machine: listed, never a failure, with each night's machine load beside it).

Plus ``new_scenarios`` and ``gone_scenarios`` (names). A change never fails the night by itself:
a newly failing cell already does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.record.baseline import diff_matrices
from harness.record.load import load_text
from harness.record.rates import FAILING_CELLS
from harness.record.saved import MatrixCell, MatrixColumn, MatrixDoc, NightDoc, NightEntry

__all__ = ["COLUMN", "compare_nights", "count_changes"]

COLUMN = "night"  # the one column of the matrix-shaped view of a night


def _as_matrix(night: NightDoc) -> MatrixDoc:
    cells = {s.name: {COLUMN: MatrixCell(verdict=str(s.cell or "none").lower(), failures=s.failures or {"k": 0, "n": 0},
                                         seconds=s.median_seconds)} for s in night.scenarios}
    return MatrixDoc(columns=[MatrixColumn(id=COLUMN)], cells=cells)


def _fails(s: NightEntry | None) -> bool:
    return s is not None and str(s.cell) in FAILING_CELLS


def _rate(s: NightEntry) -> str:
    rate = s.rate or {}
    return f"{s.cell} {rate.get('k', 0)}/{rate.get('n', 0)}"


def _item(name: str, old: NightEntry | None, new: NightEntry, what: str) -> dict[str, Any]:
    item: dict[str, Any] = {
        "scenario": name,
        "old": old.cell if old else None,
        "new": new.cell,
        "old_rate": old.rate if old else None,
        "new_rate": new.rate,
        "text": f"{what}: {_rate(old) if old else 'not in the earlier night'} -> {_rate(new)}",
    }
    if _fails(new):
        item["failing_runs"] = [{"index": r.index, "verdict": r.verdict, "report": r.report}
                                for r in new.runs if r.verdict not in ("pass", "xfail", "xpass", "skip")]
    return item


def _loads(old: NightDoc, new: NightDoc) -> str:
    """The machine's load at the end of each night, beside a timing change (a loaded machine is slower)."""
    then, now = (load_text((n.load or {}).get("end")) for n in (old, new))
    return f" (machine: {then or '?'} then, {now or '?'} now)" if then or now else ""


def compare_nights(old: NightDoc, new: NightDoc, drop: float = 0.2) -> dict[str, Any]:
    """The comparison of ``new`` against ``old`` (both ``nightly.json``), by the rules above."""
    old_by = {s.name: s for s in old.scenarios}
    new_by = {s.name: s for s in new.scenarios}
    out: dict[str, Any] = {"against": old.night, "newly_failing": [], "fixed": [], "other": [],
                           "rates_moved": [], "slower": [],
                           "new_scenarios": [n for n in new_by if n not in old_by],
                           "gone_scenarios": [n for n in old_by if n not in new_by]}
    for name, s in new_by.items():
        before = old_by.get(name)
        if _fails(s) and not _fails(before):
            out["newly_failing"].append(_item(name, before, s, "newly failing"))
        elif before and _fails(before) and not _fails(s) and s.cell != "SKIP":
            out["fixed"].append(_item(name, before, s, "fixed"))
        elif before and before.cell != s.cell:
            out["other"].append(_item(name, before, s, "changed"))
    for change in diff_matrices(_as_matrix(old), _as_matrix(new), drop):
        changed = change.scenario
        if changed is None:
            continue
        if change.kind == "rate":
            out["rates_moved"].append({"scenario": changed, "old": change.old, "new": change.new,
                                       "up": change.regression, "text": change.text})
        elif change.kind == "timing":
            out["slower"].append({"scenario": changed, "old": change.old, "new": change.new,
                                  "text": change.text.replace("seconds grew", "median run grew") + _loads(old, new)})
    return out


def count_changes(comparison: Mapping[str, Any] | None) -> dict[str, int]:
    """How many items each list of a comparison holds (all 0 without one)."""
    keys = ("newly_failing", "still_failing", "flaky", "fixed", "rates_moved", "other", "slower", "new_scenarios",
            "gone_scenarios")
    return {k: len((comparison or {}).get(k) or []) for k in keys}
