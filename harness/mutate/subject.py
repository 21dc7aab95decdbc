"""A subject's package copied into a scratch folder, with one mutant applied there.

The copy is what the subject's processes import (``pythonpath`` goes first on their
``PYTHONPATH``); the user's tree is only read. A mutant may instead patch the harness's own
fault injection (``INJECT_FOLDERS``: a planted regression of a fault that lands nothing, which
the fault's witness must catch); the harness is then copied too and the run imports it from
the copy (``harness.mutate.runs``). The rest of the harness is the oracle: no mutant patches it. ``git apply`` runs with the scratch folder as its
own top (``GIT_CEILING_DIRECTORIES``), so a scratch folder inside a repository is patched where
it is, never that repository.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["INJECT_FOLDERS", "MUTANT_SUFFIXES", "Mutant", "MutantError", "ScratchSubject", "find_mutants"]

MUTANT_SUFFIXES = (".diff", ".patch")
APPLY_TIMEOUT_S = 30.0
HARNESS = "harness"
# what a mutant of the harness may patch: how faults are injected, never how a run is judged
INJECT_FOLDERS = ("harness/faults/", "harness/hosts/")


class MutantError(ValueError):
    """A mutant that cannot be read or applied (the message names the file and why)."""


@dataclass(frozen=True)
class Mutant:
    name: str  # the file's stem
    path: Path
    summary: str  # the diff's first comment line, when it has one (``# ...`` before the first ``diff``)
    paths: tuple[str, ...] = ()  # the files it patches, from the repository root

    @property
    def package(self) -> str:
        """The package it patches (the first folder of its paths)."""
        return self.paths[0].split("/", 1)[0] if self.paths else ""

    @classmethod
    def read(cls, path: Path) -> Mutant:
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise MutantError(f"{path}: cannot read the mutant: {exc}") from exc
        if "\n+++ " not in f"\n{text}" or "\n--- " not in f"\n{text}":
            raise MutantError(f"{path}: not a unified diff (no ---/+++ file header): write it with git diff")
        head = [line[1:].strip() for line in text.splitlines() if line.startswith("#")][:1]
        paths = tuple(sorted({line[6:].split("\t")[0].strip() for line in text.splitlines()
                              if line.startswith(("--- a/", "+++ b/"))}))
        if len({p.split("/", 1)[0] for p in paths}) > 1:
            raise MutantError(f"{path}: patches {', '.join(paths)}: a mutant patches one package")
        outside = [p for p in paths if p.startswith(f"{HARNESS}/") and not p.startswith(INJECT_FOLDERS)]
        if outside:
            raise MutantError(f"{path}: patches {', '.join(outside)}: a mutant of the harness patches only its fault "
                              f"injection ({', '.join(INJECT_FOLDERS)}); the rest judges the run")
        return cls(path.stem, path, head[0] if head else "", paths)


def find_mutants(folder: Path) -> list[Mutant]:
    """The mutants in ``folder`` (``*.diff``, ``*.patch``), by name; MutantError when there are none."""
    if not folder.is_dir():
        raise MutantError(f"{folder}: not a folder of mutants (git diff files named *.diff or *.patch)")
    found = sorted(p for p in folder.iterdir() if p.suffix in MUTANT_SUFFIXES and p.is_file())
    if not found:
        raise MutantError(f"{folder}: holds no mutant (git diff files named *.diff or *.patch)")
    return [Mutant.read(p) for p in found]


@dataclass
class ScratchSubject:
    """``package`` of ``repo`` copied under ``folder/tree`` (``pythonpath`` is ``folder/tree``), and
    the harness too for a mutant of its fault injection (``runs_harness``)."""

    repo: Path
    package: str
    folder: Path

    @property
    def pythonpath(self) -> Path:
        return self.folder / "tree"

    def prepare(self, mutant: Mutant | None) -> None:
        """A fresh copy of the package, with ``mutant`` applied when given (MutantError if it does not apply)."""
        self.discard()
        self._copy(self.package)
        if mutant is not None:
            if mutant.package == HARNESS and self.package != HARNESS:
                self._copy(HARNESS)
            self._apply(mutant)

    def _copy(self, package: str) -> None:
        source = self.repo / package
        if not (source / "__init__.py").is_file():
            raise MutantError(f"{source}: not a Python package (the subject's package to mutate)")
        shutil.copytree(source, self.pythonpath / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "target"))

    def _apply(self, mutant: Mutant) -> None:
        env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(self.folder.resolve())}
        for check in (True, False):
            argv = ["git", "apply", *(["--check"] if check else []), str(mutant.path.resolve())]
            try:
                done = subprocess.run(argv, cwd=self.pythonpath, env=env, capture_output=True, text=True,
                                      timeout=APPLY_TIMEOUT_S, check=False)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise MutantError(f"{mutant.path}: git apply failed: {exc}") from exc
            if done.returncode != 0:
                raise MutantError(f"{mutant.path}: does not apply to {self.repo / self.package} "
                                  f"(paths must start with {self.package}/, or {' or '.join(INJECT_FOLDERS)}): "
                                  f"{done.stderr.strip()[:400]}")

    def discard(self) -> None:
        shutil.rmtree(self.pythonpath, ignore_errors=True)
