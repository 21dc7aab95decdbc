"""The native extension (``mxref_native``: the metadata server's default gRPC, Rust built by
maturin from ``mxref/native``) for the environments the project does not install itself.

The matrix's per-NIXL environments and the subject environments hold the project's
dependencies, not the project (``harness.subjects.nixl_envs``), so without this they would lack the
default server and every run in them would fail at its first step. The extension is built once
per source: ``source_hash(repo)`` hashes what ``.ci/bootstrap`` hashes for it (``Cargo.toml``,
``Cargo.lock``, ``pyproject.toml``, ``src/*.rs``); ``ensure_wheel`` builds
``<cache>/wheels/mxref_native-<hash>/mxref_native-*.whl`` (``pip wheel``; cargo's target folder
is ``<cache>/native-target``, shared by every build, so a changed source recompiles only what
changed) under a lock, and ``ensure_installed`` installs that wheel into an environment and
imports it there. An environment remembers the hash it got (``STAMP`` inside it): a changed
Rust source reinstalls, without rebuilding the environment (a subject environment is gigabytes
of torch). The wheel is ``abi3`` (``pyo3``'s ``abi3-py311``): one wheel serves every interpreter
from 3.11.

Nothing here raises for a build that cannot happen (no cargo, a compile error): the caller
gets the reason, the last line of what failed, and says the environment is broken.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from harness.subjects.cache import CommandRunner, cache_dir, error_line, locked, run_bounded

__all__ = ["MODULE", "STAMP", "cargo_path", "ensure_installed", "ensure_wheel", "find_wheel", "installed_hash",
           "source_hash", "wheel_dir"]

MODULE = "mxref_native"
STAMP = ".mxchaos-native"  # in an environment: the source hash of the extension installed there
BUILD_TIMEOUT_S = 1800.0  # a cold cargo build on a loaded 2-core machine: a few minutes
INSTALL_TIMEOUT_S = 300.0
SOURCE = Path("mxref") / "native"


def _why(done: subprocess.CompletedProcess[str]) -> str:
    return error_line(f"{done.stdout}\n{done.stderr}")


def source_hash(repo: Path) -> str:
    """The hash of the extension's source in ``repo`` (what ``.ci/bootstrap`` hashes for it)."""
    src = repo / SOURCE
    files = [src / "Cargo.toml", src / "Cargo.lock", src / "pyproject.toml", *sorted((src / "src").glob("*.rs"))]
    h = hashlib.sha256()
    for f in files:
        h.update(f.relative_to(src).as_posix().encode() + b"\0")
        h.update(f.read_bytes() if f.is_file() else b"(absent)")
        h.update(b"\0")
    return h.hexdigest()[:16]


def wheel_dir(digest: str, root: Path | None = None) -> Path:
    return (root or cache_dir()) / "wheels" / f"{MODULE}-{digest}"


def find_wheel(digest: str, root: Path | None = None) -> Path | None:
    """The built wheel for this source hash, when there is one."""
    found = sorted(wheel_dir(digest, root).glob(f"{MODULE}-*.whl"))
    return found[-1] if found else None


def cargo_path() -> str | None:
    """``cargo``: on PATH, else where rustup or the Rust image put it (as ``.ci/bootstrap`` looks)."""
    found = shutil.which("cargo")
    if found:
        return found
    for c in (Path.home() / ".cargo" / "bin" / "cargo", Path("/usr/local/cargo/bin/cargo")):
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    return None


def ensure_wheel(repo: Path, *, root: Path | None = None, run: CommandRunner = run_bounded,
                 log: Callable[[str], None] = lambda _m: None) -> tuple[Path | None, str | None]:
    """(the wheel of ``repo``'s extension source, None), built when not cached; else (None, why)."""
    digest = source_hash(repo)
    base = root or cache_dir()
    with locked(base / "wheels" / f".{MODULE}-{digest}.lock"):
        wheel = find_wheel(digest, base)
        if wheel is not None:
            return wheel, None
        cargo = cargo_path()
        if cargo is None:
            return None, ("no cargo (Rust) to build mxref_native: install Rust (https://rustup.rs), "
                          "or copy a built wheel into " + str(wheel_dir(digest, base)))
        log(f"building the native extension ({MODULE}, source {digest}) into {wheel_dir(digest, base)}")
        started = time.monotonic()
        tmp = Path(tempfile.mkdtemp(prefix=f".{MODULE}-{digest}-", dir=base / "wheels"))
        try:
            done = run(["env", f"PATH={Path(cargo).parent}{os.pathsep}{os.environ.get('PATH', '')}",
                        f"CARGO_TARGET_DIR={base / 'native-target'}",
                        sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
                        "--wheel-dir", str(tmp), str((repo / SOURCE).resolve())], BUILD_TIMEOUT_S)
            built = sorted(tmp.glob(f"{MODULE}-*.whl"))
            if done.returncode != 0 or not built:
                return None, f"building {MODULE} failed (rc {done.returncode}): {_why(done)}"
            final = wheel_dir(digest, base)
            final.mkdir(parents=True, exist_ok=True)
            built[-1].replace(final / built[-1].name)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        log(f"{MODULE} wheel built in {time.monotonic() - started:.0f}s")
        return final / built[-1].name, None


def installed_hash(env_path: Path) -> str | None:
    """The source hash of the extension installed in an environment (None: not installed by us)."""
    try:
        return (env_path / STAMP).read_text().split()[0]
    except (OSError, IndexError):
        return None


def ensure_installed(env_path: Path, repo: Path, *, root: Path | None = None, run: CommandRunner = run_bounded,
                     log: Callable[[str], None] = lambda _m: None) -> str | None:
    """Install ``repo``'s extension into the environment at ``env_path`` unless it already has
    this source's (its stamp), then import it there; None when it is in, else why not. The
    caller holds the environment's lock."""
    digest = source_hash(repo)
    python = str(env_path / "bin" / "python")
    if installed_hash(env_path) == digest:
        return None
    wheel, why = ensure_wheel(repo, root=root, run=run, log=log)
    if wheel is None:
        return why
    done = run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "--force-reinstall",
                str(wheel)], INSTALL_TIMEOUT_S)
    if done.returncode != 0:
        return f"installing {wheel.name} failed (rc {done.returncode}): {_why(done)}"
    done = run([python, "-c", f"import {MODULE}"], INSTALL_TIMEOUT_S)
    if done.returncode != 0:
        return f"{MODULE} installed but does not import (rc {done.returncode}): {_why(done)}"
    (env_path / STAMP).write_text(f"{digest} {wheel.name}\n")
    log(f"{MODULE} (source {digest}) installed in {env_path}")
    return None
