"""The ``mxchaos explore`` sub-command: its options, what it prints, its exit code.

``mxchaos explore TEMPLATE --seed S --runs N --budget 20m [--out DIR] [--repeat R]``: validate
the template (exit 2 with every problem, file:line: key: rule), explore (``harness.explore.search``),
write ``DIR/explore.json`` and ``DIR/explore.html`` (default ``DIR``: ``runs/explore/<template
name>``; exploring into the same ``DIR`` again replays a failure it found first, from its
example database). Exit 0: no failure found (within runs and budget); 1: a failure was found
(its minimal scenario is ``DIR/minimal.yaml``); 2: invalid input; 130: interrupted (the run in
progress healed and torn down, the report written with what there was).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from harness.errors import ScenarioInvalid
from harness.explore.report import write_report
from harness.explore.search import explore
from harness.explore.template import load_template
from harness.record.results import results_root
from harness.spec import parse_duration

__all__ = ["add_parser", "cmd_explore"]


def add_parser(sub: Any) -> None:
    """Register ``explore`` on ``mxchaos``'s sub-parsers."""
    p = sub.add_parser(
        "explore",
        help="draw fault schedules from a template (*.explore.yaml) with Hypothesis, run each, shrink a failure "
        "to a minimal scenario and measure its reproduction rate; exit 1 if a failure was found",
    )
    p.add_argument("template", metavar="TEMPLATE", help="a template: a scenario with an explore: section")
    p.add_argument("--seed", type=int, default=0, help="the exploration's seed: the same seed draws the same schedules")
    p.add_argument("--runs", type=int, default=10, metavar="N", help="schedules to draw before shrinking (default 10)")
    p.add_argument("--budget", default="20m", metavar="DURATION",
                   help="the whole exploration's time (runs, shrinking, reproduction), e.g. 20m, 300s (default 20m)")
    p.add_argument("--repeat", type=int, default=3, metavar="R",
                   help="reruns of the minimal scenario for its reproduction rate (default 3)")
    p.add_argument("--shrinker", choices=("goals", "hypothesis"), default="goals",
                   help="goals: fewest faults, then earliest times, shortest durations, first options (default); "
                   "hypothesis: Hypothesis' own shrinker")
    p.add_argument("--out", metavar="DIR", help="where the report, schedules and runs go (default runs/explore/<name>)")
    p.set_defaults(fn=cmd_explore)


def cmd_explore(args: argparse.Namespace) -> int:
    try:
        budget = float(parse_duration(args.budget))
    except (ValidationError, ValueError) as exc:
        print(f"--budget {args.budget!r}: a duration like 20m, 300s or 1.5h ({exc})", file=sys.stderr)
        return 2
    if args.runs < 1 or args.repeat < 0:
        print("--runs needs N >= 1 and --repeat R >= 0", file=sys.stderr)
        return 2
    try:
        template = load_template(args.template)
    except ScenarioInvalid as exc:
        print(exc.render(), file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else results_root() / "explore" / template.name
    print(f"=== explore {template.name}: seed {args.seed}, up to {args.runs} schedules, budget {budget:g}s -> {out}",
          flush=True)
    ex = explore(template, seed=args.seed, runs=args.runs, budget_s=budget, out_dir=out, repeat=args.repeat,
                 shrinker=args.shrinker)
    json_path, html_path = write_report(ex)
    print(f"=== {ex.outcome.replace('_', ' ')}: {len(ex.trials)} schedules run in {ex.seconds:.0f}s"
          + (f" ({ex.stop_reason})" if ex.stop_reason else ""))
    if ex.minimal_file:
        rate = ex.rate()
        said = f", fails in {rate['k']}/{rate['n']} reruns (95% {rate['lower']:.2f}..{rate['upper']:.2f})" if rate else ""
        print(f"minimal scenario: {ex.minimal_file}{said}")
    print(f"report: {html_path}  ({json_path.name})")
    if ex.outcome == "interrupted":
        return 130
    return 1 if ex.minimal is not None else 0
