"""``mxchaos project SOURCE``: a matrix's wall time on 1, 4, 16 and 64 nodes, projected from a
column's measured durations (``harness.matrix.projection``). Exit 0; 2 on bad input."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from harness.counts import at_least
from harness.exits import EXIT_INVALID, EXIT_OK
from harness.matrix.projection import DEFAULT_NODES, ProjectionInput, placements_alone, project, read_seconds, render

__all__ = ["add_parser", "cmd_project"]

CHECKOUT = Path(__file__).resolve().parents[2]


def _nodes(text: str) -> tuple[int, ...]:
    try:
        nodes = tuple(int(n) for n in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: node counts, comma-separated (1,4,16,64)") from None
    if not nodes or any(n < 1 for n in nodes):
        raise argparse.ArgumentTypeError(f"{text!r}: every node count at least 1")
    return nodes


def add_parser(sub: Any) -> None:
    p = sub.add_parser("project", help="project a matrix's wall time on N nodes from a column's measured durations")
    p.add_argument("source", metavar="SOURCE", help="a matrix.json or summary.json (or a folder holding one)")
    p.add_argument("--scenarios", nargs="+", metavar="PATH",
                   help="the scenarios' files, for which must run alone (default: the files a matrix.json "
                        "recorded, else the checkout's scenarios/)")
    p.add_argument("--releases", type=at_least(1, "a number of releases"), default=3, help="columns (default 3)")
    p.add_argument("--repeat", type=at_least(1, "a number of runs"), default=5, help="runs per cell (default 5)")
    p.add_argument("--nodes", type=_nodes, default=DEFAULT_NODES, help="node counts (default 1,4,16,64)")
    p.add_argument("--lanes-per-node", type=at_least(1, "a number of lanes"), default=4,
                   help="shared lanes a node runs at once (default 4: two per core of a 2-core node)")
    p.add_argument("--overhead", type=float, default=0.0, metavar="S",
                   help="seconds each lane pays to be dispatched and gathered (default 0)")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.set_defaults(fn=cmd_project)


def cmd_project(args: argparse.Namespace) -> int:
    from harness.errors import HarnessError
    from harness.scenario.placement import place
    from harness.scenario.select import files_to_run, load_all

    try:
        seconds, recorded = read_seconds(Path(args.source))
    except HarnessError as exc:
        print(f"mxchaos project: {exc}", file=sys.stderr)
        return EXIT_INVALID
    where = args.scenarios or [f for f in recorded if Path(f).is_file()] or [str(CHECKOUT / "scenarios")]
    files = files_to_run(where) or []
    loaded, _invalid = load_all(files, None, None)
    placements = [place(sc) for sc in loaded if sc.name in seconds]
    unplaced = sorted(set(seconds) - {p.name for p in placements})
    given = ProjectionInput(seconds, placements_alone(placements), releases=args.releases, repeat=args.repeat,
                            lanes_per_node=args.lanes_per_node, overhead_s=args.overhead)
    rows = [project(given, n) for n in args.nodes]
    if args.json:
        print(json.dumps({"source": str(args.source), "scenarios": len(seconds), "alone": sorted(given.alone),
                          "releases": given.releases, "repeat": given.repeat, "lanes_per_node": given.lanes_per_node,
                          "overhead_s": given.overhead_s, "unplaced": unplaced,
                          "projections": [{"nodes": r.nodes, "wall_s": round(r.wall_s, 1),
                                           "lower_bound_s": round(r.lower_bound_s, 1), "busy": round(r.busy, 3)}
                                          for r in rows]}, indent=2))
    else:
        print(render(given, rows, unplaced))
    return EXIT_OK
