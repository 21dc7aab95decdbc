"""The shape of the house: no import circle among the modules of ``harness`` and ``mxref``,
counting every import (inside functions and under ``TYPE_CHECKING`` too: a late import is
still a dependency); harness's packages on floors (``FLOORS``: a package imports only from the
floors below it, and the top level holds leaves only); no hand-written module grown past what
one reader can hold (~700 lines); mxref's packages layered (the "never" rows); and a step kind
that is registered once is interpreted by the runner."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("harness", "mxref")
MAX_LINES = 700
GENERATED = (ROOT / "mxref" / "v1", ROOT / "mxref" / "mx")  # protoc's output (mxref/codegen.py)

MXREF_COMMON = ("mxref.accelerators", "mxref.codegen", "mxref.config", "mxref.debug_hooks", "mxref.errors",
                "mxref.events", "mxref.front_door", "mxref.identity", "mxref.metrics", "mxref.model", "mxref.pki",
                "mxref.process", "mxref.rpc", "mxref.security", "mxref.signals", "mxref.wire", "mxref.worker_service")
"""What every part of mxref may use; these import none of mxref's packages."""

FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # (floor, its units), bottom first. A unit is a package of harness, or one top-level module.
    ("leaves", ("harness", "harness.errors", "harness.exits", "harness.spec", "harness.locate", "harness.counts",
                "harness.wrapped", "harness.scrape", "harness.toxiproxy", "harness.eventsfile")),
    ("the record", ("harness.record",)),
    ("machine state", ("harness.machine",)),
    ("hosts and subjects", ("harness.hosts", "harness.subjects")),
    ("checks and faults", ("harness.checks", "harness.faults")),
    ("the scenario language", ("harness.scenario",)),
    ("judging", ("harness.judge",)),
    ("reports", ("harness.reports",)),
    ("the soak", ("harness.soak",)),
    ("the engine", ("harness.engine",)),
    ("front ends that run scenarios", ("harness.explore", "harness.mutate")),
    ("commands", ("harness.commands",)),
    ("front ends over many runs", ("harness.matrix", "harness.nightly")),
    ("the command line and the pytest plugin", ("harness.cli",)),
)
"""harness's floors. A unit imports units of lower floors only; on the leaves floor, a leaf may
import another leaf (the circle test keeps them apart). A new top-level module is a leaf: it
imports leaves only; a new package must be given its floor here."""

NEVER: tuple[tuple[str, str, str], ...] = (
    # (importer prefix, imported prefix, why)
    ("mxref", "harness", "mxref runs alone (in subject environments too); the harness drives it from outside"),
    ("mxref.metadata", "mxref.roles", "the metadata server knows sources and readers only by what they send"),
    ("mxref.metadata", "mxref.transfer", "the metadata server moves no bytes"),
    ("mxref.metadata", "mxref.modelexpress", "ModelExpress's service on the server is mxref.metadata.modelexpress"),
    ("mxref.metadata", "mxref.bench", "benchmarks drive the server, not the other way"),
    ("mxref.roles", "mxref.metadata", "a source or reader speaks to the server over gRPC only"),
    ("mxref.transfer", "mxref.roles", "the data path serves both roles and knows neither"),
    ("mxref.transfer", "mxref.metadata", "the data path does not know the control plane"),
    ("mxref.transfer", "mxref.modelexpress", "the data path does not know the control plane"),
    ("mxref.modelexpress", "mxref.metadata", "the ModelExpress pieces outside the server stay outside it"),
    ("mxref.modelexpress", "mxref.roles", "ModelExpress's worker shares the worker service (mxref.worker_service), not a role"),
    *(("harness", package, "the harness drives mxref as processes, reading only its common definitions")
      for package in ("mxref.metadata", "mxref.roles", "mxref.transfer", "mxref.modelexpress", "mxref.bench",
                      "mxref.__main__")),
    ("harness.checks", "harness.scenario", "a scenario's document is built on the check registry; a check reads the run"),
    ("harness.checks", "harness.judge.content", "a check reads the expected values (harness.record.expected), not how they are computed"),
    ("harness.record.rates", "harness.judge.verdict", "the scenario reads rates (defect_rate); rates read a run through a protocol"),
    *(("harness.hosts", module, "a host runs processes and faults' commands; it knows nothing of how a run is judged")
      for module in ("harness.engine.runner", "harness.engine.processes", "harness.engine.nemesis", "harness.checks", "harness.judge.verdict",
                     "harness.reports.report")),
    *((common, package, "a common module imports none of mxref's packages")
      for common in MXREF_COMMON for package in ("mxref.metadata", "mxref.roles", "mxref.transfer",
                                                 "mxref.modelexpress", "mxref.bench", "mxref.__main__")),
)
NEVER_EXCEPT: dict[tuple[str, str], str] = {}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _generated(path: Path) -> bool:
    return any(path.is_relative_to(g) for g in GENERATED)


def _modules() -> dict[str, Path]:
    return {
        _module_name(p): p
        for package in PACKAGES
        for p in (ROOT / package).rglob("*.py")
        if not _generated(p)
    }


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Modules of ours that ``name`` imports anywhere: at module level, inside functions and
    under ``TYPE_CHECKING`` alike."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for sub in ast.walk(tree):
        if isinstance(sub, ast.Import):
            found |= {a.name for a in sub.names}
        elif isinstance(sub, ast.ImportFrom):
            base = sub.module or ""
            if sub.level:
                anchor = package.split(".")[: len(package.split(".")) - (sub.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found |= {f"{base}.{a.name}" for a in sub.names}
    return {m for m in found if m in known and m != name}


@functools.cache
def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle (as a path that returns to its start), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return [*stack[stack.index(dep):], dep]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_cycle_finder_finds_a_planted_circle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a"}}) is None


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The import circles: each strongly connected set of two or more modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in sorted(graph.get(node, ())):
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            group = set()
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.add(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_circle_finders_find_a_planted_circle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a"}}) is None
    assert circles({"a": {"b"}, "b": {"a", "c"}, "c": set(), "d": {"d"}}) == [{"a", "b"}]


def test_a_late_import_counts(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\n"
                      "def f():\n    from b import c\n")
    assert _imports("m", module, {"a", "b", "b.c"}) == {"a", "b", "b.c"}


def test_no_import_circle_in_harness_or_mxref() -> None:
    graph = import_graph()
    assert graph.get("harness.engine.runner") and graph.get("mxref.metadata.main"), "the graph was built"
    found = [" <-> ".join(sorted(group)) for group in circles(graph)]
    assert not found, "import circles: " + "; ".join(found)


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_never() -> None:
    graph = import_graph()
    broken = []
    for importer, imported, why in NEVER:
        assert any(_within(m, importer) for m in graph), f"no module {importer}"
        bad = sorted((m, dep) for m, deps in graph.items() if _within(m, importer)
                     for dep in deps if _within(dep, imported) and (m, dep) not in NEVER_EXCEPT)
        if bad:
            broken.append(f"{importer} imports {imported} ({why}): {bad}")
    assert not broken, "\n".join(broken)


def test_a_never_row_catches_a_planted_import() -> None:
    assert _within("mxref.metadata.store", "mxref.metadata") and not _within("mxref.metadatax", "mxref.metadata")


def unit_of(module: str) -> str | None:
    """The floor unit of a harness module: its package (``harness.record``), or itself at the top level."""
    parts = module.split(".")
    if parts[0] != "harness":
        return None
    return ".".join(parts[:2])


def floor_breaches(graph: dict[str, set[str]], floors: tuple[tuple[str, tuple[str, ...]], ...]) -> list[str]:
    """Every import that does not go down the floors (late imports included, as the graph holds them)."""
    level = {unit: i for i, (_, units) in enumerate(floors) for unit in units}
    name = {i: floor for i, (floor, _) in enumerate(floors)}
    breaches = []
    for module, deps in sorted(graph.items()):
        unit = unit_of(module)
        if unit is None:
            continue
        if unit not in level:
            if module.count(".") == 1 and not graph_is_package(module):  # a new top-level module: a leaf
                bad = sorted(d for d in deps if (u := unit_of(d)) is not None and level.get(u, 1) > 0)
                if bad:
                    breaches.append(f"{module} is at harness's top level, which holds leaves only, and imports {bad}: "
                                    f"put it in the package of its floor")
            else:
                breaches.append(f"{unit} is not in FLOORS: give it its floor")
            continue
        for dep in sorted(deps):
            other = unit_of(dep)
            if other is None or other == unit or other not in level:
                continue
            if level[other] > level[unit] or (level[other] == level[unit] and level[unit] > 0):
                breaches.append(f"{module} ({name[level[unit]]}) imports {dep} ({name[level[other]]}): "
                                f"a package imports only from the floors below it")
    return breaches


def graph_is_package(module: str) -> bool:
    return (ROOT / Path(*module.split("."))).is_dir()


def test_harness_packages_import_only_downward() -> None:
    graph = import_graph()
    units = {u for m in graph if (u := unit_of(m)) is not None}
    listed = {u for _, floor_units in FLOORS for u in floor_units}
    assert listed <= units, f"FLOORS names what is not there: {sorted(listed - units)}"
    breaches = floor_breaches(graph, FLOORS)
    assert not breaches, "\n".join(breaches)


def test_the_floor_check_catches_a_planted_upward_import() -> None:
    floors = (("leaves", ("harness", "harness.errors")), ("low", ("harness.record",)),
              ("high", ("harness.engine", "harness.reports")))
    assert floor_breaches({"harness.record.timeline": {"harness.errors"},
                           "harness.engine.runner": {"harness.record.timeline"}}, floors) == []
    assert floor_breaches({"harness.record.timeline": {"harness.engine.runner"}}, floors) == [
        "harness.record.timeline (low) imports harness.engine.runner (high): a package imports only from the floors below it"]
    assert len(floor_breaches({"harness.engine.runner": {"harness.reports.report"}}, floors)) == 1  # same floor
    assert len(floor_breaches({"harness.newpkg.x": set()}, floors)) == 1  # a package with no floor


def test_readers_of_results_do_not_import_the_runner() -> None:
    graph = import_graph()
    for reader in ("harness.reports.report", "harness.reports.htmlreport", "harness.reports.console", "harness.judge.verdict", "harness.commands.cleanup", "harness.toxiproxy"):
        if reader in graph:
            assert "harness.engine.runner" not in graph[reader], f"{reader} imports the runner"


def test_no_hand_written_module_is_over_700_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for name, p in _modules().items()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert _modules().keys() >= {"mxref.metadata.servicer", "harness.engine.runner"}
    assert not long, f"split these (over {MAX_LINES} lines): {long}"


def test_the_runner_interprets_every_registered_step_kind(tmp_path: Path) -> None:
    from harness.engine.runner import Runner
    from harness.scenario import STEPS, parse_scenario

    sc = parse_scenario("name: s\nprocesses: {server: {role: server}}\nsteps: [{start: server}]\n", "s.yaml")
    runner = Runner(sc, out_dir=tmp_path, install_signal_handlers=False)
    assert runner.handled_steps == frozenset(STEPS.values()), "a step kind without a handler (or a stale handler)"
