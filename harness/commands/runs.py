"""``mxchaos runs``: what the results root holds. With no name, its invocations newest first
(when, verdict counts, duration, size, index); given a scenario's name, that scenario's runs
from every invocation, newest first (verdict, seed, page). ``--prune`` with ``--keep N`` and/or
``--max-size SIZE`` deletes the oldest invocations (only folders of ours: named by their start
stamp, holding ``invocation.json``; the newest always stays); ``--dry-run`` says what it would."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from harness.counts import at_least
from harness.exits import EXIT_INVALID, EXIT_OK
from harness.record.results import (
    command,
    folder_size,
    invocation_folders,
    prune_invocations,
    prune_to_size,
    results_root,
    scenario_names,
    scenario_runs,
)
from harness.record.saved import INVOCATION, NightDoc
from harness.scenario.select import shown

__all__ = ["add_parser", "cmd_runs", "parse_size"]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``2G``, ``500M``, ``1.5GiB``, ``800k``, ``1024``: bytes (powers of 1024)."""
    m = _SIZE.match(text)
    if m is None:
        raise argparse.ArgumentTypeError(f"{text!r}: a size is a number with an optional unit k, M, G or T (2G, 500M)")
    return int(float(m.group(1)) * 1024 ** " kmgt".index((m.group(2) or " ").lower()))


def _mib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def _invocations(root: Path) -> int:
    folders = list(reversed(invocation_folders(root)))
    if not folders:
        print(f"no invocation under {shown(root)}")
        return EXIT_OK
    total = 0
    for folder in folders:
        doc = NightDoc.read_or_none(folder / INVOCATION)
        size = folder_size(folder)
        total += size
        data = doc.to_json() if doc is not None else {}
        cells = (data.get("counts") or {}).get("cells") or {}
        tally = ", ".join(f"{n} {cell}" for cell, n in cells.items()) or "unreadable invocation.json"
        seconds = data.get("seconds")
        took = f"{seconds:.0f}s" if isinstance(seconds, int | float) else "?"
        mark = "FAILED" if data.get("passed") is False else "passed" if data.get("passed") else "?"
        print(f"{folder.name:18}  {mark:6}  {tally:34}  {took:>6}  {_mib(size):>10}  {shown(folder / 'index.html')}")
    exe = command()
    print(f"\n{len(folders)} invocation(s) under {shown(root)}, {_mib(total)}; "
          f"`{exe} runs SCENARIO` lists one scenario's runs, `{exe} runs --prune --max-size 2G` trims the oldest")
    return EXIT_OK


def _scenario(root: Path, name: str) -> int:
    runs = scenario_runs(root, name)
    if not runs:
        known = scenario_names(root)
        print(f"runs {name}: no run of that scenario under {shown(root)} (scenarios with runs: "
              f"{', '.join(known[:12]) or 'none'}{' ...' if len(known) > 12 else ''})", file=sys.stderr)
        return EXIT_INVALID
    for run in runs:
        invocation = run.folder.parent.parent.name
        verdict = (run.verdict or "not judged").upper()
        print(f"{run.folder.name:40}  {verdict:10}  invocation {invocation}  {shown(run.folder / 'report.html')}")
    print(f"\n{len(runs)} run(s) of {name}, newest first; `{command()} open {name}` opens the newest")
    return EXIT_OK


def cmd_runs(args: argparse.Namespace) -> int:
    root = results_root()
    if not args.prune:
        if args.keep is not None or args.max_size is not None or args.dry_run:
            print("runs: --keep, --max-size and --dry-run go with --prune", file=sys.stderr)
            return EXIT_INVALID
        return _scenario(root, args.scenario) if args.scenario else _invocations(root)
    if args.scenario:
        print("runs --prune: prunes whole invocations, not one scenario's runs", file=sys.stderr)
        return EXIT_INVALID
    if args.keep is None and args.max_size is None:
        print("runs --prune: give --keep N and/or --max-size SIZE", file=sys.stderr)
        return EXIT_INVALID
    deleted: list[tuple[Path, int]] = []
    if args.keep is not None:
        if args.dry_run:
            deleted += [(p, folder_size(p)) for p in invocation_folders(root)[:-args.keep]]
        else:
            deleted += prune_invocations(root, args.keep)
    if args.max_size is not None:
        gone = {p for p, _ in deleted}
        if args.dry_run:  # the budget over what --keep would leave
            rest = [p for p in invocation_folders(root) if p not in gone]
            total = sum(folder_size(p) for p in rest)
            for p in rest[:-1]:
                if total <= args.max_size:
                    break
                size = folder_size(p)
                deleted.append((p, size))
                total -= size
        else:
            deleted += prune_to_size(root, args.max_size)
    word = "would delete" if args.dry_run else "deleted"
    for p, size in deleted:
        print(f"{word} {shown(p)} ({_mib(size)})")
    left = [p for p in invocation_folders(root) if args.dry_run is False or p not in {q for q, _ in deleted}]
    print(f"{word} {len(deleted)} invocation(s), {_mib(sum(s for _, s in deleted))}; {len(left)} left under {shown(root)}, "
          f"{_mib(sum(folder_size(p) for p in left))}")
    return EXIT_OK


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    runs = sub.add_parser("runs", help="list the invocations under the results root, or one scenario's runs; prune the oldest")
    runs.add_argument("scenario", nargs="?", metavar="SCENARIO", help="a scenario's name: its runs from every invocation")
    runs.add_argument("--prune", action="store_true", help="delete the oldest invocations (the newest always stays)")
    runs.add_argument("--keep", type=at_least(1, "a number of invocations"), metavar="N", help="with --prune: keep the newest N")
    runs.add_argument("--max-size", type=parse_size, metavar="SIZE",
                      help="with --prune: delete the oldest until the rest hold at most SIZE (2G, 500M)")
    runs.add_argument("--dry-run", action="store_true", help="with --prune: say what would be deleted, delete nothing")
    runs.set_defaults(fn=cmd_runs)
