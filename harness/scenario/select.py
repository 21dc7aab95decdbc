"""Which scenarios a command means: files and folders, catalogue names (``mxchaos run smoke``),
``-k`` expressions, and loading them with every problem reported. Shared by ``run``, ``list``,
``validate``, ``matrix``, ``nightly`` and ``doctor``."""

from __future__ import annotations

import contextlib
import difflib
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from harness.errors import ScenarioInvalid
from harness.scenario import Scenario, load_scenario

__all__ = ["CATALOGUE", "TEMPLATE_SUFFIXES", "collect_paths", "files_to_run", "is_template", "keyword_matcher", "load_all", "scenarios_to_run", "shown"]


# An exploration template (``harness.explore``) is named *.explore.yaml, so that a folder of scenarios
# given to ``mxchaos run`` / ``validate`` / pytest skips it (it is no ordinary scenario: its
# ``explore`` key is refused there).
TEMPLATE_SUFFIXES = (".explore.yaml", ".explore.yml")


def is_template(path: Path) -> bool:
    """Whether ``path`` is named as an exploration template (``*.explore.yaml``)."""
    return path.name.endswith(TEMPLATE_SUFFIXES)


def shown(path: Path | str | None) -> str:
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


CATALOGUE = Path(__file__).resolve().parents[2] / "scenarios"


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
    stems = {f.stem: f for f in reversed(candidates)}  # the shallowest wins
    found = names.get(raw) or stems.get(raw)
    if found is not None:
        return [found], None
    # suggested and counted: the names `mxchaos list` shows (a file stem still runs, unsuggested)
    close = difflib.get_close_matches(raw, list(names), n=3, cutoff=0.5) or sorted(n for n in names if raw in n)[:3]
    count = len(set(names.values()))
    hint = f"; did you mean {', '.join(close)}?" if close else f" (`mxchaos list` shows the {count} in {shown(CATALOGUE)})"
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


def load_all(files: Sequence[Path], seed: int | None, store: str | None = None) -> tuple[list[Scenario], list[ScenarioInvalid]]:
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
    scenarios, invalid = load_all(files, seed, store)
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
