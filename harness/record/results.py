"""Where runs are kept and found again: the results root, each scenario's newest run across
invocations, and the scenarios whose newest run did not pass.

The root is one per checkout, not per working directory: ``$MXCHAOS_RESULTS`` when set, else
``runs/`` beside the harness's own ``pyproject.toml`` (a checkout), else ``runs/`` in the working
directory (an installed harness). Under it, each ``mxchaos run`` invocation has a folder
(``<stamp>/``) holding a folder per scenario (``<scenario>/``) holding its runs
(``<stamp>-<run id>/``, ``latest``). A run folder's name starts with its UTC start stamp, so the
newest of a scenario's runs is the greatest name among every invocation's, whatever ran since.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from harness.errors import HarnessError
from harness.record.saved import INVOCATION, RunInfo, VerdictDoc

__all__ = ["PASSING", "RESULTS_ENV", "FoundRun", "RunNotFound", "command", "failing", "folder_size", "invocation_folders",
           "newest_runs", "prune_invocations", "prune_to_size", "resolve_run", "results_root", "run_folders", "scenario_names",
           "scenario_runs"]

RESULTS_ENV = "MXCHAOS_RESULTS"
PASSING = frozenset({"pass", "xfail", "xpass", "skip"})
"""Verdicts a rerun of failures leaves alone: passed, a known defect as recorded, or skipped."""

_CHECKOUT = Path(__file__).resolve().parents[2]


def command() -> str:
    """How a printed command names the harness so that it runs as printed: ``.venv/bin/mxchaos``
    (from the working folder) when this harness runs from a checkout's ``.venv`` (a README user's
    PATH has no ``mxchaos``), else ``mxchaos`` (an installed harness, on PATH)."""
    venv = _CHECKOUT / ".venv"
    if os.path.abspath(sys.prefix) != os.path.abspath(venv) or not (venv / "bin" / "mxchaos").exists():
        return "mxchaos"
    here = Path.cwd()
    exe = venv / "bin" / "mxchaos"
    return str(exe.relative_to(here)) if exe.is_relative_to(here) else str(exe)


def results_root() -> Path:
    """The folder every invocation without ``--out`` writes under (see the module)."""
    env = os.environ.get(RESULTS_ENV)
    if env:
        return Path(env)
    if (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "harness").is_dir():
        return _CHECKOUT / "runs"
    return Path("runs")


@dataclass(frozen=True)
class FoundRun:
    """One saved run: its scenario, folder, verdict (None: not judged yet, or unreadable) and the
    scenario file it came from (as recorded; "" when unknown)."""

    scenario: str
    folder: Path
    verdict: str | None
    path: str

    @property
    def passed(self) -> bool:
        return self.verdict in PASSING


def run_folders(root: Path) -> Iterator[tuple[str, Path]]:
    """(scenario, run folder) of every run under ``root``, ``latest`` links left out."""
    if not root.is_dir():
        return
    for invocation in root.iterdir():
        if invocation.is_symlink() or not invocation.is_dir() or invocation.name.startswith("."):
            continue
        for scenario in invocation.iterdir():
            if scenario.is_symlink() or not scenario.is_dir():
                continue
            for run in scenario.iterdir():
                if not run.is_symlink() and (run / "scenario.json").is_file():
                    yield scenario.name, run


def _found(scenario: str, folder: Path) -> FoundRun:
    verdict = VerdictDoc.read_or_none(VerdictDoc.in_folder(folder))
    info = RunInfo.read_or_none(RunInfo.in_folder(folder))
    return FoundRun(scenario, folder, verdict.verdict if verdict is not None else None,
                    (info.scenario_path or "") if info is not None else "")


def newest_runs(root: Path) -> dict[str, FoundRun]:
    """Each scenario's newest run under ``root`` (by its folder's start stamp), by name."""
    newest: dict[str, Path] = {}
    for scenario, folder in run_folders(root):
        if scenario not in newest or folder.name > newest[scenario].name:
            newest[scenario] = folder
    return {name: _found(name, folder) for name, folder in sorted(newest.items())}


def scenario_names(root: Path) -> list[str]:
    """Every scenario with a run under ``root``, sorted."""
    return sorted({scenario for scenario, _ in run_folders(root)})


def failing(root: Path) -> dict[str, FoundRun]:
    """The scenarios whose newest run did not pass (a rerun that passes takes one off)."""
    return {name: run for name, run in newest_runs(root).items() if not run.passed}


_STAMP = re.compile(r"^\d{8}T\d{6}Z(-\d+)?$")  # an invocation's folder (harness.reports.invocation)


def invocation_folders(root: Path) -> list[Path]:
    """The finished invocations under ``root``, oldest first: folders directly under it (not
    links) named as an invocation names its folder and holding its ``invocation.json``. Nothing
    else under the root is one: a folder a person put there, one still running, ``latest``."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir()
             if _STAMP.match(p.name) and not p.is_symlink() and p.is_dir() and (p / INVOCATION).is_file()]
    return sorted(found, key=lambda p: (p.name.split("-")[0], int(p.name.split("-")[1]) if "-" in p.name else 1))


def prune_invocations(root: Path, keep: int, spare: Path | None = None) -> list[tuple[Path, int]]:
    """Delete all but the newest ``keep`` (>= 1) invocations under ``root`` (``invocation_folders``:
    only folders of ours), never ``spare`` (the one just written); (folder, bytes freed) per one
    deleted, oldest first."""
    if keep < 1:
        raise ValueError(f"keep {keep}: keep at least the newest invocation")
    folders = invocation_folders(root)
    doomed = [p for p in folders[:-keep] if spare is None or p.resolve() != spare.resolve()]
    deleted = []
    for folder in doomed:
        size = folder_size(folder)
        shutil.rmtree(folder, ignore_errors=True)
        deleted.append((folder, size))
    return deleted


def folder_size(folder: Path) -> int:
    """The bytes of the files under ``folder`` (links not followed)."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink())


def prune_to_size(root: Path, max_bytes: int, spare: Path | None = None,
                  dry_run: bool = False) -> list[tuple[Path, int]]:
    """Delete the oldest invocations under ``root`` (``invocation_folders``: only folders of ours)
    until the rest hold at most ``max_bytes``; the newest one and ``spare`` are never deleted, so
    one invocation larger than the budget stays. (folder, bytes) per one deleted (``dry_run``:
    that would be), oldest first."""
    folders = invocation_folders(root)
    sizes = {p: folder_size(p) for p in folders}
    total = sum(sizes.values())
    deleted = []
    for folder in folders[:-1]:
        if total <= max_bytes:
            break
        if spare is not None and folder.resolve() == spare.resolve():
            continue
        if not dry_run:
            shutil.rmtree(folder, ignore_errors=True)
        deleted.append((folder, sizes[folder]))
        total -= sizes[folder]
    return deleted


def scenario_runs(root: Path, scenario: str) -> list[FoundRun]:
    """Every run of ``scenario`` under ``root``, from any invocation, newest first."""
    folders = [folder for name, folder in run_folders(root) if name == scenario]
    return [_found(scenario, folder) for folder in sorted(folders, key=lambda f: f.name, reverse=True)]


class RunNotFound(HarnessError):
    """A run was asked for by a folder or name that leads to none; the message says what exists."""


def resolve_run(arg: str | Path, root: Path) -> Path:
    """The run folder ``arg`` names: a run folder; a scenario's folder of runs (its ``latest``); or a
    scenario's name (its newest run under ``root``, from any invocation). ``RunNotFound`` otherwise,
    naming the scenarios that have runs."""
    path = Path(arg)
    if (path / "timeline.jsonl").is_file():
        return path.resolve()
    if (path / "latest" / "timeline.jsonl").is_file():
        return (path / "latest").resolve()
    if path.is_dir():
        return path.resolve()  # not a run folder: its reader says which file it lacks
    newest = newest_runs(root)
    if str(arg) in newest:
        return newest[str(arg)].folder.resolve()
    hint = f"; {path.name}'s newest run is {newest[path.name].folder} (give the name {path.name} to use it)" \
        if path.name in newest else ""
    known = ", ".join(sorted(newest)[:12]) + (f" and {len(newest) - 12} more" if len(newest) > 12 else "")
    raise RunNotFound(f"{arg}: no such run folder, and no scenario of that name has a run under {root}{hint} "
                      f"(scenarios with runs: {known or 'none'})")
