"""Bounded night artifacts: what a run folder keeps once the night has judged it.

After each run (its report written), ``trim_run_folder``:

* removes per-run checkpoint copies: ``checkpoints/`` and any ``*.safetensors`` in the folder
  (a reader with ``tamper_checkpoint`` gets a tampered copy of the model there; the copy's
  checksums are already in the timeline's ``tamper_checkpoint`` entry, and the shared
  checkpoint lives in the harness cache, ``harness.engine.checkpoint``);
* caps every log (``*.log`` anywhere in the folder, and every file under ``stacks/``) at
  ``LOG_CAP_BYTES`` (256 KiB): the first quarter and the last three quarters of the cap are
  kept, cut at line ends, with one marker line saying how many bytes were cut.

The timeline, metrics, events, verdict and report stay whole: ``mxchaos check`` re-judges a
run from ``timeline.jsonl`` and ``scenario.json``. ``folder_bytes`` measures a folder
(symlinks not followed), for ``nightly.json``'s ``artifacts.bytes``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

__all__ = ["LOG_CAP_BYTES", "cap_file", "folder_bytes", "trim_run_folder"]

LOG_CAP_BYTES = 256 << 10


def cap_file(path: Path, cap: int = LOG_CAP_BYTES) -> int:
    """Cut ``path`` to about ``cap`` bytes (head quarter + tail, at line ends, plus a marker
    line); the number of bytes cut (0: it already fit). Atomic: a reader sees the old or the new file."""
    size = path.stat().st_size
    if size <= cap:
        return 0
    head_n, tail_n = cap // 4, cap - cap // 4
    with open(path, "rb") as src:
        head = src.read(head_n)
        src.seek(size - tail_n)
        tail = src.read(tail_n)
    nl = head.rfind(b"\n")
    head = head[: nl + 1] if nl >= 0 else head
    nl = tail.find(b"\n")
    tail = tail[nl + 1 :] if 0 <= nl < len(tail) - 1 else tail
    cut = size - len(head) - len(tail)
    marker = f"[... mxchaos nightly: {cut} bytes cut here (logs capped at {cap} bytes) ...]\n".encode()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.cap")
    with open(tmp, "wb") as dst:
        dst.write(head + marker + tail)
    os.replace(tmp, path)
    return cut


def _is_log(path: Path, run_dir: Path) -> bool:
    rel = path.relative_to(run_dir)
    return path.suffix == ".log" or (bool(rel.parts) and rel.parts[0] == "stacks")


def trim_run_folder(run_dir: Path, cap: int = LOG_CAP_BYTES) -> dict[str, Any]:
    """Remove checkpoint copies and cap logs in ``run_dir``: ``{removed: [{path, bytes}],
    capped: [{path, bytes, cut}]}`` (paths relative to the run folder)."""
    removed: list[dict[str, Any]] = []
    capped: list[dict[str, Any]] = []
    if not run_dir.is_dir():
        return {"removed": removed, "capped": capped}
    copies = run_dir / "checkpoints"
    if copies.is_dir() and not copies.is_symlink():
        removed.append({"path": "checkpoints/", "bytes": folder_bytes(copies)})
        shutil.rmtree(copies, ignore_errors=True)
    for path in sorted(run_dir.rglob("*")):
        if path.is_symlink() or not path.is_file():
            continue
        rel = str(path.relative_to(run_dir))
        if path.suffix == ".safetensors":
            removed.append({"path": rel, "bytes": path.stat().st_size})
            path.unlink(missing_ok=True)
        elif _is_log(path, run_dir):
            size = path.stat().st_size
            cut = cap_file(path, cap)
            if cut:
                capped.append({"path": rel, "bytes": size, "cut": cut})
    return {"removed": removed, "capped": capped}


def folder_bytes(path: Path) -> int:
    """The bytes of the regular files under ``path`` (symlinks are not followed)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            p = Path(root) / name
            if not p.is_symlink():
                try:
                    total += p.stat().st_size
                except OSError:
                    continue
    return total
