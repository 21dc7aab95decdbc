"""The server axis of ``mxchaos matrix``: ``--mx-server mxref,0.7.0,0.8.0-nightly...``.

Each value is a column set (x the subject and env axes): ``mxref`` plays every server with
mxref's own, a version with the real ModelExpress server of that version
(``cells.Column.subject_arg``: ``--subject server=modelexpress``; ``env_dict``:
``MXCHAOS_MX_SERVER_VERSION``). ``prepare_servers`` builds each version once, before any column
runs, by the bootstrap's own path (``harness.subjects.mx_build``); a version that cannot be built
is not fatal: its column's scenarios SKIP naming the capability, as any missing capability.
Rates, bounds, headlines and the baseline diff are the matrix's own, per column.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness.subjects.mx_build import MXREF_SERVER, ensure_server, parse_server_versions

__all__ = ["prepare_servers", "server_axis"]


def server_axis(text: str | None) -> list[str]:
    """``--mx-server``'s values (none: ``[]``, each scenario's own servers)."""
    return [] if text is None else parse_server_versions(text)


def prepare_servers(servers: list[str], log: Callable[[str], None], **kw: Any) -> dict[str, str | None]:
    """Build (or find cached) every version on the axis; version -> why it cannot play (None: ready)."""
    out: dict[str, str | None] = {}
    for version in servers:
        if version == MXREF_SERVER:
            continue
        built = ensure_server(version, log, **kw)
        out[version] = built.error
        if built.error:
            log(f"mx-server {version}: {built.error}; its columns' scenarios will SKIP")
        else:
            log(f"mx-server {version}: {built.binary}" + (" (cached)" if built.cached else " (built)"))
    return out
