"""Build (or find cached) a version of the real ModelExpress server: ``ensure_server``.

One build path: ``.ci/build-mx-server VERSION`` (``cargo install --locked`` into
``<cache>/mx-server/<VERSION>``, bounded, at the lowest priority, one clone at a time), which
``.ci/bootstrap`` runs for the default version; ``mxchaos matrix --mx-server V1,V2`` runs it here
for each server column before any column runs. Never fatal: a version that cannot be built is
a column whose scenarios SKIP naming the capability, with the build's error in the matrix.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.subjects.mx_server import CAPABILITY, server_binary, server_root
from harness.subjects.releases import LATEST_NIGHTLY

__all__ = ["BUILD_SCRIPT", "MXREF_SERVER", "ServerBuild", "ensure_server", "parse_server_versions"]

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / ".ci" / "build-mx-server"
MXREF_SERVER = "mxref"  # in --mx-server: the column whose servers are mxref's own
_VERSION = re.compile(r"\d+\.\d+\.\d+(?:-[0-9A-Za-z.]+)?(?:\+[0-9A-Za-z.]+)?")
BUILD_BOUND_S = 3600  # the script bounds itself (MXCHAOS_MX_SERVER_BUILD_S); this bounds the wait on it


@dataclass(frozen=True)
class ServerBuild:
    version: str
    binary: Path | None
    cached: bool
    error: str | None  # why it cannot play (None: ready)


def parse_server_versions(text: str) -> list[str]:
    """``--mx-server``: comma-separated crate versions (``0.7.0``, ``0.8.0-nightly.20261201.gabc``),
    ``latest-nightly`` (``harness.subjects.releases``) or ``mxref`` (mxref's own server);
    ``ValueError`` naming the part and the rule."""
    parts = [p.strip() for p in text.split(",")]
    if not parts or any(not p for p in parts):
        raise ValueError(f"--mx-server {text!r}: give comma-separated versions (e.g. 0.7.0) or {MXREF_SERVER}")
    for part in parts:
        if part not in (MXREF_SERVER, LATEST_NIGHTLY) and not _VERSION.fullmatch(part):
            raise ValueError(f"--mx-server {text!r}: {part!r} is neither a crate version (MAJOR.MINOR.PATCH[-PRE]), "
                             f"{LATEST_NIGHTLY} (the newest crate nightly, resolved when the matrix runs) nor {MXREF_SERVER}")
    if len(set(parts)) != len(parts):
        raise ValueError(f"--mx-server {text!r}: name each version once")
    return parts


def ensure_server(version: str, log: Callable[[str], None], *,
                  runner: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run) -> ServerBuild:
    """The built server of ``version``: cached when its stamp is there, else built once by
    ``.ci/build-mx-server`` (minutes to tens of minutes cold; the script says so)."""
    binary = server_binary(version)
    if binary is not None:
        return ServerBuild(version, binary, True, None)
    log(f"mx-server {version}: not cached; building it with {BUILD_SCRIPT.name} (cold: tens of minutes)")
    try:
        done = runner([str(BUILD_SCRIPT), version], capture_output=True, text=True, timeout=BUILD_BOUND_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return ServerBuild(version, None, False, f"{CAPABILITY} {version}: the build did not finish ({exc})")
    binary = server_binary(version)
    if done.returncode == 0 and binary is not None:
        return ServerBuild(version, binary, False, None)
    tail = (done.stderr or "").strip().splitlines()[-1:] or [f"exit {done.returncode}"]
    return ServerBuild(version, None, False,
                       f"{CAPABILITY} {version} not built ({tail[0]}; log: {server_root(version) / 'build.log'})")
