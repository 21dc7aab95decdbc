"""What a NIXL release's loader needs beyond NIXL itself, installed into a matrix env.

``python -m harness.subjects.nixl_loader VERSION`` runs inside a per-version env (built by
``harness.subjects.nixl_envs``) after NIXL and the project. The ``nixl`` package is a thin loader that
picks a backend wheel (``nixl_cu12`` / ``nixl_cu13``). Up to 1.3.x it asks torch which CUDA
it was built for, so ``import nixl._api`` fails without torch, even on a machine with no GPU
(1.4 and later detect CUDA without torch). When the import fails for want of torch, this
installs the registry's torch (the only build offered here is a CUDA one: a few GB) and the
backend wheel of that release for torch's CUDA major (``--no-deps``, as the env's NIXL step),
then imports again. Exit 0 when ``nixl._api`` imports (it prints what it installed, if
anything); otherwise pip's or Python's error and a non-zero exit.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

PIP = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
STEP_TIMEOUT_S = 1500.0  # each child: torch is a few GB (the env step that runs this is bounded too)


def _run(argv: list[str], capture: bool = False) -> subprocess.CompletedProcess[str]:
    """A bounded child; a timeout is exit 124 with a line saying so (pip's own child goes with it)."""
    try:
        return subprocess.run(argv, capture_output=capture, text=True, check=False, timeout=STEP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        print(f"timed out after {STEP_TIMEOUT_S:g}s: {' '.join(argv[:6])}", file=sys.stderr)
        return subprocess.CompletedProcess(argv, 124, "", "")


def missing_module() -> str | None:
    """The module whose absence stops ``import nixl._api`` (None when it imports)."""
    try:
        importlib.import_module("nixl._api")
    except ModuleNotFoundError as exc:
        return exc.name or "?"
    return None


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m harness.subjects.nixl_loader VERSION", file=sys.stderr)
        return 2
    version = argv[0]
    missing = missing_module()
    if missing is None:
        print(f"nixl {version}: imports without extra packages")
        return 0
    if missing != "torch":
        print(f"ModuleNotFoundError: No module named {missing!r} (nixl {version})", file=sys.stderr)
        return 1
    done = _run([*PIP, "torch"])
    if done.returncode != 0:
        return done.returncode
    # a fresh interpreter: this one has a failed import of nixl cached
    probe = "import torch.version as v; print((v.cuda or '').split('.')[0])"
    major = (_run([sys.executable, "-c", probe], capture=True).stdout or "").strip()
    if major:
        done = _run([*PIP, "--no-deps", f"nixl-cu{major}=={version}"])
        if done.returncode != 0:
            return done.returncode
    print(f"nixl {version}: its loader needs torch; installed torch" + (f" and nixl-cu{major}=={version}" if major else ""))
    return _run([sys.executable, "-c", "import nixl._api"]).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
