"""What changed between an old ``matrix.json`` (``--baseline``) and a new one.

Cells are matched by scenario name and column id. Three kinds of change, each the rule
stated here and nowhere else:

* ``verdict``: the cell verdict differs (``pass`` -> ``fail``, ``xfail`` -> ``xpass``, ...).
* ``rate``: the failure rates (runs ending error/hang/fail/unknown/xfail over runs not
  skipped) moved beyond their confidence bounds: the 95% Wilson score intervals of the old
  and the new rate do not overlap. (With few runs the intervals are wide: 0/2 vs 2/2 is not a
  move; 0/10 vs 6/10 is.)
* ``timing``: READ throughput (``read_ratio`` when both cells have it, else ``read_gbps``)
  fell by more than ``drop`` (default 20%), or a duration (``seconds``, ``detection_s``,
  ``recovery_s``, ``fallback_s``) grew by more than ``drop`` and by at least 0.5 s.

A change is a ``regression`` when the verdict got worse (by ``cells.SEVERITY``), the failure
rate went up, or a timing got worse; every timing change here is one.

Timings are compared only between runs made under the same load from their own column: a
scenario that ran in one of N lanes side by side (``harness.matrix.schedule``) shared the
machine with N - 1 others, one that ran alone (or in a column of one lane) with none. Where
the two columns ran it beside a different number of lanes its timings are not compared, and
the column gets one note saying how many scenarios that left out (``MatrixColumn.lanes_beside``).
"""

from __future__ import annotations

import math
from typing import Any

from harness.record.cells import SEVERITY
from harness.record.saved import BaselineChange, MatrixCell, MatrixColumn, MatrixDoc

__all__ = ["diff_matrices", "where", "wilson"]

DURATIONS = ("seconds", "detection_s", "recovery_s", "fallback_s")
MIN_DURATION_CHANGE_S = 0.5


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of k successes in n trials (``(0, 1)`` when n is 0)."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def _rank(verdict: str) -> int:
    return SEVERITY.index(verdict.lower()) if verdict.lower() in SEVERITY else -1


def _cell_changes(old: MatrixCell, new: MatrixCell, drop: float,
                  timings: bool = True) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    ov, nv = old.verdict, new.verdict
    if ov != nv:
        out.append({"kind": "verdict", "old": ov, "new": nv, "regression": _rank(nv) < _rank(ov),
                    "text": f"verdict {ov} -> {nv}"})
    of, nf = old.failures, new.failures
    if of.get("n") and nf.get("n"):
        (olo, ohi), (nlo, nhi) = wilson(int(of["k"]), int(of["n"])), wilson(int(nf["k"]), int(nf["n"]))
        if nlo > ohi or olo > nhi:
            up = nlo > ohi
            out.append({
                "kind": "rate", "old": of, "new": nf, "regression": up,
                "text": f"failure rate {of['k']}/{of['n']} -> {nf['k']}/{nf['n']} (95% Wilson intervals "
                        f"[{olo:.2f}, {ohi:.2f}] and [{nlo:.2f}, {nhi:.2f}] do not overlap)",
            })
    if not timings:
        return out
    key = "read_ratio" if old.read_ratio and new.read_ratio else "read_gbps"
    o, n = getattr(old, key), getattr(new, key)
    if isinstance(o, int | float) and isinstance(n, int | float) and o > 0 and n < o * (1 - drop):
        out.append({"kind": "timing", "metric": key, "old": o, "new": n, "regression": True,
                    "text": f"{key} fell {o:g} -> {n:g} ({(o - n) / o:.0%})"})
    for key in DURATIONS:
        o, n = getattr(old, key), getattr(new, key)
        if (isinstance(o, int | float) and isinstance(n, int | float) and n > o * (1 + drop)
                and n - o >= MIN_DURATION_CHANGE_S):
            grew = f"+{(n - o) / o:.0%}" if o > 0 else "from 0"
            out.append({"kind": "timing", "metric": key, "old": o, "new": n, "regression": True,
                        "text": f"{key} grew {o:g}s -> {n:g}s ({grew})"})
    return out


def where(change: BaselineChange) -> str:
    """Where a change is, as the table and the page say it: ``scenario @ column``, or ``column <id>``
    for a change of the whole column (``schedule``, ``column``: no scenario)."""
    return f"{change.scenario} @ {change.column}" if change.scenario else f"column {change.column}"


def diff_matrices(old: MatrixDoc, new: MatrixDoc, drop: float = 0.2) -> list[BaselineChange]:
    """Every change (``scenario, column, kind, text, regression, ...``), in table order."""
    changes: list[BaselineChange] = []
    old_cells, new_cells = old.cells, new.cells
    old_columns = {c.id: c for c in old.columns}
    new_columns = {c.id: c for c in new.columns}
    alone = MatrixColumn(id="")  # a column not recorded: one lane
    unlike: dict[str, list[tuple[str, int, int]]] = {}  # column -> (scenario, lanes here, lanes in the baseline)
    for scenario, row in new_cells.items():
        before = old_cells.get(scenario) or {}
        for column, cell in row.items():
            if column not in before:
                continue
            here = new_columns.get(column, alone).lanes_beside(scenario)
            there = old_columns.get(column, alone).lanes_beside(scenario)
            if here != there:
                unlike.setdefault(column, []).append((scenario, here, there))
            for change in _cell_changes(before[column], cell, drop, timings=here == there):
                changes.append(BaselineChange.model_validate({"scenario": scenario, "column": column, **change}))
    for column, rows in unlike.items():
        pairs = sorted({f"{here} here, {there} in the baseline" for _, here, there in rows})
        changes.append(BaselineChange(scenario=None, column=column, kind="schedule", regression=False,
                                      scenarios=[name for name, _, _ in rows],
                                      text=f"timings of {len(rows)} scenario(s) not compared: they ran beside a "
                                           f"different number of lanes at once ({'; '.join(pairs)})"))
    for col in new.columns:
        if old_columns and col.id not in old_columns:
            changes.append(BaselineChange(scenario=None, column=col.id, kind="column", regression=False,
                                          text="a new column (not in the baseline)"))
    return changes
