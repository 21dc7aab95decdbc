"""``mxchaos check`` (re-judge saved runs), ``mxchaos schema`` (the scenario JSON Schema) and
``mxchaos cleanup`` (end what crashed runs left): the commands about what is already on disk
or on the machine, not about running scenarios. Exit codes as ``harness.exits.EXIT_CODES``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from harness.commands.cleanup import sweep
from harness.errors import ScenarioInvalid
from harness.exits import EXIT_ENV_BROKEN, EXIT_FAILED, EXIT_INVALID, EXIT_OK
from harness.hosts.allocation import open_inventory
from harness.hosts.inventory import InventoryInvalid
from harness.hosts.slurm import SlurmUnavailable
from harness.hosts.ssh_sweep import sweep_inventory
from harness.machine.statedir import StateDirError
from harness.reports.console import verdict_table
from harness.reports.report import RunFolderError, load_run, rewrite_verdict, saved_verdict
from harness.scenario import scenario_json_schema

__all__ = ["add_parser", "cmd_check", "cmd_cleanup", "cmd_schema"]


def add_parser(sub: Any) -> None:
    """Register ``check``, ``schema`` and ``cleanup``."""
    check = sub.add_parser(
        "check",
        help="re-judge saved runs (timeline.jsonl + scenario.json) with the current checks, also the folder "
        "of a crashed harness (status crashed: an error); exit codes as run",
    )
    check.add_argument(
        "run_dirs", nargs="+", metavar="RUN_DIR", help="run folders, scenarios' folders of runs (their latest), or scenario names (their newest runs)"
    )
    check.add_argument("--write", action="store_true", help="rewrite verdict.json, junit.xml and report.html")
    check.set_defaults(fn=cmd_check)

    schema = sub.add_parser("schema", help="print the scenario JSON Schema")
    schema.add_argument("--out", metavar="FILE")
    schema.set_defaults(fn=cmd_schema)

    cleanup = sub.add_parser("cleanup", help="kill what crashed runs left behind (found by their scope: cgroup, pid ledger, MXCHAOS_RUN_ID)")
    cleanup.add_argument("--run-id", help="this run only (even if its harness is alive)")
    cleanup.add_argument("--all", action="store_true", help="every run, including ones whose harness is alive")
    cleanup.add_argument("--dry-run", action="store_true")
    cleanup.add_argument("--inventory", metavar="FILE|slurm:[JOB]", help="also sweep every machine of this inventory over ssh: "
                         "processes, iptables chains, qdiscs and per-run folders of dead runs (slurm: the nodes of a SLURM job)")
    cleanup.set_defaults(fn=cmd_cleanup)



def cmd_check(args: argparse.Namespace) -> int:
    """Re-judge saved runs with the current checks; write nothing unless ``--write``. The folder
    of a harness that died mid-run is judged on what its timeline recorded: CRASHED, an error."""
    results = []
    bad = False
    for raw in args.run_dirs:
        try:
            result = load_run(raw)
        except ScenarioInvalid as exc:
            print(exc.render(), file=sys.stderr)
            print(f"{raw}: the saved scenario is not valid for this harness; cannot re-judge it", file=sys.stderr)
            bad = True
            continue
        except RunFolderError as exc:
            print(exc, file=sys.stderr)
            bad = True
            continue
        previous = saved_verdict(result.run_dir)
        change = "" if previous in (None, result.verdict) else f" (was {previous.upper()})"
        crashed = " (CRASHED)" if result.status == "crashed" else ""
        print(f"--- {result.scenario.name}: {result.verdict.upper()}{crashed}{change}  {result.run_dir}", flush=True)
        if args.write:
            rewrite_verdict(result, previous)
            print(f"    rewrote verdict.json, junit.xml, report.html in {result.run_dir}")
        results.append(result)
    if results:
        verdict_table(results)
    if bad:
        return EXIT_INVALID
    return EXIT_OK if all(r.ok for r in results) else EXIT_FAILED


def cmd_schema(args: argparse.Namespace) -> int:
    text = json.dumps(scenario_json_schema(), indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        print(text)
    return EXIT_OK


def cmd_cleanup(args: argparse.Namespace) -> int:
    try:
        report = sweep(args.run_id, all_runs=args.all, dry_run=args.dry_run)
    except StateDirError as refused:  # a state directory that is not ours: nothing of it is trusted
        print(f"mxchaos cleanup: {refused}", file=sys.stderr)
        return EXIT_INVALID
    except ValueError as bad:  # a --run-id that cannot name a run
        print(f"mxchaos cleanup: --run-id: {bad}", file=sys.stderr)
        return EXIT_INVALID
    remote_failed = False
    if args.inventory:  # the machines of an inventory too (harness/hosts/ssh_sweep.py)

        try:
            inventory = open_inventory(args.inventory)  # a file, or slurm: (the nodes of a job)
        except InventoryInvalid as bad:
            print(bad, file=sys.stderr)
            return EXIT_INVALID
        except SlurmUnavailable as down:
            print(f"mxchaos cleanup --inventory: {down}", file=sys.stderr)
            return EXIT_ENV_BROKEN
        for machine in sweep_inventory(inventory, run_id=args.run_id, all_runs=args.all, dry_run=args.dry_run):
            for item in machine.removed:
                print(f"{machine.machine}: {item}")
            if machine.error:
                remote_failed = True
                print(f"{machine.machine}: not swept: {machine.error}", file=sys.stderr)
    verb = "would kill" if report.dry_run else "killed"
    for p in report.killed:
        print(f"{verb} pid {p.pid} ({p.proc or '?'}) of run {p.run_id}: {p.cmdline[:100]}")
    for p in report.survivors:
        print(f"still alive: pid {p.pid} ({p.proc or '?'}) of run {p.run_id}", file=sys.stderr)
    for kind, items in report.fault_leftovers.items():
        for item in items:
            print(f"removed {kind} leftover: {item}")
    for rid, items in report.network.items():
        for item in items:
            print(f"{'would delete' if report.dry_run else 'deleted'} {item} of run {rid}")
    for item in report.slurm:
        print(f"{item} (a --slurm dispatcher that is gone)")
    for rid in report.skipped_live_runs:
        print(f"skipped run {rid}: its harness is still running (use --run-id or --all)")
    for rid in report.not_ours:
        print(f"skipped run {rid}: seen only through its cgroup, with no ledger of ours (another state directory's?); "
              "taken as live (use --run-id or --all)")
    for why in report.skipped:
        print(f"skipped a malformed run id: {why}", file=sys.stderr)
    if not report.killed and not report.fault_leftovers and not report.network and not report.slurm:
        print("nothing to clean up" + (f" for run {args.run_id}" if args.run_id else ""))
    return EXIT_FAILED if report.survivors or remote_failed else EXIT_OK


