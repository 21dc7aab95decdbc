"""One isolated virtual environment per NIXL version, cached between matrix runs.

``ensure_env(version, repo)`` builds ``<cache>/envs/nixl-<V>`` (``$MXCHAOS_CACHE_DIR``,
default ``~/.cache/mxchaos``) with ``venv`` + ``pip``, the way ``.ci/bootstrap`` builds the
project's own ``.venv``: NIXL first (``nixl-cu12==V nixl==V`` with ``--no-deps``: its wheels
require torch, which a CPU machine does not need), then the project's dependencies (not the
project: every command in the env runs the code of the checkout that started it, through
``PYTHONPATH``, so one cached env serves every clone), then what the release's loader needs
beyond that (``harness.subjects.nixl_loader``: torch, for 1.3.x), then ``python -c 'import
nixl._api'``; then, reused or new, the checkout's native extension (``mxref_native``, the
metadata server's default gRPC: ``harness.subjects.native``, one wheel per source hash, reinstalled
when the Rust source changes). A stamp file holds the hash of the inputs (the version, the project's
dependencies, the interpreter, this recipe); an env whose stamp matches is reused as is. A version that cannot be installed or imported is not an exception:
``EnvResult.error`` says why (the last line of pip's or Python's error), and the matrix shows
that column as unavailable; the failure is remembered with the inputs' hash (not retried until
they change, or ``rebuild``: ``mxchaos matrix --rebuild-envs``). Builds of one env are serialised by a lock file.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.subjects.cache import CommandRunner, cache_dir, error_line, locked
from harness.subjects.cache import run_bounded as _run

__all__ = ["EnvResult", "Step", "build_cached_env", "cache_dir", "ensure_env", "env_dir", "error_line", "inputs_hash",
           "install_native", "link_toxiproxy", "locked"]

RECIPE = "mxchaos-matrix-env/3"  # bump when the build steps change: every cached env is rebuilt
STAMP = ".mxchaos-matrix-stamp"
FAILED = ".mxchaos-matrix-failed"  # the inputs' hash and why: a failed build is not retried unless rebuild
PIP_TIMEOUT_S = 900.0
LOADER_TIMEOUT_S = 1800.0  # a release whose loader needs torch: the registry's CUDA torch, a few GB

@dataclass(frozen=True)
class EnvResult:
    """An environment for one NIXL version: ``python`` when usable, else ``error`` says why.
    ``repo``: the checkout whose code it runs (on ``PYTHONPATH``); None: the project is
    installed in it (this project's own environment)."""

    version: str
    path: Path
    error: str | None = None
    cached: bool = False
    repo: Path | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def module(self, name: str) -> list[str]:
        """The argv that runs ``python -m name`` in this env (with ``run_env()`` set)."""
        return [str(self.python), "-m", name]

    def mxchaos(self) -> list[str]:
        return self.module("harness.cli")

    def run_env(self) -> dict[str, str]:
        """What a command in this env needs in its environment: the checkout's code."""
        return {"PYTHONPATH": str(self.repo)} if self.repo is not None else {}


def env_dir(version: str, root: Path | None = None) -> Path:
    return (root or cache_dir()) / "envs" / f"nixl-{version}"


def project_dependencies(repo: Path) -> list[str]:
    """The project's dependencies as ``pyproject.toml`` of ``repo`` lists them."""
    data = tomllib.loads((repo / "pyproject.toml").read_text())
    deps: list[str] = data.get("project", {}).get("dependencies", [])
    return deps


def inputs_hash(version: str, repo: Path, python: str = sys.executable) -> str:
    """What an env is built from; a change in any of these rebuilds it. Not the checkout's
    path or code (runs put it on ``PYTHONPATH``); the interpreter by its real path."""
    h = hashlib.sha256()
    for part in (RECIPE, version, os.path.realpath(python), *project_dependencies(repo)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


Step = tuple[str, list[str], float]  # (what, argv, timeout)


def build_cached_env(
    path: Path,
    want: str,
    label: str,
    steps: list[Step],
    *,
    stamp_name: str,
    failed_suffix: str,
    run: CommandRunner = _run,
    log: Callable[[str], None] = lambda _msg: None,
    rebuild: bool = False,
    building: str = "",
    finish: Callable[[Path], str | None] | None = None,
) -> EnvResult:
    """The cached env at ``path`` built by ``steps`` from inputs hashed as ``want``: reused when
    its stamp matches, else rebuilt from scratch, the steps run in order (each bounded by its
    timeout). A build that failed with the same inputs is not tried again (its reason is
    returned) unless ``rebuild``. Builds of one env are serialised by a lock file beside it;
    the project's toxiproxy server binary is linked in. ``finish``, still under the lock, tops
    up a built or reused env (the native extension: ``harness.subjects.native``) and says why it
    could not (the env is then returned with that error, and not marked failed: it is retried)."""
    stamp, failed = path / stamp_name, path.parent / f"{path.name}{failed_suffix}"
    with locked(path.parent / f".{path.name}.lock"):
        if not rebuild and stamp.is_file() and stamp.read_text().split()[:1] == [want] and (path / "bin" / "python").exists():
            link_toxiproxy(path)
            why = finish(path) if finish is not None else None
            return EnvResult(label, path, error=f"native extension: {why}" if why else None, cached=True)
        if not rebuild and failed.is_file():
            seen, _, why = failed.read_text().partition("\n")
            if seen == want:
                return EnvResult(label, path, error=why.strip(), cached=True)
        failed.unlink(missing_ok=True)
        if path.exists():
            shutil.rmtree(path)
        log(building or f"building the {label} environment in {path}")
        started = time.monotonic()
        for what, argv, timeout in steps:
            done = run(argv, timeout)
            if done.returncode != 0:
                why = error_line(f"{done.stdout}\n{done.stderr}")
                log(f"{label}: {what} step failed: {why}")
                failed.write_text(f"{want}\n{what}: {why}\n")
                return EnvResult(label, path, error=f"{what}: {why}")
        link_toxiproxy(path)
        took = time.monotonic() - started
        stamp.write_text(f"{want} built_in_s={took:.0f}\n")
        log(f"{label}: environment ready in {took:.0f}s")
        why = finish(path) if finish is not None else None
        return EnvResult(label, path, error=f"native extension: {why}" if why else None)


def link_toxiproxy(path: Path) -> None:
    """Link the checkout's ``toxiproxy-server`` (beside this Python) into the env at ``path``, on
    every use, not only at its build: a link left to the checkout that built the env dangles once
    that checkout is gone, and the env's scenarios with proxies would SKIP as "this machine lacks
    toxiproxy" (a matrix column lost 7 of them so). Replaced atomically: another run on the env
    sees the old link or the new one."""
    toxiproxy = Path(sys.prefix) / "bin" / "toxiproxy-server"  # share the project's server binary
    link = path / "bin" / "toxiproxy-server"
    if not toxiproxy.is_file() or link == toxiproxy or (link.is_symlink() and link.resolve() == toxiproxy.resolve()):
        return
    fresh = link.with_name(f".toxiproxy-server.{os.getpid()}")
    fresh.unlink(missing_ok=True)
    fresh.symlink_to(toxiproxy)
    os.replace(fresh, link)


def install_native(repo: Path, root: Path | None, log: Callable[[str], None],
                   run: CommandRunner = _run) -> Callable[[Path], str | None]:
    """``build_cached_env``'s ``finish`` that installs ``repo``'s native extension into the env."""

    def finish(path: Path) -> str | None:
        # late: harness.subjects imports this module (a cycle at import time)
        from harness.subjects.native import ensure_installed

        return ensure_installed(path, repo, root=root, run=run, log=log)

    return finish


def ensure_env(
    version: str,
    repo: Path,
    *,
    root: Path | None = None,
    run: CommandRunner = _run,
    log: Callable[[str], None] = lambda _msg: None,
    rebuild: bool = False,
    native: bool = True,
) -> EnvResult:
    """The env for ``version``: reused when its stamp matches the inputs, else (re)built. A build
    that failed with the same inputs is not tried again (its reason is returned) unless ``rebuild``.
    ``native``: install the checkout's native extension (the default server), built once per
    source hash (``harness.subjects.native``); an env without it is returned with the reason."""
    path = env_dir(version, root)
    py = str(path / "bin" / "python")
    pip = [py, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    steps: list[Step] = [
        ("venv", [sys.executable, "-m", "venv", str(path)], PIP_TIMEOUT_S),
        ("nixl", [*pip, "--no-deps", f"nixl-cu12=={version}", f"nixl=={version}"], PIP_TIMEOUT_S),
        ("project", [*pip, *project_dependencies(repo)], PIP_TIMEOUT_S),
        ("loader", ["env", f"PYTHONPATH={repo.resolve()}", py, "-m", "harness.subjects.nixl_loader", version],
         LOADER_TIMEOUT_S),
        ("import", [py, "-c", "import nixl._api"], PIP_TIMEOUT_S),
    ]
    result = build_cached_env(path, inputs_hash(version, repo), f"NIXL {version}", steps, stamp_name=STAMP,
                              failed_suffix=FAILED, run=run, log=log, rebuild=rebuild,
                              building=f"building env for NIXL {version} in {path}",
                              finish=install_native(repo, root, log, run) if native else None)
    return EnvResult(version, result.path, result.error, result.cached, repo=repo.resolve())
