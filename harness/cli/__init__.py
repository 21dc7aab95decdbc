"""``mxchaos``: run, check, validate, schema, cleanup, list, open, runs, matrix, nightly, replay, explore, lab, doctor (and ``--version``).

``run --repeat N`` runs each scenario N times and judges its cell by ``harness.record.rates`` (the
rule, the bound, the ``summary.json`` shape); ``run`` always writes that summary
(``--summary FILE``, default ``<out>/summary.json``).

Exit codes (``EXIT_CODES``, also the epilog of ``mxchaos --help``): 0 every scenario passed
(or was xfail / xpass: a ``known_defect`` scenario, or skip: a capability is missing; with
``--repeat``: no cell is FAIL, FLAKY, HANG, ERROR or UNKNOWN); 1 a
check failed or was unknown, a step failed, a run hung or errored, a scenario was FLAKY, ``cleanup`` left a
survivor; 2 invalid input (a scenario file, a path, a run folder, an option); 4 an environment is broken
(``harness.commands.doctor``: ``run --inventory``, ``matrix``, ``nightly`` refuse before starting anything; a cell
whose every run failed before any fault for its environment); 130 the
harness was interrupted (SIGINT/SIGTERM) after healing and tearing down; 141 (128 +
SIGPIPE) standard output was closed early (``mxchaos list | head -1``), quietly.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import sys
import textwrap
from collections.abc import Sequence
from importlib import metadata

from harness.commands.doctor import add_parser as add_doctor_parser
from harness.commands.listing import add_parser as add_listing_parser
from harness.commands.open import add_parser as add_open_parser
from harness.commands.replay import add_parser as add_replay_parser
from harness.commands.run import add_parser as add_run_parser
from harness.commands.run import subjects_arg
from harness.commands.runs import add_parser as add_runs_parser
from harness.commands.saved import add_parser as add_saved_parser
from harness.commands.soak import add_parser as add_soak_parser
from harness.exits import EXIT_BROKEN_PIPE, EXIT_CODES
from harness.explore.command import add_parser as add_explore_parser
from harness.hosts.lab import add_parser as add_lab_parser
from harness.matrix.command import add_parser as add_matrix_parser
from harness.matrix.project_command import add_parser as add_project_parser
from harness.mutate.command import add_parser as add_mutate_parser
from harness.nightly.command import add_parser as add_nightly_parser

__all__ = ["EXIT_CODES", "build_parser", "main", "version_line"]

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

    add_run_parser(sub)  # mxchaos run: harness/commands/run.py
    add_saved_parser(sub)  # mxchaos check, schema, cleanup: harness/commands/saved.py
    add_listing_parser(sub, subjects_arg)  # mxchaos list, validate: harness/commands/listing.py
    add_open_parser(sub)  # mxchaos open: harness/commands/open.py
    add_runs_parser(sub)  # mxchaos runs: harness/commands/runs.py
    add_matrix_parser(sub)  # mxchaos matrix: harness/matrix/command.py
    add_project_parser(sub)  # mxchaos project: harness/matrix/project_command.py
    add_nightly_parser(sub)  # mxchaos nightly: harness/nightly/command.py
    add_replay_parser(sub)  # mxchaos replay: harness/commands/replay.py
    add_explore_parser(sub)  # mxchaos explore: harness/explore/
    add_lab_parser(sub)  # mxchaos lab up/down/status: harness/hosts/lab.py
    add_doctor_parser(sub)  # mxchaos doctor: harness/commands/doctor.py
    add_mutate_parser(sub)  # mxchaos mutate: harness/mutate/
    add_soak_parser(sub)  # mxchaos soak: harness/commands/soak.py, harness/soak/
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

