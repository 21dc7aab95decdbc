"""``mxchaos``: run, check, validate, schema, cleanup, list, open, matrix, nightly, replay, explore, lab, doctor (and ``--version``).

``run --repeat N`` runs each scenario N times and judges its cell by ``harness.rates`` (the
rule, the bound, the ``summary.json`` shape); ``run`` always writes that summary
(``--summary FILE``, default ``<out>/summary.json``).

Exit codes (``EXIT_CODES``, also the epilog of ``mxchaos --help``): 0 every scenario passed
(or was xfail / xpass: a ``known_defect`` scenario, or skip: a capability is missing; with
``--repeat``: no cell is FAIL, FLAKY, HANG, ERROR or UNKNOWN); 1 a
check failed or was unknown, a step failed, a run hung or errored, a scenario was FLAKY, ``cleanup`` left a
survivor; 2 invalid input (a scenario file, a path, a run folder, an option); 4 an environment is broken
(``harness.doctor``: ``run --inventory``, ``matrix``, ``nightly`` refuse before starting anything; a cell
whose every run failed before any fault for its environment); 130 the
harness was interrupted (SIGINT/SIGTERM) after healing and tearing down; 141 (128 +
SIGPIPE) standard output was closed early (``mxchaos list | head -1``), quietly.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import signal
import sys
import textwrap
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from harness.commands.select import (
    scenarios_to_run,
)
from harness.commands.select import shown as _shown
from harness.doctor import EXIT_ENV_BROKEN

__all__ = ["EXIT_CODES", "build_parser", "main", "version_line"]

EXIT_OK, EXIT_FAILED, EXIT_INVALID, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE  # what a shell reports for a program SIGPIPE ended

EXIT_CODES: dict[int, str] = {
    EXIT_OK: "every scenario passed, or was XFAIL / XPASS (a known defect) or SKIP (a capability is missing); "
    "validate, list: every file is valid",
    EXIT_FAILED: "a check failed or was unknown, a step failed, a run hung or errored, a scenario was FLAKY "
    "(--repeat: passed in some runs only); cleanup: a process survived",
    EXIT_INVALID: "invalid input: a scenario file, a path, a run folder, an option",
    EXIT_ENV_BROKEN: "environment broken (run --inventory, matrix, nightly, doctor): a place the run needs cannot play its role "
    "(NIXL or the native extension does not import, a host does not answer); nothing was started, or every run of "
    "a cell failed before its first step for that reason (see mxchaos doctor)",
    EXIT_INTERRUPTED: "interrupted (SIGINT / SIGTERM), after healing every fault and tearing down",
    EXIT_BROKEN_PIPE: "standard output was closed early (e.g. piped into head); nothing more is printed",
}


def version_line() -> str:
    """``mxchaos X, nixl Y, Python Z``: the installed package versions (NIXL's only if importable)."""
    try:
        ours = metadata.version("mxchaos")
    except metadata.PackageNotFoundError:
        ours = "(not installed)"
    if importlib.util.find_spec("nixl") is None:
        nixl = "nixl not importable"
    else:
        try:
            nixl = f"nixl {metadata.version('nixl')}"
        except metadata.PackageNotFoundError:
            nixl = "nixl (version unknown)"
    return f"mxchaos {ours}, {nixl}, Python {platform.python_version()}"


def _subjects_arg(text: str) -> dict[str, str]:
    """``--subject``: a subject, or role=subject pairs (``harness.subjects.mx_server.parse_subjects``)."""
    from harness.subjects.mx_server import parse_subjects

    try:
        return parse_subjects(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _cmd_run(args: argparse.Namespace) -> int:
    """``run``; with ``--json`` every line goes to stderr and stdout gets one JSON document
    (``harness.invocation.json_summary``: paths relative to the invocation's folder)."""
    if not args.json:
        return _run_suite(args)
    record: dict[str, object] = {}
    with contextlib.redirect_stdout(sys.stderr):
        code = _run_suite(args, record)
    if record:
        from harness.invocation import json_summary

        print(json.dumps(json_summary(record), indent=1))
    return code


def _run_suite(args: argparse.Namespace, record: dict[str, object] | None = None) -> int:
    """Run every scenario ``--repeat`` times (seed, seed+1, ...), judge each scenario's runs as
    one cell (``harness.rates``), write the summary; exit 1 if some cell fails the run.
    ``--lf``: only what failed in the last invocation under ``runs/``; ``--maxfail N`` (``-x``: 1):
    stop after N runs that did not pass. ``record`` gets ``invocation.json``'s document."""
    from harness.console import Progress, rate_table, verdict_table
    from harness.play import run_scenario
    from harness.rates import write_summary
    from harness.report import judge_runs, write_junit, write_junit_cells

    if args.repeat < 1:
        print(f"--repeat {args.repeat}: give a number of runs >= 1", file=sys.stderr)
        return EXIT_INVALID
    if args.maxfail is not None and args.maxfail < 1:
        print(f"--maxfail {args.maxfail}: give a number of runs >= 1", file=sys.stderr)
        return EXIT_INVALID
    inventory = None
    if args.inventory:
        from harness.hosts.inventory import InventoryInvalid, load_inventory

        try:
            inventory = load_inventory(args.inventory)
        except InventoryInvalid as bad:
            print(bad, file=sys.stderr)
            return EXIT_INVALID
    paths, wanted = list(args.paths), None
    if args.lf:
        from harness.invocation import DEFAULT_ROOT, last_failed

        failed = last_failed(DEFAULT_ROOT)
        if failed is None or not failed:
            print(f"--lf: {'no earlier invocation in ' + str(DEFAULT_ROOT) if failed is None else 'nothing failed last time'}"
                  + ("; running what was given" if paths else "; nothing to run"))
            if not paths:
                return EXIT_OK
        else:
            wanted = set(failed)
            paths = paths or sorted(set(failed.values()))
            print(f"--lf: {len(failed)} scenario(s) failed last time: {', '.join(failed)}")
    if not paths:
        print("run: give scenario files, folders or names (or --lf)", file=sys.stderr)
        return EXIT_INVALID
    scenarios = scenarios_to_run(paths, args.seed, args.k, args.store)
    if scenarios is None:
        return EXIT_INVALID
    if wanted is not None:
        scenarios = [s for s in scenarios if s.name in wanted]
    if args.subject is not None:
        from harness.subjects.mx_server import with_subjects

        scenarios = [with_subjects(s, args.subject) for s in scenarios]
    if inventory is not None:  # the machines must be able to play their roles: refused now, not a FAIL per run
        from harness.doctor import places_for, preflight

        refused = preflight(scenarios, places_for(inventory=Path(args.inventory), here=False), "mxchaos run --inventory")
        if refused is not None:
            return refused
    if os.environ.get("MXCHAOS_BUILD_SUBJECTS") != "0":  # 0: a missing subject environment is a SKIP
        from harness.subjects import prepare_subjects

        prepare_subjects(scenarios, log=lambda line: print(line, flush=True))
    from harness.invocation import SuiteProgress, open_invocation, write_record

    repeat = args.repeat
    inv = open_invocation(args.out)
    summary = Path(args.summary) if args.summary else inv.folder / "summary.json"
    suite = SuiteProgress(len(scenarios) * repeat, inv.previous_durations())
    suite.plan([sc.name for sc in scenarios for _ in range(repeat)])
    print(f"run {inv.name}: {len(scenarios)} scenario(s) x {repeat} into {_shown(inv.folder)}", flush=True)
    results = []
    cells = {}
    interrupted = False
    maxfail = 1 if args.exitfirst else args.maxfail
    not_passed = 0
    for sc in scenarios:
        if maxfail is not None and not_passed >= maxfail:
            print(f"stopping: {not_passed} run(s) did not pass (--maxfail {maxfail}); {sc.name} and the rest not run")
            break
        runs = []
        for index in range(repeat):
            run_sc = sc.with_seed(sc.seed + index)
            of = f" run {index + 1}/{repeat}" if repeat > 1 else ""
            if not args.quiet:
                suite.started(f"{sc.name}{of} (seed {run_sc.seed}) {_shown(sc.path)}")
            observers = [Progress(sys.stdout, sc.name)] if args.verbose and not args.quiet else []
            result = run_scenario(run_sc, inv.folder, observers=observers, inventory=inventory)
            if result.verdict == "skip":  # a missing capability stays missing: one skip says it
                suite.skipped_rest(repeat - index - 1)
            suite.ended(result, f"{sc.name}{of}", quiet=args.quiet)
            results.append(result)
            runs.append(result)
            not_passed += result.verdict not in ("pass", "xfail", "xpass", "skip")
            if result.status == "interrupted":
                interrupted = True
                break
            if result.verdict == "skip":
                break
        cells[sc.name] = judge_runs(sc, runs, repeat, annotate=repeat > 1)
        if interrupted:
            break
    if repeat > 1:  # each run's line was printed as it ended; the cells say the rest
        rate_table(list(cells.values()), repeat)
    else:
        verdict_table(results, quiet=args.quiet)
    write_summary(summary, cells, repeat)
    if repeat > 1:
        write_junit_cells(inv.folder / "junit.xml", list(cells.values()))
    else:
        write_junit(inv.folder / "junit.xml", results)
    if args.junit:
        if repeat > 1:
            write_junit_cells(Path(args.junit), list(cells.values()))
        else:
            write_junit(Path(args.junit), results)
    if interrupted:
        code = EXIT_INTERRUPTED
    else:
        code = EXIT_FAILED if any(c.fails_run for c in cells.values()) else EXIT_OK
    doc = write_record(inv, results, cells, repeat, args.seed, ["mxchaos", *sys.argv[1:]], interrupted, code)
    if record is not None:
        record.update(doc, summary=str(summary.resolve()))
    inv.link_latest()
    print(f"summary: {_shown(summary)}")
    print(f"index:   {_shown(inv.folder / 'index.html')}")
    return code


def _epilog() -> str:
    width = max(len(str(code)) for code in EXIT_CODES)
    lines = ["exit codes:"]
    for code, text in EXIT_CODES.items():
        lines += textwrap.wrap(text, 96, initial_indent=f"  {code:<{width}}  ", subsequent_indent=" " * (width + 4))
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mxchaos",
        description="Scenarios that break NIXL weight transfer on purpose.",
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="validate, then run scenario files; exit 0 only if all pass")
    run.add_argument("paths", nargs="*", metavar="PATH", help="scenario files, folders or names (mxchaos run smoke)")
    run.add_argument("--lf", "--last-failed", dest="lf", action="store_true",
                     help="only the scenarios that failed in the last invocation under runs/ (runs/latest); with no PATH, "
                          "their files")
    run.add_argument("-x", "--exitfirst", action="store_true", help="stop after the first run that does not pass")
    run.add_argument("--maxfail", type=int, metavar="N", help="stop after N runs that do not pass")
    run.add_argument("--json", action="store_true",
                     help="stdout: one JSON document of the invocation (paths relative to its folder); lines go to stderr")
    run.add_argument("--seed", type=int, help="override every scenario's seed")
    run.add_argument("--store", choices=("memory", "redis"), default=None,
                     help="redis: run every scenario's servers on a Redis store (a redis process added where "
                          "the scenario has none; harness.scenario.stores); default: each scenario's own store key")
    run.add_argument("--subject", type=_subjects_arg, default=None, metavar="SUBJECT|ROLE=SUBJECT,...",
                     help="who plays the sources and readers (default: each scenario's subject:, itself mxref); "
                          "modelexpress builds its environment on first use (harness/subjects); per role: "
                          "server=modelexpress,reader=mxref (roles server, source, reader, client; a ModelExpress "
                          "server runs the real binary on the scenario's Redis store)")
    run.add_argument("--inventory", metavar="FILE", help="run the scenarios' hosts on this inventory's machines over ssh "
                     "(harness/hosts/inventory.py: binding by bind:, by name, then in order)")
    run.add_argument("--out", default=None, metavar="DIR",
                     help="this invocation's folder (default: a new runs/<UTC stamp>/, runs/latest pointing at the newest; "
                          "harness/invocation.py)")
    run.add_argument("-k", metavar="EXPR", help="select scenarios by name: words with and/or/not")
    run.add_argument("--junit", metavar="FILE", help="also write one JUnit XML for all runs")
    run.add_argument("-q", "--quiet", action="store_true",
                     help="only what did not pass: its [i/N] line, the next steps and its checks")
    run.add_argument("-v", "--verbose", action="store_true",
                     help="also the live event stream of each run (steps, faults, process events)")
    run.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="run every scenario N times (seeds seed..seed+N-1) and judge its rate: PASS only at N/N, "
        "FLAKY (fails the run) when it passes sometimes; a known defect REPRODUCED at >= 1, FIXED? only at "
        "0/N when the 95%% upper bound is below its defect_rate (default: 1)",
    )
    run.add_argument(
        "--summary", metavar="FILE", help="where the run-level summary goes (default: <out>/summary.json)"
    )
    run.set_defaults(fn=_cmd_run)

    from harness.commands.saved import add_parser as add_saved_parser

    add_saved_parser(sub)  # mxchaos check, schema, cleanup: harness/commands/saved.py
    from harness.commands.listing import add_parser as add_listing_parser

    add_listing_parser(sub, _subjects_arg)  # mxchaos list, validate: harness/commands/listing.py
    from harness.commands.open import add_parser as add_open_parser

    add_open_parser(sub)  # mxchaos open: harness/commands/open.py
    from harness.matrix.command import add_parser as add_matrix_parser

    add_matrix_parser(sub)  # mxchaos matrix: harness/matrix/command.py
    from harness.nightly.command import add_parser as add_nightly_parser

    add_nightly_parser(sub)  # mxchaos nightly: harness/nightly/command.py
    from harness.replay import add_parser as add_replay_parser

    add_replay_parser(sub)  # mxchaos replay: harness/replay.py
    from harness.explore.command import add_parser as add_explore_parser

    add_explore_parser(sub)  # mxchaos explore: harness/explore/
    from harness.hosts.lab import add_parser as add_lab_parser

    add_lab_parser(sub)  # mxchaos lab up/down/status: harness/hosts/lab.py
    from harness.doctor import add_parser as add_doctor_parser

    add_doctor_parser(sub)  # mxchaos doctor: harness/doctor.py
    from harness.mutate.command import add_parser as add_mutate_parser

    add_mutate_parser(sub)  # mxchaos mutate: harness/mutate/
    return parser


def _quiet_broken_pipe() -> int:
    """Standard output was closed (``| head``): point it at /dev/null so the interpreter's final
    flush does not fail again (the recipe of the Python docs, "Note on SIGPIPE")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a file (embedded, captured): nothing to flush
        pass
    return EXIT_BROKEN_PIPE


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # argparse: 2 on bad usage, 0 on --help / --version
            return int(exc.code or 0)
        return int(args.fn(args))
    except BrokenPipeError:
        return _quiet_broken_pipe()


if __name__ == "__main__":
    sys.exit(main())
