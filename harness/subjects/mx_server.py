"""The real ModelExpress metadata server as a subject: where its binary is, how a scenario's
``server`` process becomes it, and who plays which role.

``modelexpress-server`` is published as a Rust crate; ``.ci/bootstrap`` builds 0.7.0 once
with ``.ci/build-mx-server`` (``cargo install --locked``, ~20-40 min at the lowest priority, needs
Debian's ``protobuf-compiler``; ``harness.subjects.mx_build`` runs the same script for a matrix's
server columns) into ``<cache>/mx-server/<version>`` (``$MXCHAOS_CACHE_DIR``, default ``~/.cache/mxchaos``),
shared by every clone. ``server_binary`` finds it; without it a scenario with such a server is
a SKIP naming the capability ``modelexpress-server`` (``harness.scenario.capabilities``).

A ``server`` process with ``subject: modelexpress`` runs ``python -m harness.subjects.mx_serverd``
(the same host spawn path, session and run tags as every process), which starts the binary
against the server's ``store`` (a redis process: ModelExpress keeps its records only in Redis or
Kubernetes) and reports it as mxref's server would (``mx_serverd`` says what it observes and
what it cannot). The scenario's timers map to the server's whole-second settings, rounded up
(``ServerTimers``): the run's ``started`` event records both. ``store_timeout`` has no
counterpart and is recorded as not staged.

``parse_subjects`` (and ``harness.scenario.subjects.with_subjects``) read ``mxchaos run --subject``: a bare name plays the
sources and readers (as before); ``server=modelexpress,reader=mxref`` names a subject per role
(``server``, ``source``, ``reader``, ``client`` = sources and readers). A server made
ModelExpress's gets the scenario's Redis store (``harness.scenario.stores.with_store``).
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from harness.subjects.cache import cache_dir
from harness.subjects.releases import LATEST_NIGHTLY

__all__ = [
    "BINARY",
    "CLIENT_VERSION_KEY",
    "CAPABILITY",
    "ROLES",
    "SERVER_SUBJECTS",
    "VERSION",
    "ServerSpec",
    "ServerTimers",
    "TimerOptions",
    "parse_subjects",
    "server_binary",
    "server_of_subject",
    "server_root",
    "server_timers",
    "reported_version",
    "selected_version",
    "server_versions",
    "serverd_argv",
]

VERSION = "0.7.0"
BINARY = "modelexpress-server"
CAPABILITY = "modelexpress-server"
STAMP = ".mxchaos-built"  # written by .ci/bootstrap once the build succeeded
SERVER_SUBJECTS = ("modelexpress",)
ROLES = ("server", "source", "reader", "client")
SUBJECT_NAMES = ("mxref", "modelexpress")
ENV_BINARY = "MXCHAOS_MX_SERVER_BIN"  # a binary built elsewhere (a nightly, a local checkout)
ENV_VERSION = "MXCHAOS_MX_SERVER_VERSION"  # which cached version plays (a matrix server column sets it)


def selected_version() -> str:
    """The ModelExpress server version this process runs (``$MXCHAOS_MX_SERVER_VERSION``, else 0.7.0)."""
    return os.environ.get(ENV_VERSION, "").strip() or VERSION


def server_root(version: str | None = None, root: Path | None = None) -> Path:
    """Where ``cargo install --root`` puts the server of ``version`` (default: ``selected_version``;
    shared by every clone)."""
    return (root or cache_dir()) / "mx-server" / (version or selected_version())


def server_binary(version: str | None = None, root: Path | None = None) -> Path | None:
    """The built ``modelexpress-server`` (``$MXCHAOS_MX_SERVER_BIN`` first), or None. Only a
    build that finished (its stamp) counts: a cut-off build leaves no binary, a rebuild an old one."""
    override = os.environ.get(ENV_BINARY)
    if override:
        path = Path(override)
    else:
        home = server_root(version, root)
        path = home / "bin" / BINARY
        if not (home / STAMP).is_file():
            return None
    return path if path.is_file() and os.access(path, os.X_OK) else None


def reported_version(binary: Path | None) -> str | None:
    """What the binary says it is (``--version``: "modelexpress-server 0.7.0"), bounded; None when
    it cannot say. Recorded beside the version asked for, so a misplaced binary shows."""
    if binary is None:
        return None
    try:
        done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


class TimerOptions(Protocol):
    """A server's timers as a scenario gives them (``ServerOptions``), in seconds."""

    @property
    def heartbeat_timeout(self) -> float | None: ...
    @property
    def reaper_interval(self) -> float | None: ...
    @property
    def gc_timeout(self) -> float | None: ...
    @property
    def store_timeout(self) -> float | None: ...


class ServerSpec(Protocol):
    """A scenario's ``server`` process, as far as its ModelExpress wrapper reads it."""

    @property
    def options(self) -> TimerOptions: ...


def server_of_subject(spec: Any) -> str:
    """Who plays a server process (``mxref`` unless it says ``subject:``)."""
    return getattr(spec, "subject", None) or "mxref"


@dataclass(frozen=True)
class ServerTimers:
    """A scenario's server timers as ModelExpress's whole-second settings (None: its default)."""

    heartbeat_timeout_s: int | None
    reaper_interval_s: int | None
    gc_timeout_s: int | None
    rounded: tuple[str, ...]  # "reaper_interval 250ms -> 1s"
    not_staged: tuple[str, ...]  # options ModelExpress has no setting for

    ENV = (("heartbeat_timeout_s", "MX_HEARTBEAT_TIMEOUT_SECS"), ("reaper_interval_s", "MX_REAPER_SCAN_INTERVAL_SECS"),
           ("gc_timeout_s", "MX_GC_TIMEOUT_SECS"))

    def env(self) -> dict[str, str]:
        return {var: str(getattr(self, field)) for field, var in self.ENV if getattr(self, field) is not None}

    def flags(self) -> list[str]:
        """The wrapper's flags (``--heartbeat-timeout-s 5`` ...), plus what was rounded / not staged."""
        out: list[str] = []
        for field, _var in self.ENV:
            value = getattr(self, field)
            if value is not None:
                out += ["--" + field.replace("_", "-"), str(value)]
        for note in self.rounded:
            out += ["--rounded", note]
        for note in self.not_staged:
            out += ["--not-staged", note]
        return out


def _seconds_text(value: float) -> str:
    return f"{value * 1000:g}ms" if value < 1 else f"{value:g}s"


def server_timers(spec: ServerSpec) -> ServerTimers:
    """``spec``'s timers rounded up to whole seconds (at least 1: a 0 s reaper interval would
    stop ModelExpress's reaper loop from starting)."""
    values: dict[str, int | None] = {}
    rounded: list[str] = []
    for key in ("heartbeat_timeout", "reaper_interval", "gc_timeout"):
        given = getattr(spec.options, key)
        if given is None:
            values[f"{key}_s"] = None
            continue
        whole = max(1, math.ceil(given - 1e-9))
        values[f"{key}_s"] = whole
        if whole != given:
            rounded.append(f"{key} {_seconds_text(given)} -> {whole}s")
    not_staged = []
    if spec.options.store_timeout is not None:
        not_staged.append(f"store_timeout {_seconds_text(spec.options.store_timeout)} (ModelExpress has no such setting)")
    return ServerTimers(values["heartbeat_timeout_s"], values["reaper_interval_s"], values["gc_timeout_s"],
                        tuple(rounded), tuple(not_staged))


def serverd_argv(name: str, spec: ServerSpec, *, events_path: Path, proc_dir: Path, host: str, port: int,
                 store_address: str | None) -> list[str]:
    """The argv of a ``server`` process played by ModelExpress: its wrapper (``mx_serverd``).
    ``ValueError`` naming the process when it has no store, or no binary is built."""
    if store_address is None:
        raise ValueError(f"process {name}: the ModelExpress server keeps its records only in Redis: "
                         f"give it a store (the scenario's `store: redis`, or the server's `store:`)")
    binary = server_binary()
    if binary is None:
        raise ValueError(f"process {name}: {BINARY} {selected_version()} is not built (the capability {CAPABILITY}; "
                         f".ci/build-mx-server builds it into {server_root()})")
    argv = [sys.executable, "-m", "harness.subjects.mx_serverd", "--name", name, "--events", str(events_path),
            "--binary", str(binary), "--version", selected_version(), "--host", host, "--port", str(port),
            "--redis-url", f"redis://{store_address}/0", "--dir", str(proc_dir / f"{name}.mx")]
    return argv + server_timers(spec).flags()


def parse_subjects(text: str) -> dict[str, str]:
    """``--subject``: a bare subject (sources and readers, ``{"client": NAME}``) or
    ``role=NAME[,role=NAME...]``; ``ValueError`` naming the part and the rule."""
    text = text.strip()
    if "=" not in text:
        name, version = _versioned(text, text)
        return {"client": name, **({CLIENT_VERSION_KEY: version} if version else {})}
    out: dict[str, str] = {}
    for part in text.split(","):
        role, sep, subject = (piece.strip() for piece in part.partition("="))
        if not sep or role not in ROLES:
            raise ValueError(f"--subject {text!r}: {part.strip()!r} is not role=subject (roles: {', '.join(ROLES)})")
        name, version = _versioned(text, subject)
        if role in out:
            raise ValueError(f"--subject {text!r}: role {role} is named twice")
        if version and role not in ("client", "source", "reader"):
            raise ValueError(f"--subject {text!r}: {role}={subject}: a client version (@V) is for client, source "
                             "or reader (a server's version: mxchaos matrix --mx-server)")
        if version and out.get(CLIENT_VERSION_KEY, version) != version:
            raise ValueError(f"--subject {text!r}: one client version per run ({out[CLIENT_VERSION_KEY]}, {version})")
        out[role] = name
        if version:
            out[CLIENT_VERSION_KEY] = version
    return out


CLIENT_VERSION_KEY = "client_version"  # parse_subjects' key for modelexpress@VERSION (not a role)
_CLIENT_VERSION = re.compile(r"^\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?$")


def _versioned(text: str, subject: str) -> tuple[str, str | None]:
    """``NAME`` or ``modelexpress@VERSION`` (a release of the client package, e.g. a pre-release
    ``0.8.0.dev20261026``): the subject and its version (None: the pinned one)."""
    name, at, version = subject.partition("@")
    if name not in SUBJECT_NAMES:
        raise ValueError(f"--subject {text!r}: {name!r} is not a subject: expected one of {', '.join(SUBJECT_NAMES)} "
                         f"(modelexpress@VERSION: a release of the client) or role=subject pairs (roles: {', '.join(ROLES)})")
    if not at:
        return name, None
    if name != "modelexpress":
        raise ValueError(f"--subject {text!r}: {subject!r}: only modelexpress has versions (mxref is this repository)")
    if version != LATEST_NIGHTLY and not _CLIENT_VERSION.match(version):
        raise ValueError(f"--subject {text!r}: {version!r} is not a package version (e.g. 0.7.0, 0.8.0.dev20261026, "
                         f"or {LATEST_NIGHTLY}: the newest pre-release, resolved when the command runs)")
    return name, version


def server_versions(sc: Any) -> dict[str, Any]:
    """What played the servers (``versions.json``): ModelExpress's name, version and binary."""
    played = {server_of_subject(spec) for spec in getattr(sc, "processes", {}).values()
              if getattr(spec, "role", "") == "server"}
    out: dict[str, Any] = {}
    for subject in sorted(played):
        if subject == "mxref":
            out[subject] = {"version": "this repository"}
        else:
            binary = server_binary()
            out[subject] = {"package": f"{BINARY} (crates.io)", "version": selected_version(),
                            "binary": str(binary) if binary else None, "reports": reported_version(binary)}
    return out
