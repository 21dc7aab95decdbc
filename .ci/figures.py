"""Code figures of harness/ and mxref/ (generated code left out), for the closing notes of
layout work: late imports (an import inside a function; ``TYPE_CHECKING`` blocks are not
late), each with the first line of the comment that says why it stays; ``Any`` (each use of
the name); the longest functions.

    .venv/bin/python .ci/figures.py [ROOT] [--late] [--longest N]
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

PACKAGES = ("harness", "mxref")
GENERATED = ("mxref/v1", "mxref/mx")


def sources(root: Path) -> list[Path]:
    return [p for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))
            if not any(p.relative_to(root).as_posix().startswith(g + "/") for g in GENERATED)]


def late_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Imports inside a function body (nested classes and functions included)."""
    found: list[ast.Import | ast.ImportFrom] = []

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom) and in_function:
                found.append(child)
            walk(child, in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda))

    walk(tree, False)
    return found


def _why(lines: list[str], at: int) -> str:
    """The comment that says why the import on line ``at`` (0-based) is late: on its own line,
    or on a comment line above its group of imports."""
    if "#" in lines[at]:
        return lines[at].split("#", 1)[1].strip()
    for line in reversed(lines[:at]):
        text = line.strip()
        if text.startswith("#"):
            return text.lstrip("# ")
        if text.startswith(("import ", "from ")) and "#" in text:
            return text.split("#", 1)[1].strip()
        if not text or text.startswith(("import ", "from ")):
            continue
        break
    return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--late", action="store_true", help="list every late import")
    parser.add_argument("--longest", type=int, default=10, metavar="N")
    args = parser.parse_args(argv)
    late: list[str] = []
    anys = 0
    functions: list[tuple[int, str]] = []
    for path in sources(args.root):
        text = path.read_text()
        tree = ast.parse(text)
        where = path.relative_to(args.root).as_posix()
        lines = text.splitlines()
        for node in late_imports(tree):
            names = ", ".join(a.name for a in node.names)
            module = node.module if isinstance(node, ast.ImportFrom) else ""
            why = _why(lines, node.lineno - 1)
            late.append(f"{where}:{node.lineno}: {'from ' + str(module) + ' ' if module else ''}import {names}"
                        + (f"  # {why}" if why else ""))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Name) and node.id == "Any") or (isinstance(node, ast.Attribute) and node.attr == "Any"):
                anys += 1
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None:
                functions.append((node.end_lineno - node.lineno + 1, f"{where}:{node.lineno} {node.name}"))
    print(f"late imports: {len(late)} ({sum(1 for x in late if x.startswith('harness/'))} harness, "
          f"{sum(1 for x in late if x.startswith('mxref/'))} mxref)")
    print(f"Any: {anys}")
    print(f"longest {args.longest} functions:")
    for n, name in sorted(functions, reverse=True)[: args.longest]:
        print(f"  {n:4d} {name}")
    if args.late:
        print("\n".join(late))
    return 0


if __name__ == "__main__":
    sys.exit(main())
