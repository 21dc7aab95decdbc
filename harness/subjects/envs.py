"""One isolated virtual environment per subject package, built on first use and cached.

The ``modelexpress`` subject runs the real client (``modelexpress==0.7.0``), which needs
torch >= 2.6: the registry's only torch for this machine is the CUDA build (a ~540 MB
wheel plus its NVIDIA libraries, about 3 GB of wheels), so it stays out of the project's
own ``.venv``. ``ensure_subject_env(subject, repo)`` builds ``<cache>/envs/subject-<name>``
(the cache of ``harness.subjects.nixl_envs``: ``$MXCHAOS_CACHE_DIR``, default ``~/.cache/mxchaos``)
the way the matrix builds a per-NIXL env: NIXL (``--no-deps``, as ``.ci/bootstrap``; the cu12
and the cu13 build, because ``nixl`` picks ``nixl_cu13`` under the registry's CUDA 13 torch), this
project's dependencies (not the project itself: the adapter runs from whichever checkout
started it, through ``PYTHONPATH``, so one cached env serves every clone), then the subject's
pinned packages (which bring torch), then an import check that loads the client's NIXL
wrapper; then, built or reused, the checkout's native extension (``harness.subjects.native``:
reinstalled when the Rust source changes, without rebuilding the env). The stamp hashes the recipe, the pins, the interpreter and the project's
``dependencies`` list (not the whole ``pyproject.toml``: a README-only change does not cost
a 3 GB rebuild); a failed build is remembered with that hash and not retried until the
inputs change or ``rebuild``. Builds of one env are serialised by a lock file.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.subjects.cache import CommandRunner, cache_dir, run_bounded
from harness.subjects.nixl_envs import (
    PIP_TIMEOUT_S,
    EnvResult,
    Step,
    build_cached_env,
    install_native,
    project_dependencies,
)

__all__ = ["ENV_CLIENT_VERSION", "NIXL_VERSION", "SUBJECTS", "Subject", "ensure_subject_env", "subject_env_dir", "subject_spec"]

RECIPE = "mxchaos-subject-env/3"  # bump when the build steps change: every cached env is rebuilt
STAMP = ".mxchaos-subject-stamp"
FAILED = ".mxchaos-subject-failed"
NIXL_VERSION = "1.5.1"
BUILD_TIMEOUT_S = 1800.0  # torch and its NVIDIA libraries: ~1 min to download here, a few to install


@dataclass(frozen=True)
class Subject:
    """Who plays the sources and readers, and what its environment holds beyond the project."""

    name: str
    version: str = ""
    requirements: tuple[str, ...] = ()
    import_check: str = ""

    @property
    def needs_env(self) -> bool:
        return bool(self.requirements)


SUBJECTS: dict[str, Subject] = {
    "mxref": Subject("mxref"),
    "modelexpress": Subject(
        "modelexpress",
        version="0.7.0",
        # [metrics]: prometheus-client, for the client's own metrics (the adapter reads them)
        requirements=("modelexpress[metrics]==0.7.0",),
        import_check="import torch, nixl._api, modelexpress.nixl_transfer, modelexpress.load_strategy",
    ),
}


ENV_CLIENT_VERSION = "MXCHAOS_MX_CLIENT_VERSION"  # which modelexpress release plays (mxchaos run --subject modelexpress@V)


def subject_spec(name: str, version: str | None = None) -> Subject:
    """The subject ``name`` as it plays here: ModelExpress's client of ``version`` (default:
    ``$MXCHAOS_MX_CLIENT_VERSION``, else the pinned 0.7.0), in an env of its own
    (``subject-modelexpress-<version>``); mxref as it is."""
    spec = SUBJECTS[name]
    wanted = version or os.environ.get(ENV_CLIENT_VERSION, "").strip()
    if not spec.needs_env or not wanted or wanted == spec.version:
        return spec
    return Subject(spec.name, version=wanted, requirements=(f"modelexpress[metrics]=={wanted}",),
                   import_check=spec.import_check)


def subject_env_dir(subject: Subject, root: Path | None = None) -> Path:
    return (root or cache_dir()) / "envs" / f"subject-{subject.name}-{subject.version}"


def inputs_hash(subject: Subject, repo: Path, python: str = sys.executable) -> str:
    """What a subject env is built from; a change in any of these rebuilds it. The interpreter
    counts by its real path (one venv reached through a symlinked path is the same one)."""
    h = hashlib.sha256()
    parts = [RECIPE, subject.name, subject.version, NIXL_VERSION, *subject.requirements,
             os.path.realpath(python), *project_dependencies(repo)]
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def ensure_subject_env(
    subject: Subject,
    repo: Path,
    *,
    root: Path | None = None,
    run: CommandRunner = run_bounded,
    log: Callable[[str], None] = lambda _msg: None,
    rebuild: bool = False,
) -> EnvResult:
    """The env of ``subject``: reused when its stamp matches the inputs, else (re)built.

    ``EnvResult.version`` is the subject's name and version (``modelexpress==0.7.0``); a
    subject without requirements (``mxref``) needs no env and gets an error saying so.
    """
    label = f"{subject.name}=={subject.version}"
    path = subject_env_dir(subject, root)
    if not subject.needs_env:
        return EnvResult(label, path, error=f"subject {subject.name} runs in the project's own environment")
    py = str(path / "bin" / "python")
    pip = [py, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    steps: list[Step] = [
        ("venv", [sys.executable, "-m", "venv", str(path)], PIP_TIMEOUT_S),
        # both builds: the registry's torch is a CUDA 13 build, and nixl picks nixl_cu13 under it
        ("nixl", [*pip, "--no-deps", f"nixl-cu12=={NIXL_VERSION}", f"nixl-cu13=={NIXL_VERSION}", f"nixl=={NIXL_VERSION}"],
         PIP_TIMEOUT_S),
        # its dependencies, not the project: runs see their own checkout on PYTHONPATH
        ("project", [*pip, *project_dependencies(repo)], PIP_TIMEOUT_S),
        ("subject", [*pip, *subject.requirements], BUILD_TIMEOUT_S),
        ("import", [py, "-c", subject.import_check], PIP_TIMEOUT_S),
    ]
    return build_cached_env(
        path, inputs_hash(subject, repo), label, steps, stamp_name=STAMP, failed_suffix=FAILED, run=run, log=log,
        rebuild=rebuild, building=f"building the {label} environment in {path} (torch and its CUDA libraries: a few GB, minutes)",
        # the checkout's native extension (the default server), installed into it as into a matrix env
        finish=install_native(repo, root, log, run),
    )
