"""``mxchaos open [RUN]``: the page to read about a run, printed (and with ``--browser`` opened).

RUN may be nothing (the last invocation's ``index.html``: ``runs/latest``), an invocation's or
a night's folder (its ``index.html``), a run folder (its ``report.html``), a scenario's folder
of runs (its ``latest`` run's page), or a scenario's name (its newest run under the results root,
from whichever invocation ran it last: ``harness.record.results``). Prints the page's path; exit 2
naming what was looked for when there is none.
"""

from __future__ import annotations

import argparse
import sys
import webbrowser
from pathlib import Path
from typing import Any

from harness.exits import EXIT_INVALID, EXIT_OK
from harness.record.results import newest_runs, results_root

__all__ = ["add_parser", "cmd_open", "page_of"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("open", help="print (and with --browser open) the page of a run: the last invocation's index by default")
    p.add_argument("run", nargs="?", metavar="RUN",
                   help="an invocation, night or run folder, or a scenario name: its newest run (default: runs/latest)")
    p.add_argument("--browser", action="store_true", help="also open it in the default web browser")
    p.set_defaults(fn=cmd_open)


def page_of(run: str | None, root: Path) -> tuple[Path | None, list[Path]]:
    """The page for ``run`` (see the module) and every place looked at, in order."""
    if run is None:
        tried = [root / "latest" / "index.html"]
    else:
        folder = Path(run)
        tried = [folder / "index.html", folder / "report.html", folder / "latest" / "report.html"] if folder.is_dir() else []
        newest = newest_runs(root).get(run) if "/" not in run else None
        if newest is not None:
            tried.append(newest.folder / "report.html")
        if folder.is_file() and folder.suffix == ".html":
            tried = [folder]
    for page in tried:
        if page.is_file():
            return page.resolve(), tried
    return None, tried


def cmd_open(args: argparse.Namespace) -> int:
    root = results_root()
    page, tried = page_of(args.run, root)
    if page is None:
        looked = ", ".join(str(p) for p in tried) or f"nothing (not a folder, a page or a scenario with a run under {root})"
        print(f"mxchaos open {args.run or ''}: no page; looked at {looked}".replace("open :", "open:"), file=sys.stderr)
        return EXIT_INVALID
    print(page)
    if args.browser:
        webbrowser.open(page.as_uri())
    return EXIT_OK
