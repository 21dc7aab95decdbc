"""The disk checkpoint a run's readers fall back to, prepared once and shared between runs.

A synthetic model is deterministic in its flags (tensors, size, dtype, seed, name), so its
safetensors checkpoint is written once (``mxref prepare``) into a cache keyed by those flags
and by the generator's own source, and every later run with the same model points its readers
there: run folders (nightly artifacts) hold no copies of it. The file is written under a
temporary name and renamed, under a lock, so parallel runs never see half a checkpoint and
never prepare the same one twice.

The cache is bounded: after a new checkpoint is written, the least recently used ones are
deleted until the cache fits ``$MXCHAOS_CACHE_MAX_BYTES`` (default 4 GiB). A checkpoint is
touched on every use, and one used within the last hour is never deleted, so a run's readers
never lose the file they may fall back to.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mxref.model
from harness.engine import launch
from harness.errors import HarnessError
from harness.hosts.base import Host
from harness.machine import statedir
from harness.machine.ports import try_lock
from harness.record.timeline import Timeline
from harness.scenario import ReaderProcess, Scenario

__all__ = ["DEFAULT_CACHE_MAX_BYTES", "MIN_IDLE_S", "cache_dir", "cache_key", "cache_max_bytes", "checkpoint_cache", "evict", "needed", "prepare"]

DEFAULT_CACHE_MAX_BYTES = 4 << 30
MIN_IDLE_S = 3600.0  # a checkpoint used this recently may still be read by a run: never evicted


def cache_dir() -> Path:
    """``$MXCHAOS_CACHE_DIR``, else ``$XDG_CACHE_HOME/mxchaos``, else ``~/.cache/mxchaos``."""
    base = os.environ.get("MXCHAOS_CACHE_DIR")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "mxchaos"


def checkpoint_cache() -> Path:
    """``<cache>/checkpoints``, checked as the harness's state directory is (``statedir.ensure_dir``:
    ours, not writable by group or others, no symlink on the way, made 0700 when missing): every
    run's readers fall back to the files there, so a folder another user made or can write (a
    ``$MXCHAOS_CACHE_DIR`` under ``/tmp``) is refused, a ``StateDirError`` naming it and the rule."""
    folder = statedir.ensure_dir(cache_dir() / "checkpoints", setting="MXCHAOS_CACHE_DIR", what="checkpoint cache")
    assert folder is not None
    return folder


def cache_max_bytes() -> int:
    """``$MXCHAOS_CACHE_MAX_BYTES`` (a positive integer), else 4 GiB; HarnessError naming it when invalid."""
    raw = os.environ.get("MXCHAOS_CACHE_MAX_BYTES")
    if raw is None:
        return DEFAULT_CACHE_MAX_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise HarnessError(f"MXCHAOS_CACHE_MAX_BYTES: {raw!r} is not a positive number of bytes")
    return value


def evict(folder: Path, keep: Path, budget: int, now: float | None = None) -> list[str]:
    """Delete the least recently used checkpoints in ``folder`` (never ``keep``, never one used
    within ``MIN_IDLE_S``, never one another run holds the lock of) until the rest fit ``budget``
    bytes; the names of what it deleted."""
    now = time.time() if now is None else now
    found = []
    for path in folder.glob("*.safetensors"):
        try:
            info = path.stat()
        except OSError:
            continue
        found.append((info.st_mtime, info.st_size, path))
    total = sum(size for _, size, _ in found)
    removed: list[str] = []
    for mtime, size, path in sorted(found):  # oldest use first
        if total <= budget:
            break
        if path == keep or now - mtime < MIN_IDLE_S:
            continue
        lock = try_lock(folder / f"{path.stem}.lock")
        if lock is None:
            continue  # another run is preparing or using it
        try:
            path.unlink(missing_ok=True)
            (folder / f"{path.stem}.lock").unlink(missing_ok=True)
        finally:
            os.close(lock)
        total -= size
        removed.append(path.name)
    return removed


MXREF_LAUNCHER = ("{python}", "-m", "mxref")


def cache_key(model_flags: list[str], launcher: Sequence[str] = MXREF_LAUNCHER) -> str:
    """Names a checkpoint by what determines its bytes: the model flags, the generator, and the
    launcher that writes it when it is not mxref's own (a test's fake writes other bytes, and
    must never leave them where a real run would take them for weights)."""
    generator = hashlib.sha256(Path(mxref.model.__file__).read_bytes()).hexdigest()
    parts: dict[str, object] = {"flags": model_flags, "generator": generator}
    if tuple(launcher) != MXREF_LAUNCHER:
        parts["launcher"] = list(launcher)
    blob = json.dumps(parts, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


@dataclass(frozen=True)
class Needed:
    """What the run's readers need: a file the scenario names, or one to prepare (``reader``
    is whose launcher prepares it)."""

    path: Path | None = None
    reader: str | None = None


def needed(sc: Scenario) -> Needed:
    readers = [n for n, p in sc.processes.items() if isinstance(p, ReaderProcess)]
    if not readers:
        return Needed()
    if sc.model.file:
        return Needed(path=(sc.directory / sc.model.file).resolve())
    if all(isinstance(p, ReaderProcess) and p.options.checkpoint for p in (sc.processes[r] for r in readers)):
        return Needed()
    return Needed(reader=readers[0])


def prepare(
    sc: Scenario,
    *,
    host: Host,
    run_dir: Path,
    env: dict[str, str],
    timeline: Timeline,
) -> Path | None:
    """The checkpoint the run's readers fall back to (None: they name their own), prepared
    into the cache when it is not there yet (bounded by ``budgets.prepare``)."""
    need = needed(sc)
    if need.path is not None or need.reader is None:
        return need.path
    folder = checkpoint_cache()
    spec = sc.processes[need.reader]
    launcher = (spec.launcher if isinstance(spec, ReaderProcess) else None) or sc.launcher
    path = folder / f"{cache_key(sc.model.flags(sc.seed, sc.directory), launcher)}.safetensors"
    if path.is_file():
        os.utime(path)  # used now: the eviction keeps it
        timeline.append("ok", "harness", "prepare", {"checkpoint": str(path), "cached": True, "seconds": 0.0})
        return path
    budget = cache_max_bytes()  # a bad setting is an error before any work
    lock = _lock(folder / f"{path.stem}.lock", time.monotonic() + sc.budgets.prepare)
    try:
        if path.is_file():  # another run prepared it while we waited
            timeline.append("ok", "harness", "prepare", {"checkpoint": str(path), "cached": True, "seconds": 0.0})
            return path
        tmp = folder / f".{path.stem}.{os.getpid()}.safetensors"
        argv = launch.prepare_argv(sc, need.reader, run_dir, tmp)
        timeline.append("invoke", "harness", "prepare", {"argv": argv})
        result = host.exec(argv, env=env, cwd=run_dir, timeout=sc.budgets.prepare)
        (run_dir / "procs" / "prepare.log").write_text(result.stdout + result.stderr)
        value: dict[str, Any] = {"rc": result.rc, "seconds": round(result.seconds, 3), "checkpoint": str(path), "cached": False}
        if result.rc != 0 or not tmp.is_file():
            tmp.unlink(missing_ok=True)
            timeline.append("fail", "harness", "prepare", value)
            why = "timed out" if result.timed_out else f"exited {result.rc}"
            raise HarnessError(f"preparing the checkpoint {why}; see procs/prepare.log")
        os.replace(tmp, path)
        value["evicted"] = evict(folder, path, budget)
        timeline.append("ok", "harness", "prepare", value)
        return path
    finally:
        os.close(lock)


def _lock(path: Path, deadline: float) -> int:
    """An exclusive lock on ``path`` (waits, bounded: another run may be preparing)."""
    while True:
        fd = try_lock(path)
        if fd is not None:
            return fd
        if time.monotonic() > deadline:
            raise HarnessError(f"another run held {path} for longer than budgets.prepare")
        time.sleep(0.1)
