"""Benchmark: how fast the default (chunked) reader leaves a wedged source, from saved runs.

Reads the ``timeline.jsonl`` of every run folder under the given directories (as written by
``mxchaos run --repeat N --out DIR``) and prints, per scenario, the median, p95 and worst of:

- ``frozen_source``: freeze -> the reader's next ``attempt_start``, counted from the later of the
  freeze and the frozen READ's ``transfer_start`` (the scenario freezes the source before its
  READ is posted; for a freeze that lands mid-READ the window deadline counts from the last
  completion, which is no earlier, so this is the rule's worst case). Goal: p95 <= 1 s.
- ``all_candidates_wedged``: the harness starting the reader process -> its ``fallback``
  event (three stalls and the setup of three attempts). Goal: <= 3 s. Also from the reader's
  ``started`` event (its interpreter up and its modules imported).

Figures, not asserts::

    .venv/bin/mxchaos run scenarios/frozen_source.yaml scenarios/all_candidates_wedged.yaml \\
        --repeat 20 --out /tmp/stall-runs -q
    PYTHONPATH=$PWD python tests/bench/stall_timings.py /tmp/stall-runs
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any


def _entries(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "timeline.jsonl").read_text().splitlines() if line.strip()]


def _first(entries: list[dict[str, Any]], actor: str, f: str, type_: str, **value: Any) -> float | None:
    for e in entries:
        if e["actor"] == actor and e["f"] == f and e["type"] == type_ and all(
                e["value"].get(k) == v for k, v in value.items()):
            return float(e["t"])
    return None


def frozen_source(entries: list[dict[str, Any]]) -> float | None:
    freeze = next((float(e["t"]) for e in entries if e["actor"] == "nemesis" and e["f"] == "inject"
                   and e["type"] == "ok" and e["value"].get("fault") == "freeze"), None)
    read = _first(entries, "reader-1", "transfer_start", "info", index=0)
    nxt = _first(entries, "reader-1", "attempt_start", "info", index=1)
    if freeze is None or read is None or nxt is None:
        return None
    return nxt - max(freeze, read)


def all_candidates_wedged(entries: list[dict[str, Any]]) -> float | None:
    start = _first(entries, "reader-1", "start", "invoke")
    fallback = _first(entries, "reader-1", "fallback", "info")
    return None if start is None or fallback is None else fallback - start


def all_candidates_wedged_after_started(entries: list[dict[str, Any]]) -> float | None:
    start = _first(entries, "reader-1", "started", "info")  # its interpreter is up, its modules imported
    fallback = _first(entries, "reader-1", "fallback", "info")
    return None if start is None or fallback is None else fallback - start


MEASURES = {"frozen_source": ("frozen_source", frozen_source, 1.0),
            "all_candidates_wedged": ("all_candidates_wedged", all_candidates_wedged, 3.0),
            "all_candidates_wedged_from_started": ("all_candidates_wedged", all_candidates_wedged_after_started, 3.0)}


def _p95(values: list[float]) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=20, method="inclusive")[18]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", type=Path, help="run output folders (mxchaos run --out)")
    args = parser.parse_args(argv)
    report: dict[str, Any] = {}
    for name, (scenario, measure, goal) in MEASURES.items():
        runs = sorted({p.parent.resolve() for d in args.dirs for p in d.glob(f"{scenario}/*/timeline.jsonl")})
        values = [v for v in (measure(_entries(r)) for r in runs) if v is not None]
        if not values:
            continue
        report[name] = {"runs": len(values), "median_s": round(statistics.median(values), 3),
                        "p95_s": round(_p95(values), 3), "max_s": round(max(values), 3), "goal_s": goal}
        print(f"{name:34s} n={len(values):3d} median {statistics.median(values):.3f}s  p95 {_p95(values):.3f}s  "
              f"max {max(values):.3f}s  (goal {goal:g}s)")
    print(json.dumps({"stall_timings": report}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
