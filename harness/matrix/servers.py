"""The server axis of ``mxchaos matrix`` (``--mx-server mxref,0.7.0,latest-nightly``) and the
client releases of its subject axis (``--subject mxref,modelexpress@latest-nightly``).

Each ``--mx-server`` value is a column set (x the subject and env axes): ``mxref`` plays every
server with mxref's own, a version with the real ModelExpress server of that version
(``cells.Column.subject_arg``: ``--subject server=modelexpress``; ``env_dict``:
``MXCHAOS_MX_SERVER_VERSION``). A ``--subject`` value ``modelexpress@V`` plays the sources and
readers with that release of the client (its own cached env: ``harness.subjects.envs.subject_spec``).
``latest-nightly`` in either is resolved first, from the package registries
(``harness.subjects.releases``): the column is named by the version it resolved to, and
``matrix.json`` records the spelling beside it (``resolved``). ``prepare_servers`` builds each
server version once, before any column runs, by the bootstrap's own path
(``harness.subjects.mx_build``), and ``prepare_clients`` builds each client release's env; one
that does not resolve, build or install is not fatal: its columns are "not installable" with
the reason (``MatrixSpec.unplayable``). Rates, bounds, headlines and the baseline diff are the
matrix's own, per column.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from harness.subjects.mx_build import MXREF_SERVER, ensure_server, parse_server_versions
from harness.subjects.releases import LATEST_NIGHTLY, Resolved, resolve_latest

__all__ = ["prepare_clients", "prepare_servers", "resolve_latest", "server_axis"]


def server_axis(text: str | None) -> list[str]:
    """``--mx-server``'s values (none: ``[]``, each scenario's own servers)."""
    return [] if text is None else parse_server_versions(text)


def prepare_servers(servers: list[str], log: Callable[[str], None], resolved: Sequence[Resolved] = (),
                    **kw: Any) -> dict[str, str | None]:
    """Build (or find cached) every version on the axis; version -> why it cannot play (None: ready)."""
    out: dict[str, str | None] = {}
    for version in servers:
        if version == MXREF_SERVER:
            continue
        if version == LATEST_NIGHTLY:  # did not resolve: nothing to build
            out[version] = next((r.error for r in resolved if r.axis == "--mx-server"), None) or "not resolved"
            continue
        built = ensure_server(version, log, **kw)
        out[version] = built.error
        if built.error:
            log(f"mx-server {version}: {built.error}; its columns are not installable")
        else:
            log(f"mx-server {version}: {built.binary}" + (" (cached)" if built.cached else " (built)"))
    return out


def prepare_clients(subjects: list[str], log: Callable[[str], None], resolved: Sequence[Resolved] = (),
                    ensure: Callable[[str], str | None] | None = None) -> dict[str, str | None]:
    """Build (or find cached) the env of every ``modelexpress@V`` on the subject axis; value -> why
    it cannot play (None: ready). ``ensure``: version -> error (default: ``ensure_subject_env``)."""
    out: dict[str, str | None] = {}
    for value in subjects:
        version = value.partition("@")[2]
        if not version:
            continue
        if version == LATEST_NIGHTLY:
            out[value] = next((r.error for r in resolved if r.axis == "--subject"), None) or "not resolved"
            continue
        out[value] = (ensure or _ensure_client)(version)
        log(f"subject {value}: " + (f"{out[value]}; its columns are not installable" if out[value] else "env ready"))
    return out


def _ensure_client(version: str) -> str | None:
    from harness.subjects import REPO
    from harness.subjects.envs import ensure_subject_env, subject_spec

    return ensure_subject_env(subject_spec("modelexpress", version), REPO, log=lambda m: print(m, flush=True)).error
