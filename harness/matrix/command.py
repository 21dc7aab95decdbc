"""The ``mxchaos matrix`` sub-command: its options and what it prints.

``mxchaos matrix --nixl 1.3.2,1.4.1,1.5.1 [--subject mxref,modelexpress] [--mx-server mxref,0.7.0] [--env KEY=v1,v2 ...]
[--repeat N] [--out DIR] [--baseline OLD/matrix.json] SCENARIOS...`` (``--nixl``, ``--subject``
or both: without versions the columns run in this environment) validates the scenario files with this harness,
then runs ``harness.matrix.run.run_matrix`` and prints the table (a line per scenario, a
column per NIXL version x subject x env value, each cell its verdict, failures and median times), the headlines and the baseline changes. Exit 0: the
matrix was written, no cell is failing (``cells.FAILING``: error, hang, fail, FLAKY, unknown,
or no run at all) and there is no regression against the baseline (a version that cannot be installed is a column that says
"not installable: <why>", an environment verdict, not a failure); 1: a cell is failing or regressed; 2: invalid input; 4 (``harness.commands.doctor.EXIT_ENV_BROKEN``):
an environment cannot play the roles its scenarios give it (the preflight, ``mxchaos doctor``'s words, before any
cell runs), or a column's every run failed before its first step for an environment reason. Heavy imports happen
when it runs, not when the parser is built.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from harness.counts import at_least
from harness.exits import EXIT_ENV_BROKEN, EXIT_FAILED, EXIT_INVALID, EXIT_OK
from harness.record.saved import MatrixCell, MatrixColumn, MatrixDoc, SavedDocError
from harness.scenario.select import shown

if TYPE_CHECKING:
    from harness.record.cells import Column
    from harness.reports.console import RecapEntry
    from harness.scenario import Scenario

__all__ = ["ColumnProgress", "add_parser", "cmd_matrix", "format_table", "matrix_recap", "rerun_cell", "rerun_folder"]

_RERUN = re.compile(r"rerun(?:-([0-9]+))?")



def add_parser(sub: Any) -> None:
    """Register ``matrix`` on ``mxchaos``'s sub-parsers."""
    p = sub.add_parser(
        "matrix",
        help="run scenarios against several NIXL versions (one cached venv each) and env axes; "
        "write matrix.json and matrix.html",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="scenario files or folders")
    p.add_argument("--nixl", metavar="V1,V2", help="NIXL versions, comma-separated (e.g. 1.4.1,1.5.0,1.5.1; one pip cannot install is a column saying why); "
                   "without it the columns run in this environment")
    p.add_argument("--subject", metavar="S1,S2", help="a subject axis: who plays the sources and readers "
                   "(mxref,modelexpress: the differential table; mxchaos run --subject)")
    p.add_argument("--mx-server", metavar="V1,V2", help="a server axis: who plays the servers (mxref, or "
                   "modelexpress-server versions such as 0.7.0, each built once into the cache by .ci/build-mx-server; "
                   "a version that cannot be built is a column whose scenarios SKIP)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=v1,v2",
                   help="an environment axis: every column runs once per value (repeatable)")
    p.add_argument("--repeat", type=at_least(1, "a number of runs"), default=1, metavar="N", help="runs per cell (default 1)")
    p.add_argument("--out", default="matrix", metavar="DIR", help="output folder (default: matrix)")
    p.add_argument("--baseline", metavar="OLD/matrix.json", help="an earlier matrix.json to compare with")
    p.add_argument("--drop", type=float, default=20.0, metavar="PCT",
                   help="a timing change beyond PCT%% is reported against the baseline (default 20)")
    p.add_argument("--timeout-per-run", type=float, default=300.0, metavar="S",
                   help="each column's runs are bounded by S seconds per run (default 300)")
    p.add_argument("--resume", action="store_true",
                   help="keep every column whose folder under --out already holds all its runs (an interrupted "
                   "matrix: same scenarios and --repeat); run the others")
    p.add_argument("--rebuild-envs", action="store_true",
                   help="rebuild every version's env, also one that failed before with the same inputs")
    p.add_argument("--jobs", type=at_least(1, "a number of lanes"), default=None, metavar="N",
                   help="scenarios of a column side by side, at most N at once (default: two per core of the machine); "
                   "one with tight timing windows or global faults runs alone (harness.matrix.schedule)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="print what each column does as it runs and the full table (timings, READ GB/s, known "
                   "defects); default: an [i/N] line per column, the verdicts and the recap")
    p.add_argument("--no-raw-read", action="store_true", help="skip the raw NIXL READ per column (no read_ratio)")
    p.add_argument("--repo", default=str(Path(__file__).resolve().parents[2]), metavar="DIR",
                   help="the mxchaos source installed into each env (default: this checkout)")
    from harness.commands.slurmopts import add_slurm_options

    add_slurm_options(p)
    p.set_defaults(fn=cmd_matrix)


class ColumnProgress:
    """``[i/N]`` lines, as ``mxchaos run`` and ``nightly`` print them: one as a column starts, one
    as it ends with its cells' verdicts and, in brackets, the tally of the matrix so far."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total = total
        self.stream = stream or sys.stdout
        self.tally: Counter[str] = Counter()

    def started(self, i: int, column: Column) -> None:
        self.stream.write(f"[{i}/{self.total}] {column.label}\n")
        self.stream.flush()

    def ended(self, i: int, column: Column, matrix: MatrixDoc) -> None:
        here = Counter((matrix.cell(sc.name, column.id) or MatrixCell()).verdict.upper() for sc in matrix.scenarios)
        self.tally.update(here)
        col = next((c for c in matrix.columns if c.id == column.id), None)
        why = "" if col is None else f"  {col.error}" if not col.available else f"  {col.run_error}" if col.run_error else ""
        self.stream.write(f"[{i}/{self.total}] {column.id}: {_counts(here)}{why}  [{_counts(self.tally)}]\n")
        self.stream.flush()


def _counts(tally: Counter[str]) -> str:
    return " ".join(f"{n} {word}" for word, n in sorted(tally.items())) or "-"


def matrix_recap(matrix: MatrixDoc, out: Path) -> list[RecapEntry]:
    """The closing recap's entries (``harness.reports.console.write_recap`` writes them): one per
    cell that fails the matrix (``cells.FAILING``), as ``scenario @ column``, how many of its runs
    failed, its first failing run's first failing check and the page of that run."""
    from harness.record.cells import FAILING
    from harness.record.deaths import name_signals
    from harness.record.saved import VerdictDoc
    from harness.reports.console import RecapEntry

    columns = {c.id: c for c in matrix.columns}
    paths = {sc.name: sc.path for sc in matrix.scenarios}
    entries = []
    for name, cid, cell in matrix.all_cells():
        if cell.verdict.lower() not in FAILING:
            continue
        k, n = cell.failed()
        bad = [r for r in cell.runs if r.verdict not in ("pass", "xfail", "xpass", "skip")]
        why, page = cell.error or "no run", ""
        if bad:
            doc = VerdictDoc.read_or_none(VerdictDoc.in_folder(Path(bad[0].run_dir))) if bad[0].run_dir else None
            why = name_signals((doc.first_failing() if doc is not None else None) or f"{bad[0].verdict} (seed {bad[0].seed})")
            link = bad[0].link or bad[0].run_dir
            page = shown(out / link / "report.html") if link else ""
        count = f"failed {'?' if k is None else k}/{'?' if n is None else n}"
        col = columns.get(cid)
        rerun = rerun_cell(col, paths.get(name) or name, matrix.repeat, out) if col is not None else ""
        entries.append(RecapEntry(cell.verdict.upper(), f"{name} @ {cid}", why, page, rerun, count))
    return entries


def rerun_folder(out: Path) -> Path:
    """Where a cell of the matrix written in ``out`` runs again: ``OUT/rerun-1``; a rerun's own
    rerun (``out`` named ``rerun-N``, or ``rerun`` as older matrices named it) is its sibling
    ``rerun-<N+1>``, so reruns of reruns do not nest and none overwrites the one before."""
    again = _RERUN.fullmatch(out.name)
    if again is None:
        return out / "rerun-1"
    return out.parent / f"rerun-{int(again[1] or 0) + 1}"


def rerun_cell(column: MatrixColumn, scenario: str, repeat: int, out: Path) -> str:
    """The command that runs one cell again, as a matrix of one: the column's axes (its NIXL
    version, subject, server and env values), the scenario's file, into ``rerun_folder(out)``."""
    from harness.record.results import command

    served = "MXCHAOS_MX_SERVER_VERSION"  # set by a server column itself (Column.env_dict), not an axis
    axes = [*(["--nixl", column.nixl] if column.nixl else []), *(["--subject", column.subject] if column.subject else []),
            *(["--mx-server", column.mx_server] if column.mx_server else []),
            *(a for k, v in column.env.items() if k != served for a in ("--env", f"{k}={v}"))]
    if not axes:  # a matrix needs an axis: this environment's column is the subject of each scenario's own
        return ""
    argv = [command(), "matrix", *axes, "--repeat", str(repeat), "--out", shown(rerun_folder(out)), shown(Path(scenario))]
    return shlex.join(argv)


def format_table(matrix: MatrixDoc, verbose: bool = True) -> str:
    """The matrix as plain text: a row per scenario, a column per NIXL version (x env); each cell
    its verdict and failed runs, and with ``verbose`` its timings, READ GB/s and known defect."""
    from harness.judge.envbroken import ENV_BROKEN, LABEL
    from harness.record.cells import NOT_INSTALLABLE

    cols = matrix.columns
    header = ["scenario", *[c.id for c in cols]]
    rows = [header, ["(loaded)", *[
        (f"nixl {','.join(c.loaded_nixl or ['?'])} ucx {','.join(c.loaded_ucx or ['?'])}"
         if c.available else (c.error or "not installable")[:100]) for c in cols]]]
    for sc in matrix.scenarios:
        row = [sc.name]
        for c in cols:
            cell = matrix.cell(sc.name, c.id) or MatrixCell()
            text = cell.verdict.upper()
            if cell.verdict == NOT_INSTALLABLE:  # the release itself: its column's (loaded) row says why
                row.append("NOT INSTALLABLE")
                continue
            if cell.verdict == ENV_BROKEN:  # no verdict on NIXL: say why instead
                row.append((cell.error or LABEL)[:100])
                continue
            k, n = cell.failed()
            if n:
                text += f" {k}/{n} failed"
            if not verbose:
                row.append(text)
                continue
            for value, short in ((cell.detection_s, "detect"), (cell.fallback_s, "fallback"), (cell.recovery_s, "recover")):
                if value is not None:
                    text += f" {short} {value:g}s"
            if cell.read_gbps is not None:
                text += f" {cell.read_gbps:g}GB/s"
            if cell.read_ratio is not None:
                text += f" (x{cell.read_ratio:g} raw)"
            d = cell.defect
            if d:
                text += f" [defect {'expected' if d.expected else 'unlisted'}, {d.observed}]"
            row.append(text)
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows)


def _subject_value(text: str) -> bool:
    """A --subject value: a subject, or modelexpress@VERSION / modelexpress@latest-nightly."""
    from harness.subjects.mx_server import parse_subjects

    try:
        parse_subjects(text)
    except ValueError:
        return False
    return True


def read_bytes(sc: Scenario) -> int | None:
    """What a reader of ``sc`` READs: its model's size (a model file's size on disk); None
    without a reader or a model file that is not there."""
    from harness.scenario import ReaderProcess

    if not any(isinstance(p, ReaderProcess) for p in sc.processes.values()):
        return None
    if sc.model.file:
        path = sc.directory / sc.model.file
        return path.stat().st_size if path.is_file() else None
    return int(sc.model.tensors * sc.model.tensor_mib * (1 << 20))


def cmd_matrix(args: argparse.Namespace) -> int:
    from harness.errors import ScenarioInvalid
    from harness.judge.envbroken import ENV_BROKEN
    from harness.matrix.defects import column_defects, defect_info
    from harness.matrix.run import MatrixSpec, run_matrix
    from harness.matrix.schedule import default_jobs, place
    from harness.record.baseline import where
    from harness.record.cells import FAILING, columns_for, parse_env_axis
    from harness.scenario import load_scenario
    from harness.scenario.select import files_to_run
    from harness.subjects.envs import SUBJECTS

    if args.nixl is None and args.subject is None and args.mx_server is None:
        print("give --nixl V1,V2 (versions), --subject S1,S2 (subjects), --mx-server V1,V2 (servers), or several",
              file=sys.stderr)
        return EXIT_INVALID
    from harness.matrix.servers import prepare_clients, prepare_servers, resolve_latest, server_axis

    try:
        servers = server_axis(args.mx_server)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return EXIT_INVALID
    versions = [v.strip() for v in (args.nixl or "").split(",") if v.strip()]
    if args.nixl is not None and (not versions or len(set(versions)) != len(versions)):
        print(f"--nixl {args.nixl!r}: give distinct versions, comma-separated", file=sys.stderr)
        return EXIT_INVALID
    subjects = [v.strip() for v in (args.subject or "").split(",") if v.strip()]
    if args.subject is not None and (not subjects or len(set(subjects)) != len(subjects)
                                     or not all(_subject_value(s) for s in subjects)):
        print(f"--subject {args.subject!r}: give distinct subjects from {', '.join(SUBJECTS)} (modelexpress@VERSION, "
              f"modelexpress@latest-nightly: a release of the client), comma-separated", file=sys.stderr)
        return EXIT_INVALID
    resolved: list[Any] = []
    if "latest-nightly" in servers or "modelexpress@latest-nightly" in subjects:  # asked of the registries, now
        servers, subjects, resolved = resolve_latest(servers, subjects, log=lambda m: print(m, flush=True))
    try:
        axes = [parse_env_axis(text) for text in args.env]
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return EXIT_INVALID
    if len({k for k, _ in axes}) != len(axes):
        print("--env: each variable may be one axis only", file=sys.stderr)
        return EXIT_INVALID
    baseline = None
    if args.baseline:
        try:
            doc = MatrixDoc.read(Path(args.baseline))
        except SavedDocError as exc:
            print(f"--baseline {exc}", file=sys.stderr)
            return EXIT_INVALID
        if doc is None:
            print(f"--baseline {args.baseline}: no such file", file=sys.stderr)
            return EXIT_INVALID
        baseline = doc
    files = files_to_run(args.paths)
    if files is None:
        return EXIT_INVALID
    loaded = []
    for f in files:
        try:
            loaded.append(load_scenario(f))
        except ScenarioInvalid as exc:
            print(exc.render(), file=sys.stderr)
            return EXIT_INVALID
    names = [sc.name for sc in loaded]
    columns = columns_for(versions, axes, subjects, servers)
    cell_defects = {sc.name: column_defects(sc, columns) for sc in loaded}
    # a row's defect: the one in force as the file is played, else the one of its first column that has one
    defects = {sc.name: d for sc in loaded
               if (d := defect_info(sc) or next(iter(cell_defects[sc.name].values()), None))}
    spec = MatrixSpec(
        scenarios=files, names=names, defects=defects, cell_defects=cell_defects,
        read_bytes={sc.name: n for sc in loaded if (n := read_bytes(sc))},
        columns=columns, repeat=args.repeat, out=Path(args.out), repo=Path(args.repo),
        timeout_per_run=args.timeout_per_run, raw_read=not args.no_raw_read, baseline=baseline, drop=args.drop / 100,
        rebuild_envs=args.rebuild_envs, resume=args.resume,
        jobs=args.jobs or default_jobs(), placements=[place(sc) for sc in loaded],
        extra={"resolved": [r.to_json() for r in resolved]} if resolved else {},
    )

    if args.slurm:
        from harness.commands.slurmopts import slurm_options
        from harness.hosts.slurm import SlurmUnavailable

        try:
            spec.slurm = slurm_options(args, "matrix")
        except SlurmUnavailable as exc:  # no controller: nothing is built, written or queued
            print(exc, file=sys.stderr)
            return EXIT_ENV_BROKEN
    # the preflight (mxchaos doctor): every env built and probed; one that cannot play a role its
    # scenarios give it (NIXL or the native server does not import) refuses the matrix before any cell runs
    from harness.commands.doctor import places_for, preflight

    places = places_for(nixl=versions, here=not versions, log=lambda m: print(m, flush=True))
    refused = preflight(loaded, places, "mxchaos matrix")
    if refused is not None:
        return refused
    # never fatal: a version that does not resolve, build or install is a column saying so
    say = lambda m: print(m, flush=True)  # noqa: E731
    unplayable = {**prepare_servers(servers, say, resolved),
                  **prepare_clients(subjects, say, resolved)}
    spec.unplayable = {k: v for k, v in unplayable.items() if v}
    from harness.hosts.slurm import SlurmError

    try:
        progress = ColumnProgress(len(spec.columns))
        matrix = run_matrix(spec, log=say, column_log=say if args.verbose else lambda _m: None,
                            started=progress.started, ended=progress.ended)
    except SlurmError as exc:  # --slurm: the controller stopped answering, or sbatch refused the array
        print(exc, file=sys.stderr)
        return EXIT_ENV_BROKEN
    print(format_table(matrix, verbose=args.verbose))
    for c in matrix.columns:  # an environment verdict, never a failure: the exit code does not count it
        if not c.available:
            print(f"{c.id}: {c.error}")
    for h in matrix.headlines:
        print(f"HEADLINE {h.scenario} @ {h.column}: {h.text}")
    changes = matrix.baseline_changes
    if changes is not None:
        print(f"{len(changes)} change(s) against {args.baseline}")
        for change in changes:
            mark = "REGRESSION" if change.regression else "change"
            print(f"  {mark} {where(change)}: {change.text}")
    from harness.reports.console import write_recap

    write_recap(sys.stdout, matrix_recap(matrix, spec.out), color=sys.stdout.isatty() and not os.environ.get("NO_COLOR"))
    print(f"wrote {shown(MatrixDoc.in_folder(spec.out))} and {shown(spec.out / 'matrix.html')}")
    broken = [f"{name} @ {cid}: {cell.error}" for name, cid, cell in matrix.all_cells() if cell.verdict == ENV_BROKEN]
    if broken:
        print(f"{len(broken)} cell(s) not judged, their environment is broken (mxchaos doctor says more):")
        for line in broken:
            print(f"  {line}")
        return EXIT_ENV_BROKEN
    bad_cell = any(cell.verdict.lower() in FAILING for _, _, cell in matrix.all_cells())
    regressed = any(c.regression for c in changes or [])
    return EXIT_FAILED if bad_cell or regressed else EXIT_OK
