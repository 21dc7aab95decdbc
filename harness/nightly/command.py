"""The ``mxchaos nightly`` sub-command: its options and what it prints.

``mxchaos nightly --out DIR [--repeat N] [--inventory FILE | --slurm [--partition P] [--time T]
[--allocation-timeout S]] [--seed S] [-k EXPR] [--keep K] [-q] [PATH ...]`` (default path: ``scenarios/``) validates every scenario file first (one invalid
file: nothing runs, exit 2), checks ``--inventory`` (it must be a readable YAML mapping;
``harness.nightly.binding``), runs the night (``harness.nightly.run``), then prints the rate
table and its closing recap as ``mxchaos run --repeat`` does (a line per cell that is not PASS:
its first failing run's first failing check, page and rerun command), what changed since the night before, and where the
night's ``index.html``, ``nightly.json``, ``junit.xml`` and the folder's ``history.html`` are. While
it runs: ``mxchaos run``'s ``[i/N]`` lines (``-q``: only of runs that did not pass), the live
event stream only under ``-v``. ``--slurm``: the night's lanes run
as one SLURM job array (``harness.nightly.slurm``; docs/slurm-dispatch.md).

Exit codes, as ``mxchaos run``: 0 the night passed (no cell is FAIL, FLAKY, HANG, ERROR or
UNKNOWN, and at least one scenario ran); 1 it did not; 2 invalid input (a scenario file, a
path, an option, the inventory) or no scenario can be bound or run here (each one's reason
is printed); 4 (``harness.commands.doctor.EXIT_ENV_BROKEN``) an environment is broken: the preflight (``mxchaos
doctor``) found a place that cannot play its role (nothing ran), or a scenario's every run failed before any
fault for an environment reason (its cell: ENV_BROKEN, "environment broken: <reason>"), or ``--slurm``: no
controller answers, or SLURM ended a lane twice (its cells ENV_BROKEN naming job, node and state); 130 interrupted (the
night's folder is still written, marked interrupted).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.commands.slurmopts import add_slurm_options, slurm_options
from harness.counts import at_least
from harness.exits import EXIT_INVALID
from harness.judge.verdict import RunResult
from harness.record.saved import NIGHT
from harness.reports.invocation import SuiteProgress
from harness.scenario.select import shown as _shown

if TYPE_CHECKING:
    from harness.nightly.run import NightOutcome

__all__ = ["add_parser", "cmd_nightly", "night_step_summary", "night_verdict", "print_comparison"]


def add_parser(sub: Any) -> None:
    """Register ``nightly`` on ``mxchaos``'s sub-parsers."""
    p = sub.add_parser(
        "nightly",
        help="run every scenario that can run here N times; write DIR/<night>/{junit.xml,nightly.json,index.html} "
        "and compare with the night before",
    )
    p.add_argument("paths", nargs="*", metavar="PATH", help="scenario files or folders (default: scenarios/)")
    p.add_argument("--out", required=True, metavar="DIR", help="the nights' folder: DIR/<night id>/, DIR/latest")
    p.add_argument("--repeat", type=at_least(1, "a number of runs"), default=1, metavar="N",
                   help="runs per scenario (seeds seed..seed+N-1); judged as `mxchaos run --repeat` (default 1)")
    p.add_argument("--inventory", metavar="FILE",
                   help="bind the scenarios' hosts to the machines of this inventory (YAML) instead of this machine")
    p.add_argument("--seed", type=int, help="override every scenario's seed")
    p.add_argument("-k", metavar="EXPR", help="select scenarios by name: words with and/or/not")
    p.add_argument("--keep", type=at_least(1, "a number of nights to keep (the newest at least)"), metavar="K",
                   help="after the night, delete all but the newest K nights in DIR (default: keep every night)")
    p.add_argument("-q", "--quiet", action="store_true", help="only the [i/N] lines of the runs that did not pass")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="also the live event stream of each run (steps, faults, process events)")
    add_slurm_options(p)
    p.set_defaults(fn=cmd_nightly)


def _command_line(args: argparse.Namespace) -> list[str]:
    """The night's command as parsed (for nightly.json and the page)."""
    argv = ["mxchaos", "nightly", "--out", str(args.out), "--repeat", str(args.repeat)]
    for flag, value in (("--inventory", args.inventory), ("--seed", args.seed), ("-k", args.k), ("--keep", args.keep),
                        ("--partition", args.partition), ("--time", args.time),
                        ("--nodes-per-lane", args.nodes_per_lane if args.nodes_per_lane != 1 else None),
                        ("--lane-inventory", args.lane_inventory), ("--node-local", args.node_local)):
        if value is not None:
            argv += [flag, str(value)]
    return [*argv, *(["--slurm"] if args.slurm else []), *(["-q"] if args.quiet else []), *args.paths]


def print_comparison(comparison: Mapping[str, Any] | None) -> None:
    if comparison is None:
        print("the first night in this folder: nothing to compare")
        return
    against = comparison.get("against")
    lists = [("NEWLY FAILING", "newly_failing"), ("STILL FAILING", "still_failing"), ("FLAKY", "flaky"), ("FIXED", "fixed"),
             ("RATE MOVED", "rates_moved"), ("changed", "other"), ("slower", "slower")]
    lines = [f"  {label} {item['scenario']}: {item['text']}" for label, key in lists for item in comparison.get(key) or []]
    for label, key in (("new", "new_scenarios"), ("gone", "gone_scenarios")):
        if comparison.get(key):
            lines.append(f"  {label}: {', '.join(comparison[key])}")
    print(f"since night {against}: " + ("no change" if not lines else f"{len(lines)} change(s)"))
    for line in lines:
        print(line)


def cmd_nightly(args: argparse.Namespace) -> int:
    from harness.nightly.binding import InventoryError, binding_for, inventory_summary
    from harness.nightly.run import NightSpec, NothingToRun, run_night
    from harness.reports.console import Progress, rate_table
    from harness.scenario.select import scenarios_to_run

    inventory = Path(args.inventory) if args.inventory else None
    if args.slurm and inventory is not None:
        print("--slurm and --inventory: choose one (a lane runs its scenarios on its node's network namespaces)",
              file=sys.stderr)
        return EXIT_INVALID
    hosts: dict[str, Any] = {"binding": "slurm" if args.slurm else ("here" if inventory is None else "inventory"),
                             "inventory": None}
    if inventory is not None:
        try:
            hosts["inventory"] = inventory_summary(inventory)
        except InventoryError as exc:
            print(exc, file=sys.stderr)
            return EXIT_INVALID
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        print(f"--out {out}: not a folder", file=sys.stderr)
        return EXIT_INVALID
    scenarios = scenarios_to_run(args.paths or ["scenarios"], args.seed, args.k)
    if scenarios is None:
        return EXIT_INVALID
    spec = NightSpec(scenarios=scenarios, out=out, repeat=args.repeat, seed=args.seed,
                     command=_command_line(args),
                     hosts=hosts, keep=args.keep)
    try:
        binding = binding_for(inventory)
    except InventoryError as exc:  # invalid: named file, key and rule, before anything runs
        print(exc, file=sys.stderr)
        return EXIT_INVALID
    if args.slurm:
        from harness.exits import EXIT_ENV_BROKEN
        from harness.hosts.slurm import SlurmUnavailable
        from harness.nightly.slurm import SlurmBinding

        try:
            binding = SlurmBinding(slurm_options(args, "nightly"), log=lambda m: print(m, flush=True), record=hosts)
        except SlurmUnavailable as exc:  # no controller: nothing is written or queued
            print(exc, file=sys.stderr)
            return EXIT_ENV_BROKEN
    # the preflight (mxchaos doctor): this machine, or every inventory machine, must be able to play the
    # roles the scenarios give it; else the night is refused before anything starts (not a FAIL per cell)
    from harness.commands.doctor import places_for, preflight
    from harness.errors import HarnessError
    from harness.hosts.slurm import SlurmError

    try:
        places = places_for(inventory=inventory, here=inventory is None)
    except HarnessError as exc:
        print(exc, file=sys.stderr)
        return EXIT_INVALID
    refused = preflight(scenarios, places, "mxchaos nightly")
    if refused is not None:
        return refused
    # the style of `mxchaos run`: [i/N] lines, the event stream only under -v
    bound_runs = [sc.name for sc in scenarios for _ in range(args.repeat)]
    progress = _QuietProgress(len(bound_runs), args.quiet)
    progress.plan(bound_runs)
    try:
        outcome = run_night(
            spec, binding, log=lambda m: print(m, flush=True),
            observers=lambda name: [Progress(sys.stdout, name)] if args.verbose and not args.quiet else [],
            progress=progress,
        )
    except NothingToRun as exc:
        print(exc, file=sys.stderr)
        return EXIT_INVALID
    except SlurmError as exc:  # --slurm: the controller stopped answering, or sbatch refused the array
        from harness.exits import EXIT_ENV_BROKEN

        print(exc, file=sys.stderr)
        return EXIT_ENV_BROKEN
    rate_table(outcome.cells, args.repeat, results=progress.results)  # its recap: a line per cell not PASS
    print_comparison(outcome.night.get("comparison"))
    night = outcome.night
    verdict = night_verdict(night)
    size = night["artifacts"]["bytes"] / (1 << 20)
    print(f"night {night['night']} {verdict}: {night['counts']['ran']} ran, {night['counts']['skipped']} skipped, "
          f"{night['counts']['failing']} failing; {size:.1f} MiB")
    for name in ("index.html", NIGHT, "junit.xml"):
        print(f"  {_shown(outcome.night_dir / name)}")
    print(f"history: {_shown(out / 'history.html')}")
    from harness.reports.ci import STEP_SUMMARY, write_step_summary

    markdown = night_step_summary(outcome, progress.results)
    if write_step_summary(markdown) is not None:
        print(f"step summary: appended to ${STEP_SUMMARY}")
    return outcome.exit_code


class _QuietProgress(SuiteProgress):
    """``SuiteProgress`` whose ``-q`` leaves out the lines of runs that passed (run's ``-q``); it
    keeps every run's result for the closing recap."""

    def __init__(self, total: int, quiet: bool) -> None:
        super().__init__(total, {})
        self.quiet = quiet
        self.results: list[RunResult] = []

    def started(self, label: str) -> None:
        if not self.quiet:
            super().started(label)

    def ended(self, result: RunResult, label: str, quiet: bool = False) -> None:
        self.results.append(result)
        super().ended(result, label, quiet or self.quiet)


def night_verdict(night: Mapping[str, Any]) -> str:
    """The night's headline word, from ``nightly.json``'s ``passed`` (``harness.reports.night.night_passed``:
    the night's cells, as its exit code): PASSED, INTERRUPTED or FAILED."""
    return "PASSED" if night["passed"] else ("INTERRUPTED" if night["interrupted"] else "FAILED")


def night_step_summary(outcome: NightOutcome, results: Sequence[RunResult]) -> str:
    """The night's ``$GITHUB_STEP_SUMMARY`` markdown: its headline and counts from its cells (a
    known defect that showed, an XPASS, a SKIP do not fail it; a FAIL cell does), a row per cell
    that is not PASS told from its first failing run among ``results`` (the runs seen here)."""
    from harness.reports.ci import step_summary

    night = outcome.night
    return step_summary(results, outcome.night_dir / "index.html", outcome.cells,
                        title=f"mxchaos nightly {night['night']}", verdict=night_verdict(night).lower())
