"""The shape of the house: no import circle among the modules of ``harness`` and ``mxref``,
no harness module grown past what one reader can hold (~700 lines), and a step kind that is
registered once is interpreted by the runner."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("harness", "mxref")
MAX_LINES = 700


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {
        _module_name(p): p
        for package in PACKAGES
        for p in (ROOT / package).rglob("*.py")
        if "v1" not in p.relative_to(ROOT).parts  # generated gRPC code
    }


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Modules of ours that ``name`` imports at module level (not inside functions; not
    under ``TYPE_CHECKING``)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for sub in ast.walk(node) if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) else ():
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


def test_no_import_circle_in_harness_or_mxref() -> None:
    graph = import_graph()
    assert graph.get("harness.runner"), "the graph was built"
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_readers_of_results_do_not_import_the_runner() -> None:
    graph = import_graph()
    for reader in ("harness.report", "harness.htmlreport", "harness.console", "harness.verdict", "harness.cleanup", "harness.toxiproxy"):
        if reader in graph:
            assert "harness.runner" not in graph[reader], f"{reader} imports the runner"


def test_no_harness_module_is_over_700_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in (ROOT / "harness").rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"split these (over {MAX_LINES} lines): {long}"


def test_the_runner_interprets_every_registered_step_kind(tmp_path: Path) -> None:
    from harness.runner import Runner
    from harness.scenario import STEPS, parse_scenario

    sc = parse_scenario("name: s\nprocesses: {server: {role: server}}\nsteps: [{start: server}]\n", "s.yaml")
    runner = Runner(sc, out_dir=tmp_path, install_signal_handlers=False)
    assert runner.handled_steps == frozenset(STEPS.values()), "a step kind without a handler (or a stale handler)"
