"""What ran: the versions of NIXL, UCX, torch, Python and this package, and the host, read once
per process. Apart from the report so the invocation record and the nightly can read it without
the run page's modules."""

from __future__ import annotations

import contextlib
import ctypes
import glob
import importlib.metadata
import os
import platform
import socket
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

__all__ = ["collect_versions", "git_commit", "ucx_version"]


def _dist_version(*names: str) -> str | None:
    for name in names:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return f"{importlib.metadata.version(name)} ({name})"
    return None


def ucx_version() -> str | None:
    """UCX bundled with the NIXL wheel (or on the system), asked in a child process so a
    broken library cannot take the harness down."""
    purelib = sysconfig.get_paths()["purelib"]
    candidates = sorted(glob.glob(os.path.join(purelib, "nixl*.libs", "libucp*.so*")))
    code = (
        "import ctypes,sys\n"
        "lib=ctypes.CDLL(sys.argv[1]); f=lib.ucp_get_version_string; f.restype=ctypes.c_char_p\n"
        "print(f().decode())\n"
    )
    for lib in [*candidates, "libucp.so.0"]:
        try:
            out = subprocess.run(
                [sys.executable, "-c", code, lib], capture_output=True, text=True, timeout=10, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and out.stdout.strip():
            return f"{out.stdout.strip()} ({os.path.basename(lib)})"
    return None


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parents[2],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


_VERSIONS: dict[str, Any] | None = None


def collect_versions() -> dict[str, Any]:
    """What ran: NIXL, UCX, torch, Python, this package, the host (cached per process)."""
    global _VERSIONS
    if _VERSIONS is None:
        _ = ctypes  # ctypes is used in the child; imported here so a missing module shows early
        _VERSIONS = {
            "nixl": _dist_version("nixl", "nixl-cu12", "nixl-cu13"),
            "nixl_cu": _dist_version("nixl-cu12", "nixl-cu13"),
            "ucx": ucx_version(),
            "torch": _dist_version("torch"),
            "python": sys.version.split()[0],
            "python_executable": sys.executable,
            "mxchaos": _dist_version("mxchaos"),
            "git_commit": git_commit(),
            "host": {
                "hostname": socket.gethostname(),
                "platform": platform.platform(),
                "kernel": platform.release(),
                "machine": platform.machine(),
                "cpus": os.cpu_count(),
            },
        }
    return dict(_VERSIONS)
