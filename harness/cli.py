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
import difflib
import importlib.util
import json
import os
import platform
import re
import signal
import sys
import textwrap
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path

from harness.doctor import EXIT_ENV_BROKEN
from harness.errors import ScenarioInvalid
from harness.explore import is_template
from harness.scenario import Scenario, load_scenario

__all__ = ["EXIT_CODES", "build_parser", "collect_paths", "files_to_run", "keyword_matcher", "main", "version_line"]

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


def _shown(path: Path | str | None) -> str:
    """A path as a person would type it: relative to the working folder when inside it."""
    if path is None:
        return ""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(p)


def collect_paths(paths: Sequence[str]) -> tuple[list[Path], list[str]]:
    """Scenario files from files and folders (``**/*.yaml``, ``**/*.yml``; in a folder, not the
    exploration templates ``*.explore.yaml``), in a stable order."""
    files: list[Path] = []
    problems: list[str] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(f for f in {*path.rglob("*.yaml"), *path.rglob("*.yml")} if not is_template(f))
            if not found:
                problems.append(f"{raw}: no scenario files (*.yaml) in this folder")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            named, problem = _by_name(raw)
            files += named
            problems += [problem] if problem else []
    unique: dict[Path, None] = {}
    for f in files:
        unique.setdefault(f, None)
    return list(unique), problems


CATALOGUE = Path(__file__).resolve().parents[1] / "scenarios"


def _by_name(raw: str) -> tuple[list[Path], str | None]:
    """A scenario of the catalogue named by its file stem or its ``name:`` (``mxchaos run smoke``),
    else a problem that suggests the closest names."""
    if "/" in raw or raw.endswith((".yaml", ".yml")) or not CATALOGUE.is_dir():
        return [], f"{raw}: no such file or folder"
    # a scenario's name: first; then a file stem, the shallowest first (smoke is scenarios/smoke.yaml,
    # not scenarios/mx_server/smoke.yaml, whose name is mx_server_smoke)
    candidates = sorted((f for f in {*CATALOGUE.rglob("*.yaml"), *CATALOGUE.rglob("*.yml")} if not is_template(f)),
                        key=lambda f: (len(f.parts), f))
    names: dict[str, Path] = {}
    for f in candidates:
        with contextlib.suppress(OSError, ValueError):
            match = re.search(r"^name:\s*['\"]?([\w.-]+)", f.read_text(), re.MULTILINE)
            if match:
                names.setdefault(match.group(1), f)
    for f in candidates:
        names.setdefault(f.stem, f)
    if raw in names:
        return [names[raw]], None
    close = difflib.get_close_matches(raw, list(names), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else f" (`mxchaos list` shows the {len(names)} in {_shown(CATALOGUE)})"
    return [], f"{raw}: no such file or folder, nor a scenario of that name{hint}"


def files_to_run(paths: Sequence[str]) -> list[Path] | None:
    """``collect_paths`` for a command that runs the files: each problem goes to stderr, and
    None (exit 2) when there is one, or no file at all."""
    files, problems = collect_paths(paths)
    for problem in problems:
        print(problem, file=sys.stderr)
    return files if files and not problems else None


_TOKEN = re.compile(r"\s*(\(|\)|[^\s()]+)")


def keyword_matcher(expr: str) -> Callable[[str], bool]:
    """pytest-like ``-k``: words (case-insensitive substrings), ``and``, ``or``, ``not``, parentheses."""
    tokens: list[str] = _TOKEN.findall(expr)
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        if pos >= len(tokens):
            raise ValueError(f"-k {expr!r}: unexpected end of expression")
        pos += 1
        return tokens[pos - 1]

    def parse_or() -> Callable[[str], bool]:
        left = parse_and()
        while peek() == "or":
            take()
            right = parse_and()
            left = (lambda a, b: lambda s: a(s) or b(s))(left, right)
        return left

    def parse_and() -> Callable[[str], bool]:
        left = parse_not()
        while peek() == "and":
            take()
            right = parse_not()
            left = (lambda a, b: lambda s: a(s) and b(s))(left, right)
        return left

    def parse_not() -> Callable[[str], bool]:
        if peek() == "not":
            take()
            inner = parse_not()
            return lambda s: not inner(s)
        return parse_atom()

    def parse_atom() -> Callable[[str], bool]:
        token = take()
        if token == "(":
            inner = parse_or()
            if take() != ")":
                raise ValueError(f"-k {expr!r}: missing ')'")
            return inner
        if token in (")", "and", "or"):
            raise ValueError(f"-k {expr!r}: unexpected {token!r}")
        word = token.lower()
        return lambda s: word in s.lower()

    matcher = parse_or()
    if pos != len(tokens):
        raise ValueError(f"-k {expr!r}: unexpected {tokens[pos]!r}")
    return matcher


def _load_all(files: Sequence[Path], seed: int | None, store: str | None = None) -> tuple[list[Scenario], list[ScenarioInvalid]]:
    scenarios, invalid = [], []
    for file in files:
        try:
            scenarios.append(load_scenario(file, seed=seed, store=store))
        except ScenarioInvalid as exc:
            invalid.append(exc)
    return scenarios, invalid


def scenarios_to_run(paths: Sequence[str], seed: int | None, k: str | None,
                     store: str | None = None) -> list[Scenario] | None:
    """The scenarios of the files a running command was given (``run``, ``nightly``), loaded and
    selected by ``-k``; every problem (a path, an invalid file, a bad or empty ``-k``) goes to
    stderr, and None (exit 2) when there is one: nothing runs unless all are valid."""
    files = files_to_run(paths)
    if files is None:
        return None
    scenarios, invalid = _load_all(files, seed, store)
    for exc in invalid:
        print(exc.render(), file=sys.stderr)
    if invalid:
        print(f"{len(invalid)} invalid scenario file(s); nothing was run", file=sys.stderr)
        return None
    if k:
        try:
            match = keyword_matcher(k)
        except ValueError as exc:
            print(exc, file=sys.stderr)
            return None
        scenarios = [s for s in scenarios if match(f"{s.name} {s.path.stem if s.path else ''}")]
        if not scenarios:
            print(f"-k {k!r} selected no scenario", file=sys.stderr)
            return None
    return scenarios


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
        from harness.inventory import InventoryInvalid, load_inventory

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
                     "(harness/inventory.py: binding by bind:, by name, then in order)")
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
    from harness.lab import add_parser as add_lab_parser

    add_lab_parser(sub)  # mxchaos lab up/down/status: harness/lab.py
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
