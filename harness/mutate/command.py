"""The ``mxchaos mutate`` sub-command.

``mxchaos mutate --mutants DIR [--package mxref] [--repo DIR] [--repeat N] [--out DIR] [-k EXPR]
[--subject S] SCENARIOS...`` runs the scenario selection once with the unmutated subject (the baseline), then
once per mutant (a ``git diff`` of the subject's package, or of the harness's fault injection,
applied to a scratch copy: ``harness.mutate.subject``), rerunning a
scenario ``N`` more times where a mutant killed it only through time bounds or by a failed step
(a process that crashed or an event that never came: maybe the machine, not the mutant); it writes
``mutate.json`` and ``mutate.html`` under ``--out`` (default: ``mutate/`` under the results root,
``runs/mutate``: ``harness.record.results``) and prints one line per mutant. Exit 0: every
mutant was killed by at least ``--min-kills`` scenarios through a check that is not a time bound;
1: one was not (or did not apply); 2: invalid input.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from harness.counts import at_least
from harness.exits import EXIT_FAILED as EXIT_WEAK  # a mutant survived
from harness.exits import EXIT_INVALID, EXIT_OK
from harness.mutate import killmatrix
from harness.mutate.runs import run_selection
from harness.mutate.subject import Mutant, MutantError, ScratchSubject, find_mutants
from harness.record.results import results_root
from harness.record.saved import RunInfo
from harness.subjects.mx_server import parse_subjects

__all__ = ["add_parser", "cmd_mutate", "out_folder"]


def add_parser(sub: Any) -> None:
    """Register ``mutate`` on ``mxchaos``'s sub-parsers."""
    p = sub.add_parser("mutate", help="run scenarios against planted bugs (git diff files of the subject) and "
                       "write a kill matrix: which scenario killed which mutant, by which check")
    p.add_argument("paths", nargs="+", metavar="PATH", help="scenario files or folders")
    p.add_argument("--mutants", required=True, metavar="DIR", help="a folder of mutants: git diff files "
                   "(*.diff, *.patch) of the subject's package, paths from the repository root (mxref/...), or of "
                   "the harness's fault injection (harness/faults/..., harness/hosts/...: the run then imports the "
                   "harness from the mutated copy)")
    p.add_argument("--package", default="mxref", help="the subject's package the mutants patch (default mxref)")
    p.add_argument("--repo", default=str(Path(__file__).resolve().parents[2]), metavar="DIR",
                   help="the repository holding the package, only read (default: this checkout)")
    p.add_argument("-k", metavar="EXPR", help="select scenarios by name, as mxchaos run -k")
    p.add_argument("--only", metavar="NAME,...", help="only these mutants (file stems)")
    p.add_argument("--repeat", type=at_least(0, "a number of reruns"), default=2, metavar="N",
                   help="reruns of a scenario a mutant killed only through time bounds (default 2)")
    p.add_argument("--min-kills", type=at_least(0, "a number of scenarios"), default=2, metavar="N",
                   help="scenarios that must kill each mutant through a check that is no time bound (default 2)")
    p.add_argument("--timeout", type=float, default=1800.0, metavar="S",
                   help="each mxchaos run of the selection is stopped after S seconds (default 1800)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="output folder (default: mutate/ under the results root, runs/mutate as mxchaos run's runs/)")
    p.add_argument("--subject", type=_subject_text, default=None, metavar="SUBJECT|ROLE=SUBJECT,...",
                   help="who plays the sources and readers in every run of the selection, as mxchaos run --subject "
                        "(modelexpress@VERSION: a scenario pinned to a client release, client_versions:)")
    p.set_defaults(fn=cmd_mutate)


def _subject_text(text: str) -> str:
    """``--subject`` checked as ``mxchaos run`` checks it, kept as written for each run's command line."""
    try:
        parse_subjects(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def cmd_mutate(args: argparse.Namespace) -> int:
    if args.timeout <= 0:
        print(f"mxchaos mutate: --timeout {args.timeout:g}: give seconds > 0", file=sys.stderr)
        return EXIT_INVALID
    try:
        mutants = find_mutants(Path(args.mutants))
    except MutantError as exc:
        print(f"mxchaos mutate: {exc}", file=sys.stderr)
        return EXIT_INVALID
    if args.only:
        wanted = {w.strip() for w in args.only.split(",") if w.strip()}
        unknown = wanted - {m.name for m in mutants}
        if unknown:
            print(f"mxchaos mutate: --only names {', '.join(sorted(unknown))}, not in {args.mutants}", file=sys.stderr)
            return EXIT_INVALID
        mutants = [m for m in mutants if m.name in wanted]
    out = out_folder(args.out)
    scratch = ScratchSubject(Path(args.repo).resolve(), args.package, out / "scratch")

    def selection(mutant: Mutant | None, folder: Path, paths: list[str], k: str | None) -> dict[str, Any]:
        scratch.prepare(mutant)
        try:
            return run_selection(scratch.pythonpath, paths, folder, k=k, timeout_s=args.timeout, subject=args.subject)
        finally:
            scratch.discard()

    matrix: dict[str, Any] = {"command": _command_line(args), "package": args.package, "repo": str(scratch.repo),
                              "mutants": []}
    try:
        baseline = selection(None, out / "baseline", list(args.paths), args.k)
    except MutantError as exc:
        print(f"mxchaos mutate: {exc}", file=sys.stderr)
        return EXIT_INVALID
    if not baseline:
        print(f"mxchaos mutate: the baseline ran no scenario (see {out / 'baseline'})", file=sys.stderr)
        return EXIT_INVALID
    matrix["scenarios"] = sorted(baseline)
    matrix["baseline"] = {s: [o.to_json() for o in runs] for s, runs in baseline.items()}
    failing = sorted(s for s, runs in baseline.items() if any(o.killed for o in runs))
    print(f"baseline: {len(baseline) - len(failing)}/{len(baseline)} scenarios pass"
          + (f" ({', '.join(failing)} failed: they judge no mutant)" if failing else ""), flush=True)
    weak = 0
    for mutant in mutants:
        try:
            runs = selection(mutant, out / mutant.name, list(args.paths), args.k)
        except MutantError as exc:
            matrix["mutants"].append(killmatrix.mutant_row(mutant.name, mutant.summary, {}, str(exc)))
            print(f"{mutant.name}: NOT APPLIED: {exc}", flush=True)
            weak += 1
            continue
        for n in range(1, args.repeat + 1):  # kills to confirm: rerun those scenarios alone
            again = [s for s, rs in runs.items() if s not in failing and killmatrix.to_confirm(rs)]
            for name in again:
                more = selection(mutant, out / mutant.name / f"rerun-{n}-{name}", [_path_of(runs[name][0])], None)
                runs[name].extend(more.get(name, []))
        cells = {s: killmatrix.cell(runs.get(s, []), baseline[s]) for s in baseline}
        row = killmatrix.mutant_row(mutant.name, mutant.summary, cells)
        matrix["mutants"].append(row)
        strong = len(row["killed_by"]) >= args.min_kills
        weak += not strong
        print(f"{mutant.name}: {row['verdict'].upper()} by {len(row['killed_by'])} "
              f"({', '.join(row['killed_by']) or 'none'})"
              + (f"; timing only: {', '.join(row['timing_only_by'])}" if row["timing_only_by"] else ""), flush=True)
    js, page = killmatrix.write(out, matrix)
    print(f"kill matrix: {js}\npage:        {page}")
    return EXIT_WEAK if weak else EXIT_OK


def out_folder(given: str | None) -> Path:
    """``--out`` as given, else ``mutate/`` under the results root (where ``mxchaos run`` and
    ``explore`` write without ``--out``), absolute."""
    return (Path(given) if given else results_root() / "mutate").resolve()


def _path_of(outcome: Any) -> str:
    """The scenario file a run was made from (its ``run.json`` says which)."""
    info = RunInfo.read_or_none(RunInfo.in_folder(Path(outcome.run_dir)))
    if info is not None and info.scenario_path:
        return info.scenario_path
    return str(Path(outcome.run_dir) / "scenario.yaml")  # the copy the run folder keeps


def _command_line(args: argparse.Namespace) -> str:
    """The invocation as a shell line (for the matrix's reader to run again)."""
    words = ["mxchaos", "mutate", "--mutants", args.mutants, "--package", args.package, "--repeat", str(args.repeat),
             "--min-kills", str(args.min_kills)]
    words += [w for flag, value in (("-k", args.k), ("--only", args.only)) if value for w in (flag, value)]
    return shlex.join([*words, *args.paths])
