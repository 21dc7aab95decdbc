"""``latest-nightly``: the newest ModelExpress nightly, resolved from the package registries when a
matrix runs, and recorded with the spelling it was asked by.

Two releases have nightlies: the server, as crate versions ``0.8.0-nightly.YYYYMMDD.gHASH`` of
``modelexpress-server`` (``cargo info`` names the crate's newest version, pre-releases included;
``cargo search`` does not answer through every registry mirror), and the client, as pre-releases
``0.8.0.devYYYYMMDD`` of the ``modelexpress`` Python package (listed only with ``--pre``:
``pip index versions --pre``). ``resolve_server`` and ``resolve_client`` ask the registry once,
bounded, and answer a ``Resolved``: the version, or why there is none (no answer, an answer
without a nightly), never an exception. The matrix writes each into ``matrix.json``
(``resolved``) and names the column by the version, so a later reader knows what "latest" was.
Unit tests give them a fake command runner; nothing here is cached: a nightly moves.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from harness.subjects.cache import CommandRunner, error_line, run_bounded

__all__ = ["LATEST_NIGHTLY", "SERVER_CRATE", "CLIENT_PACKAGE", "Resolved", "client_release_fits", "client_versions_rule",
           "resolve_client", "resolve_latest", "resolve_server"]

LATEST_NIGHTLY = "latest-nightly"  # the spelling, in --mx-server and in --subject modelexpress@...
SERVER_CRATE = "modelexpress-server"
CLIENT_PACKAGE = "modelexpress"
REGISTRY_TIMEOUT_S = 120.0
_CRATE_VERSION = re.compile(r"^version:\s*(\S+)", re.MULTILINE)
_SERVER_NIGHTLY = re.compile(r"^\d+\.\d+\.\d+-nightly\.\d{8}\.g[0-9a-f]+$")
_AVAILABLE = re.compile(r"^Available versions:\s*(.+)$", re.MULTILINE)


@dataclass(frozen=True)
class Resolved:
    """What a spelling resolved to: ``version`` (None: unresolved, ``error`` says why) and the
    command whose answer it read (``registry``)."""

    axis: str  # "--mx-server" or "--subject"
    spelling: str
    version: str | None
    registry: str
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def resolve_server(run: CommandRunner = run_bounded, cargo: str = "cargo") -> Resolved:
    """The newest crate nightly of ``modelexpress-server`` (``cargo info``'s version line)."""
    argv = [cargo, "info", SERVER_CRATE]
    done = run(argv, REGISTRY_TIMEOUT_S)
    asked = " ".join(argv)
    found = _CRATE_VERSION.search(done.stdout or "")
    if done.returncode != 0 or found is None:
        return Resolved("--mx-server", LATEST_NIGHTLY, None, asked,
                        f"the registry did not answer {asked} (exit {done.returncode}: "
                        f"{error_line((done.stderr or '') + (done.stdout or ''))})")
    newest = found.group(1)
    if not _SERVER_NIGHTLY.match(newest):
        return Resolved("--mx-server", LATEST_NIGHTLY, None, asked,
                        f"the newest {SERVER_CRATE} is {newest}, not a nightly (MAJOR.MINOR.PATCH-nightly.DATE.gHASH)")
    return Resolved("--mx-server", LATEST_NIGHTLY, newest, asked)


def resolve_client(run: CommandRunner = run_bounded, python: str = sys.executable) -> Resolved:
    """The newest pre-release of the ``modelexpress`` package (``pip index versions --pre``)."""
    argv = [python, "-m", "pip", "index", "versions", "--pre", "--disable-pip-version-check", CLIENT_PACKAGE]
    done = run(argv, REGISTRY_TIMEOUT_S)
    asked = f"pip index versions --pre {CLIENT_PACKAGE}"
    found = _AVAILABLE.search(done.stdout or "")
    if done.returncode != 0 or found is None:
        return Resolved("--subject", LATEST_NIGHTLY, None, asked,
                        f"the registry did not answer {asked} (exit {done.returncode}: "
                        f"{error_line((done.stderr or '') + (done.stdout or ''))})")
    versions: list[Version] = []
    for text in found.group(1).split(","):
        try:
            versions.append(Version(text.strip()))
        except InvalidVersion:
            continue  # a version pip lists but PEP 440 does not parse is no candidate
    nightlies = [v for v in versions if v.is_prerelease]
    if not nightlies:
        return Resolved("--subject", LATEST_NIGHTLY, None, asked,
                        f"{CLIENT_PACKAGE} has no pre-release on the registry (listed: {found.group(1).strip()[:120]})")
    return Resolved("--subject", LATEST_NIGHTLY, str(max(nightlies)), asked)


def resolve_latest(servers: list[str], subjects: list[str], log: Callable[[str], None], *,
                   server: Callable[[], Resolved] = resolve_server,
                   client: Callable[[], Resolved] = resolve_client) -> tuple[list[str], list[str], list[Resolved]]:
    """``servers`` and ``subjects`` with ``latest-nightly`` replaced by the version the registry
    names (asked once per axis); unresolved, the spelling stays (its column is not installable,
    ``Resolved.error`` says why). Returns both lists and what was resolved."""
    resolved: list[Resolved] = []
    if LATEST_NIGHTLY in servers:
        r = server()
        resolved.append(r)
        log(f"--mx-server {LATEST_NIGHTLY}: " + (r.version or f"not resolved ({r.error})") + f" ({r.registry})")
        if r.version and r.version not in servers:
            servers = [r.version if s == LATEST_NIGHTLY else s for s in servers]
    spelled = f"modelexpress@{LATEST_NIGHTLY}"
    if spelled in subjects:
        r = client()
        resolved.append(r)
        log(f"--subject {spelled}: " + (r.version or f"not resolved ({r.error})") + f" ({r.registry})")
        if r.version and f"modelexpress@{r.version}" not in subjects:
            subjects = [f"modelexpress@{r.version}" if s == spelled else s for s in subjects]
    return servers, subjects, resolved


def client_versions_rule(text: str) -> str | None:
    """Why ``text`` is no ``client_versions`` of a scenario (the ModelExpress client releases it is
    about, as a PEP 440 specifier: ``>=0.8.0.dev0``, ``==0.8.0.dev20261026``), or None when it is one."""
    if not text.strip():
        return "name the client releases, e.g. '>=0.8.0.dev0' (a PEP 440 specifier), or drop the key"
    try:
        spec = SpecifierSet(text)
    except InvalidSpecifier:
        return (f"{text!r} is not a version specifier: write e.g. '>=0.8.0.dev0' (0.8's pre-releases and later) "
                "or '==0.8.0.dev20261026' (PEP 440)")
    if not len(spec):
        return "name the client releases, e.g. '>=0.8.0.dev0' (a PEP 440 specifier), or drop the key"
    return None


def client_release_fits(text: str, version: str) -> bool:
    """Whether the client release ``version`` is one of ``client_versions`` ``text`` (pre-releases
    count: a scenario about 0.8 is played by its nightlies); a version that does not parse is not."""
    try:
        return SpecifierSet(text).contains(Version(version), prereleases=True)
    except (InvalidSpecifier, InvalidVersion):
        return False
