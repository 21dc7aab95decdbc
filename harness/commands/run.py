"""``mxchaos run``: validate, then run scenario files, each ``--repeat`` times, into one
invocation folder (``harness.reports.invocation``), judging each scenario's runs as one cell
(``harness.record.rates``)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.commands.doctor import places_for, preflight
from harness.counts import at_least
from harness.engine.play import run_scenario
from harness.exits import EXIT_ENV_BROKEN, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_INVALID, EXIT_OK
from harness.hosts.allocation import open_inventory
from harness.hosts.inventory import InventoryInvalid
from harness.hosts.slurm import SlurmUnavailable
from harness.record.rates import write_summary
from harness.record.results import command as mxchaos_command
from harness.record.results import failing, prune_invocations, results_root
from harness.record.saved import SummaryDoc
from harness.reports.console import Progress, rate_table, verdict_table
from harness.reports.invocation import SuiteProgress, json_summary, open_invocation, write_record
from harness.reports.report import judge_runs, write_junit, write_junit_cells
from harness.scenario.select import scenarios_to_run
from harness.scenario.select import shown as _shown
from harness.scenario.subjects import with_subjects
from harness.subjects import prepare_subjects
from harness.subjects.envs import ENV_CLIENT_VERSION
from harness.subjects.mx_server import CLIENT_VERSION_KEY, parse_subjects
from harness.subjects.releases import LATEST_NIGHTLY, Resolved, resolve_client, resolve_latest

__all__ = ["add_parser", "cmd_run", "resolve_subject", "run_suite", "subjects_arg"]


def subjects_arg(text: str) -> dict[str, str]:
    """``--subject``: a subject, or role=subject pairs (``harness.subjects.mx_server.parse_subjects``)."""
    try:
        return parse_subjects(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def resolve_subject(subject: dict[str, str], log: Callable[[str], None], *,
                    client: Callable[[], Resolved] | None = None) -> tuple[dict[str, str], Resolved]:
    """``--subject modelexpress@latest-nightly`` (``parse_subjects``' value) with the client version
    the registry names now, by the matrix's own resolver (``harness.subjects.releases.resolve_latest``),
    and what it resolved (written into the invocation's ``summary.json``: ``resolved``); unresolved,
    ``subject`` unchanged and ``Resolved.error`` says why."""
    _, _, (r,) = resolve_latest([], [f"modelexpress@{LATEST_NIGHTLY}"], log, client=client or resolve_client)
    return ({**subject, CLIENT_VERSION_KEY: r.version} if r.version else subject), r


def cmd_run(args: argparse.Namespace) -> int:
    """``run``; with ``--json`` every line goes to stderr and stdout gets one JSON document
    (``harness.reports.invocation.json_summary``: paths relative to the invocation's folder)."""
    if not args.json:
        return run_suite(args)
    record: dict[str, object] = {}
    with contextlib.redirect_stdout(sys.stderr):
        code = run_suite(args, record)
    if record:
        print(json.dumps(json_summary(record), indent=1))
    return code


def run_suite(args: argparse.Namespace, record: dict[str, object] | None = None) -> int:
    """Run every scenario ``--repeat`` times (seed, seed+1, ...), judge each scenario's runs as
    one cell (``harness.record.rates``), write the summary; exit 1 if some cell fails the run.
    ``--lf``: only the scenarios whose newest run under the results root did not pass
    (``harness.record.results``: a failure stays until a run of it passes); ``--maxfail N`` (``-x``: 1):
    stop after N runs that did not pass. ``record`` gets ``invocation.json``'s document."""
    inventory = None
    if args.inventory:
        try:
            inventory = open_inventory(args.inventory)
        except InventoryInvalid as bad:
            print(bad, file=sys.stderr)
            return EXIT_INVALID
        except SlurmUnavailable as down:  # no allocation to run on: the environment, before anything started
            print(f"mxchaos run: refused before starting anything: {down}", file=sys.stderr)
            return EXIT_ENV_BROKEN
    paths, wanted = list(args.paths), None
    if args.lf:
        root = results_root()
        failed = failing(root)
        if not failed:
            print(f"--lf: no scenario's newest run under {root} failed"
                  + ("; running what was given" if paths else "; nothing to run"))
            if not paths:
                return EXIT_OK
        else:
            wanted = set(failed)
            paths = paths or sorted({run.path or name for name, run in failed.items()})
            print(f"--lf: {len(failed)} scenario(s) whose newest run did not pass: {', '.join(failed)}")
    if not paths:
        print("run: give scenario files, folders or names (or --lf)", file=sys.stderr)
        return EXIT_INVALID
    if args.keep is not None and args.out is not None:
        print("run: --keep prunes the invocations under the results root; --out names a folder outside it", file=sys.stderr)
        return EXIT_INVALID
    scenarios = scenarios_to_run(paths, args.seed, args.k, args.store)
    if scenarios is None:
        return EXIT_INVALID
    if wanted is not None:
        scenarios = [s for s in scenarios if s.name in wanted]
    if args.grpc_impl is not None:
        scenarios = [s.with_grpc_impl(args.grpc_impl) for s in scenarios]
    resolved: list[dict[str, Any]] = []
    if args.subject is not None and args.subject.get(CLIENT_VERSION_KEY) == LATEST_NIGHTLY:  # asked of the registry, now
        args.subject, r = resolve_subject(args.subject, log=lambda m: print(m, flush=True))
        resolved.append(r.to_json())
        if r.version is None:
            print(f"mxchaos run: refused before starting anything: --subject modelexpress@{LATEST_NIGHTLY}: {r.error}",
                  file=sys.stderr)
            return EXIT_ENV_BROKEN
    if args.subject is not None:
        if CLIENT_VERSION_KEY in args.subject:  # modelexpress@V: that release's env plays (harness.subjects.envs)
            os.environ[ENV_CLIENT_VERSION] = args.subject[CLIENT_VERSION_KEY]
        scenarios = [with_subjects(s, args.subject) for s in scenarios]
    if inventory is not None:  # the machines must be able to play their roles: refused now, not a FAIL per run
        refused = preflight(scenarios, places_for(inventory=inventory, here=False), "mxchaos run --inventory")
        if refused is not None:
            return refused
    if os.environ.get("MXCHAOS_BUILD_SUBJECTS") != "0":  # 0: a missing subject environment is a SKIP

        prepare_subjects(scenarios, log=lambda line: print(line, flush=True))

    repeat = args.repeat
    inv = open_invocation(args.out)
    summary = Path(args.summary) if args.summary else SummaryDoc.in_folder(inv.folder)
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
        rate_table(list(cells.values()), repeat, results=results)
    else:
        verdict_table(results, quiet=args.quiet, verbose=args.verbose)
    write_summary(summary, cells, repeat, resolved)
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
    doc = write_record(inv, results, cells, repeat, args.seed, [mxchaos_command(), *sys.argv[1:]], interrupted, code)
    if record is not None:
        record.update(doc, summary=str(summary.resolve()))
    inv.link_latest()
    if args.keep is not None and inv.root is not None:
        deleted = prune_invocations(inv.root, args.keep, spare=inv.folder)
        freed = sum(size for _, size in deleted) / (1 << 20)
        print(f"--keep {args.keep}: deleted {len(deleted)} older invocation(s) under {_shown(inv.root)} ({freed:.1f} MiB)"
              + (f": {', '.join(p.name for p, _ in deleted)}" if deleted else ""))
    from harness.reports.ci import STEP_SUMMARY, step_summary, write_step_summary

    headline = {EXIT_OK: "passed", EXIT_INTERRUPTED: "interrupted"}.get(code, "failed")  # as the exit code says
    markdown = step_summary(results, inv.folder / "index.html", list(cells.values()) if repeat > 1 else None,
                            title=f"mxchaos run {inv.name}", verdict=headline)
    if write_step_summary(markdown) is not None:
        print(f"step summary: appended to ${STEP_SUMMARY}")
    print(f"summary: {_shown(summary)}")
    print(f"index:   {_shown(inv.folder / 'index.html')}")
    return code


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = sub.add_parser("run", help="validate, then run scenario files; exit 0 only if all pass")
    run.add_argument("paths", nargs="*", metavar="PATH", help="scenario files, folders or names (mxchaos run smoke)")
    run.add_argument("--lf", "--last-failed", dest="lf", action="store_true",
                     help="only the scenarios whose newest run did not pass, from any invocation under the "
                          "results root (a failure stays until a run of it passes); with no PATH, their files")
    run.add_argument("-x", "--exitfirst", action="store_true", help="stop after the first run that does not pass")
    run.add_argument("--maxfail", type=at_least(1, "a number of runs"), metavar="N", help="stop after N runs that do not pass")
    run.add_argument("--json", action="store_true",
                     help="stdout: one JSON document of the invocation (paths relative to its folder); lines go to stderr")
    run.add_argument("--seed", type=int, help="override every scenario's seed")
    run.add_argument("--store", choices=("memory", "redis"), default=None,
                     help="redis: run every scenario's servers on a Redis store (a redis process added where "
                          "the scenario has none; harness.scenario.stores); default: each scenario's own store key")
    run.add_argument("--grpc-impl", choices=("native", "grpcio"), default=None,
                     help="the gRPC of every server mxref plays (its grpc_impl option): native (mxref's default, "
                          "the Rust front) or grpcio (Python's); default: each scenario's own")
    run.add_argument("--subject", type=subjects_arg, default=None, metavar="SUBJECT|ROLE=SUBJECT,...",
                     help="who plays the sources and readers (default: each scenario's subject:, itself mxref); "
                          "modelexpress builds its environment on first use (harness/subjects); modelexpress@VERSION "
                          "a release of the client, modelexpress@latest-nightly its newest pre-release (resolved from "
                          "the registry now, recorded in summary.json); per role: "
                          "server=modelexpress,reader=mxref (roles server, source, reader, client; a ModelExpress "
                          "server runs the real binary on the scenario's Redis store)")
    run.add_argument("--inventory", metavar="FILE|slurm:[JOB]", help="run the scenarios' hosts on this inventory's machines over ssh "
                     "(harness/hosts/inventory.py: binding by bind:, by name, then in order); slurm: the nodes of the SLURM "
                     "job this runs in (or of job JOB; harness/hosts/allocation.py); slurm+srun:[JOB] the same nodes "
                     "reached through srun steps of the job instead of ssh")
    run.add_argument("--out", default=None, metavar="DIR",
                     help="this invocation's folder (default: a new runs/<UTC stamp>/, runs/latest pointing at the newest; "
                          "harness/reports/invocation.py)")
    run.add_argument("--keep", type=at_least(1, "a number of invocations"), metavar="N",
                     help="once this invocation ends, delete all but the newest N invocations under the results root "
                          "(this one counts; only folders of ours: named by their start stamp, holding invocation.json)")
    run.add_argument("-k", metavar="EXPR", help="select scenarios by name: words with and/or/not")
    run.add_argument("--junit", metavar="FILE", help="also write one JUnit XML for all runs")
    run.add_argument("-q", "--quiet", action="store_true",
                     help="only what did not pass: its [i/N] line, the next steps and its checks")
    run.add_argument("-v", "--verbose", action="store_true",
                     help="also the live event stream of each run (steps, faults, process events) and, at the end, "
                          "the check table of every run (by default only of the runs that did not pass)")
    run.add_argument(
        "--repeat",
        type=at_least(1, "a number of runs"),
        default=1,
        metavar="N",
        help="run every scenario N times (seeds seed..seed+N-1) and judge its rate: PASS only at N/N, "
        "FLAKY (fails the run) when it passes sometimes; a known defect XFAIL at >= 1, FIXED? only at "
        "0/N when the 95%% upper bound is below its defect_rate (default: 1)",
    )
    run.add_argument(
        "--summary", metavar="FILE", help="where the run-level summary goes (default: <out>/summary.json)"
    )
    run.set_defaults(fn=cmd_run)
