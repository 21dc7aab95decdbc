"""The repository cites only itself.

Scenario ``references:`` lists (shown by ``mxchaos list`` and on every run's report page), code
comments, docstrings and markdown must never point a reader at a file the repository lacks: the
measured facts and the behaviour contract they rest on live in ``docs/``. Three rules:

- every ``docs/<file>.md[#anchor]`` citation names a file in ``docs/`` and, with an anchor, one of
  that file's headings (GitHub's slug of it) or an explicit ``<a id=...>``;
- every relative markdown link ``[text](path)`` in the markdown files resolves inside the
  repository (and its anchor, if any, to a heading of the target);
- nothing cites the material the repository was built from (a notes folder, the seed files, the
  architecture and style proposals, ``shared/``; ``OUTSIDE`` has their patterns): each such
  citation fails with its file:line and the ``docs/`` section that replaces it. The examples below
  spell those names from parts, so this file cites nothing either.

Outside sources a user can reach (``ai-dynamo/modelexpress#491``, URLs, ``issue: ...`` labels)
are fine.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml

REPO = Path(__file__).resolve().parents[4]
ROOTS = ("scenarios", "harness", "mxref", "tests", "docs")
TOP_FILES = ("README.md",)
TEXT_SUFFIXES = {".py", ".pyi", ".yaml", ".yml", ".md", ".rs", ".proto", ".toml", ".txt", ".html", ".css",
                 ".js", ".json", ".sh", ".cfg", ".ini", ".j2"}
SKIP_DIRS = {"target", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", "node_modules", ".venv"}
THIS_FILE = Path(__file__).resolve()

# What an outside citation is replaced by. Each pattern is searched case-sensitively in every line;
# the hint names the docs/ section that says the same in the repository's own words.
OUTSIDE: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(?:notes/)?nixl-faults(?:\.md)?\s*§?\s*2(?!\d)"),
     "docs/nixl-facts.md#sigstop-leaves-a-read-in-proc"),
    (re.compile(r"(?:notes/)?nixl-faults(?:\.md)?\s*§?\s*3(?!\d)"),
     "docs/nixl-facts.md#a-killed-source-ends-a-read-at-once"),
    (re.compile(r"(?:notes/)?nixl-faults(?:\.md)?\s*§?\s*4(?!\d)"),
     "docs/nixl-facts.md#a-departed-reader-leaves-stale-state-on-the-source"),
    (re.compile(r"(?:notes/)?nixl-faults(?:\.md)?\s*§?\s*5(?!\d)"),
     "docs/nixl-facts.md#network-faults (or one of its subsections: #a-dropped-link-stalls-it-does-not-fail,"
     " #link-down, #a-rejected-connection-fails-at-once, #a-reset-of-the-data-socket-aborts-the-source)"),
    (re.compile(r"(?:notes/)?nixl-faults(?:\.md)?\s*§?\s*6(?!\d)"),
     "docs/nixl-facts.md#toxiproxy-on-the-control-plane"),
    (re.compile(r"(?:notes/)?nixl-faults(?:\.md)?\s*§?\s*8(?!\d)"),
     "docs/nixl-facts.md#nixl-151-raises-instead-of-returning-err"),
    (re.compile(r"\bnixl-faults\b"), "docs/nixl-facts.md#<the section it means>"),
    (re.compile(r"\bnixl-perf\b"),
     "docs/nixl-facts.md#chunked-reads-and-the-window-deadline (or #false-stalls-under-cpu-load,"
     " #late-writes-after-a-released-stall, #segment-size-mismatch-aborts-the-source, #throughput-tuning)"),
    (re.compile(r"\bnixl-releases\b"), "docs/nixl-facts.md#releases"),
    (re.compile(r"\bmodelexpress-protocol(?:\.md)?\s*§?\s*2(?!\d)"), "docs/modelexpress-wire.md#the-grpc-api"),
    (re.compile(r"\bmodelexpress-protocol(?:\.md)?\s*§?\s*3(?!\d)"), "docs/contract.md#source-lifecycle"),
    (re.compile(r"\bmodelexpress-protocol(?:\.md)?\s*§?\s*4(?!\d)"), "docs/contract.md#load-strategy"),
    (re.compile(r"\bmodelexpress-(?:protocol\b|server\.md\b)"),  # the crate and binary modelexpress-server are ours to name
     "docs/modelexpress-wire.md or docs/contract.md#source-lifecycle"),
    (re.compile(r"\bfield-incidents\b"), "the incident's public tracker item (ai-dynamo/modelexpress#N)"),
    (re.compile(r"\bnotes/[\w.-]+"), "the docs/ section that states the fact (docs/nixl-facts.md, docs/contract.md)"),
    (re.compile(r"\bseeds?[- ]000\b"), "docs/contract.md#transfer-manager"),
    (re.compile(r"\bseeds?[- ]001\b"), "docs/contract.md#load-strategy"),
    (re.compile(r"\bseeds?[- ]00\d\b"), "docs/contract.md"),
    (re.compile(r"\bARCHITECTURE\.md\b"), "docs/fault-classes.md (fault classes) or the module docstrings"),
    (re.compile(r"\bSTYLE\.md\b"), "state the rule itself, in the repository's words"),
    (re.compile(r"(?<![\w-])shared/|\bshared notes\b"),
     "docs/nixl-facts.md or docs/contract.md (whichever states the fact)"),
)

# a cheap first look: a line none of these words is in cites nothing of the above
MAYBE_OUTSIDE = re.compile(r"notes/|nixl-|modelexpress-|field-incidents|seed|ARCHITECTURE|STYLE|shared")

DOCS_CITATION = re.compile(r"(?<![\w/.-])docs/([\w.-]+\.md)(?:#([\w-]+))?")
MD_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"`+[^`]*`+")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ID = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
FENCE = re.compile(r"^ {0,3}(```|~~~)")


class Finding(NamedTuple):
    where: str  # file:line
    cited: str
    rule: str

    def __str__(self) -> str:
        return f"  {self.where}: {self.cited!r} -> {self.rule}"


def _text_files() -> Iterator[Path]:
    for name in TOP_FILES:
        if (REPO / name).is_file():
            yield REPO / name
    for root in ROOTS:
        base = REPO / root
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            if path.is_file() and path.suffix in TEXT_SUFFIXES and not SKIP_DIRS & set(path.relative_to(REPO).parts):
                yield path


def _markdown_files() -> list[Path]:
    return [p for p in _text_files() if p.suffix == ".md"]


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


@cache
def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8", errors="replace").splitlines()


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: the rendered text, lowercased, punctuation dropped,
    spaces to hyphens (letters, digits, ``_`` and ``-`` are kept)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link renders as its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """Every anchor a markdown file offers: its headings' slugs (repeats numbered ``-1``, ``-2``
    as GitHub does) outside fenced code, and explicit ``<a id=...>``."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    fenced = False
    for line in _lines(path):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        found.update(HTML_ID.findall(line))
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return frozenset(found)


def outside_citations(text: str) -> list[tuple[str, str]]:
    """(the text cited, its replacement) for each outside citation in one line: the first pattern
    that matches a stretch of text wins, so a citation of a fault note's section 2 names that section."""
    if not MAYBE_OUTSIDE.search(text):
        return []
    hits: list[tuple[int, str, str]] = []
    taken: list[tuple[int, int]] = []
    for pattern, rule in OUTSIDE:
        for m in pattern.finditer(text):
            if any(m.start() < end and start < m.end() for start, end in taken):
                continue
            taken.append((m.start(), m.end()))
            hits.append((m.start(), m.group(0), rule))
    return [(cited, rule) for _, cited, rule in sorted(hits)]


def docs_citation_problem(file: str, anchor: str | None) -> str | None:
    target = REPO / "docs" / file
    if not target.is_file():
        return f"docs/{file} does not exist (files there: {', '.join(sorted(p.name for p in (REPO / 'docs').glob('*.md')))})"
    if anchor is not None and anchor not in anchors(target):
        return f"docs/{file} has no heading with the anchor #{anchor} (anchors: {', '.join(sorted(anchors(target)))})"
    return None


def _fail(title: str, findings: list[Finding]) -> None:
    if findings:
        pytest.fail(f"{title} ({len(findings)}):\n" + "\n".join(str(f) for f in findings), pytrace=False)


def test_nothing_cites_material_outside_the_repository() -> None:
    findings = [
        Finding(f"{_rel(path)}:{number}", cited, f"cite {rule}")
        for path in _text_files() if path != THIS_FILE
        for number, line in enumerate(_lines(path), 1)
        for cited, rule in outside_citations(line)
    ]
    _fail("Citations of files the repository lacks; replace each with the docs/ section given "
          "(keep the human-readable parenthetical)", findings)


def test_docs_citations_name_a_file_and_a_heading() -> None:
    findings = [
        Finding(f"{_rel(path)}:{number}", m.group(0), problem)
        for path in _text_files() if path != THIS_FILE  # its own examples of broken citations
        for number, line in enumerate(_lines(path), 1)
        for m in DOCS_CITATION.finditer(line)
        if (problem := docs_citation_problem(m.group(1), m.group(2))) is not None
    ]
    _fail("docs/ citations that do not resolve", findings)


def _link_problem(source: Path, target: str) -> str | None:
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # https:, mailto: ...: outside, and reachable
        return None
    path_part, _, anchor = target.partition("#")
    resolved = (source.parent / path_part).resolve() if path_part else source
    if not resolved.is_relative_to(REPO):
        return "points outside the repository"
    if not resolved.exists():
        return "no such file in the repository"
    if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
        return f"{_rel(resolved)} has no heading with the anchor #{anchor}"
    return None


def test_relative_markdown_links_resolve() -> None:
    findings: list[Finding] = []
    for path in _markdown_files():
        fenced = False
        for number, line in enumerate(_lines(path), 1):
            if FENCE.match(line):
                fenced = not fenced
                continue
            if fenced:
                continue
            for m in MD_LINK.finditer(CODE_SPAN.sub("", line)):
                if (problem := _link_problem(path, m.group(1))) is not None:
                    findings.append(Finding(f"{_rel(path)}:{number}", m.group(1), problem))
    _fail("Markdown links that do not resolve", findings)


def _scenario_files() -> list[Path]:
    return sorted(p for p in (REPO / "scenarios").rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())


def _references(path: Path) -> list[str]:
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    refs = document.get("references", []) if isinstance(document, dict) else []
    return [str(ref) for ref in refs or []]


def test_scenario_references_cite_only_the_repository_or_public_sources() -> None:
    """What ``mxchaos list`` and the report pages show, read as the loader reads it (YAML)."""
    findings: list[Finding] = []
    files = _scenario_files()
    assert files, "no scenario files found"
    for path in files:
        for ref in _references(path):
            where = f"{_rel(path)} references"
            findings += [Finding(where, cited, f"cite {rule}") for cited, rule in outside_citations(ref)]
            for m in DOCS_CITATION.finditer(ref):
                if (problem := docs_citation_problem(m.group(1), m.group(2))) is not None:
                    findings.append(Finding(where, m.group(0), problem))
    _fail("Scenario references that point outside the repository", findings)


# --- the rules themselves ---------------------------------------------------------------------


@pytest.mark.parametrize(("heading", "anchor"), [
    ("SIGSTOP leaves a READ in PROC", "sigstop-leaves-a-read-in-proc"),
    ("NIXL 1.5.1 raises instead of returning ERR", "nixl-151-raises-instead-of-returning-err"),
    ("The `P2pService`: what [it](x.md) serves", "the-p2pservice-what-it-serves"),
    ("REMOTE_DISCONNECT in 5 ms, §5", "remote_disconnect-in-5-ms-5"),
    ("A dropped link stalls, it does not fail", "a-dropped-link-stalls-it-does-not-fail"),
])
def test_slug_is_githubs(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_repeated_headings_are_numbered_and_fenced_ones_ignored(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n## Notes\n```\n## Not a heading\n```\n## Notes\n<a id=\"here\"></a>\n")
    assert anchors(page) == {"title", "notes", "notes-1", "here"}


def _note(name: str) -> str:
    """An outside note's path, spelled from parts (the repository cites no such file itself)."""
    return "notes" + "/" + name + ".md"


_ARCH = "ARCHITECTURE" + ".md"


@pytest.mark.parametrize(("text", "rule"), [
    (f'"{_note("nixl-faults")} §2 (SIGSTOP: PROC forever, no ERR)"', "docs/nixl-facts.md#sigstop-leaves-a-read-in-proc"),
    ('"nixl-faults.md §6 (timeout toxic)"', "docs/nixl-facts.md#toxiproxy-on-the-control-plane"),
    (f"{_note('nixl-faults')} 5l/5o", "docs/nixl-facts.md#network-faults"),
    (f"({_note('nixl-perf')}, ...)", "docs/nixl-facts.md#chunked-reads-and-the-window-deadline"),
    ("[seed-001, seed-000]", "docs/contract.md#load-strategy"),
    ("seed 000", "docs/contract.md#transfer-manager"),
    ("the load flow of seed 001", "docs/contract.md#load-strategy"),
    (f'"{_note("modelexpress-protocol")} §2"', "docs/modelexpress-wire.md#the-grpc-api"),
    ("``../shared/seeds/000``", "docs/nixl-facts.md or docs/contract.md"),
    (f'"{_ARCH} (fault classes on RDMA hosts)"', "docs/fault-classes.md"),
])
def test_outside_citations_are_found_with_their_replacement(text: str, rule: str) -> None:
    hits = outside_citations(text)
    assert hits, text
    assert hits[0][1].startswith(rule)


@pytest.mark.parametrize("text", [
    "ai-dynamo/modelexpress#491", '"issue: trust nothing a peer says"', "--seed 0", "seed: 17",
    "shared by every process", "docs/nixl-facts.md#sigstop-leaves-a-read-in-proc", "test_seed_000_passes",
    'tmp_path / "seed000"',
])
def test_own_and_public_citations_pass(text: str) -> None:
    assert outside_citations(text) == []


def test_every_replacement_named_here_resolves() -> None:
    """The hints this test prints must themselves be citations that resolve."""
    for _, rule in OUTSIDE:
        cited = list(DOCS_CITATION.finditer(rule))
        for m in cited:
            assert docs_citation_problem(m.group(1), m.group(2)) is None, rule
        for extra in re.findall(r"(?<![\w/])#([\w-]+)", rule.partition(" ")[2]):  # "(or #other-section)"
            assert cited and extra in anchors(REPO / "docs" / cited[0].group(1)), (rule, extra)


def test_a_broken_link_and_a_missing_anchor_are_reported(tmp_path: Path) -> None:
    assert _link_problem(REPO / "README.md", "docs/no-such-page.md") == "no such file in the repository"
    assert _link_problem(REPO / "README.md", "https://example.org/x") is None
    assert _link_problem(REPO / "docs" / "contract.md", "../../outside.md") == "points outside the repository"
    problem = docs_citation_problem("nixl-facts.md", "no-such-section")
    assert problem is not None and "no heading" in problem
    assert docs_citation_problem("nixl-facts.md", "sigstop-leaves-a-read-in-proc") is None
