"""What every cached build of the matrix and the subjects shares: the cache folder, a bounded
command (``run_bounded``: an exit code and output, never an exception), the line of a failed
command that says why, and a lock file that serialises builds of one thing."""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["CommandRunner", "cache_dir", "error_line", "locked", "run_bounded"]

CommandRunner = Callable[[list[str], float], "subprocess.CompletedProcess[str]"]


def cache_dir() -> Path:
    return Path(os.environ.get("MXCHAOS_CACHE_DIR") or Path.home() / ".cache" / "mxchaos")


def error_line(text: str) -> str:
    """The line that says why: pip's last ``ERROR:`` line, else the last non-empty line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR:")]
    return (errors or lines or ["(no output)"])[-1]


def run_bounded(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"timed out after {timeout:g}s: {' '.join(argv[:6])}")
    except OSError as exc:
        return subprocess.CompletedProcess(argv, 127, "", f"{type(exc).__name__}: {exc}")


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (made when absent) for the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
