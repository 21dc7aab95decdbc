"""Disk faults: a reader's checkpoint folder behind a FUSE layer that fails or slows its reads.

A reader that a ``disk`` fault targets gets its disk-fallback checkpoint in a folder of its own,
``<run>/checkpoints/<reader>/`` (``harness.judge.content.reader_checkpoint``: a copy of the
prepared checkpoint, never a hard link to the cache's file). ``disk`` mounts a FUSE pass-through layer over that folder
(``harness.faults._faultfs``, a process of its own, ``mfusepy`` over libfuse 3), so the reader
keeps the path it was started with and meets the fault on its next open: EIO on every read, short
reads, slow reads, or ENOSPC on every write (``mode``), on the files that match ``match``, after
the first ``after_bytes`` of each.

The layer counts each call it faulted, one line in its log (``<run>/faults/<name>.faultfs.log``);
heal reads them back as the fault's witness (``layer_witness``: the errors, short reads or delays
it served, by call): a layer no call met had no effect.

The token is the layer's pid and the folder; heal sends it SIGTERM (libfuse unmounts on it),
waits, bounded, for the mount to go, and otherwise kills the layer and detaches the mount
(``umount -l``). A layer outlives no harness (``harness.faults._tether`` ends it when the
harness is gone), and ``sweep`` detaches
every mount named after the run (``mxchaos-faultfs.<run id>``), a layer killed outright leaving
a dead one behind. The layer serves the mounting user only (no ``allow_other``) with
``default_permissions``: another local user cannot read or write through it. Needs root (mounting) and ``fuse`` (``/dev/fuse``, libfuse 3 and mfusepy).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from harness.errors import FaultError
from harness.faults import Fault, FaultContext, FaultSpec, Injected, _tether, register, undo_on_failure
from harness.record.witness import Witness
from harness.spec import Duration, Name, custom_error

__all__ = ["Disk", "DiskSpec", "Mounted", "checkpoint_folder", "fsname", "layer_counts", "layer_witness", "mounts_named"]

MOUNT_WAIT_S = 10.0  # a Python start and a mount, on a loaded machine too
FSNAME = "mxchaos-faultfs"


def checkpoint_folder(run_dir: Path, reader: str) -> Path:
    """The folder holding reader ``reader``'s checkpoint when a disk fault targets it."""
    return run_dir / "checkpoints" / reader


def fsname(run_id: str, fault: str) -> str:
    """The mount's source name: sweep finds a run's mounts by it."""
    return f"{FSNAME}.{run_id}.{fault}"


def mounts_named(prefix: str) -> list[str]:
    """Mount points of this machine's FUSE mounts whose source starts with ``prefix``."""
    found = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if sep and len(fields) > 4 and len(tail) > 1 and tail[0].startswith("fuse") and tail[1].startswith(prefix):
            found.append(fields[4].replace("\\040", " "))
    return found


class DiskSpec(FaultSpec):
    """Put reader ``target``'s checkpoint folder behind a FUSE layer: ``eio`` (every read fails),
    ``short`` (reads return at most ``short_bytes``), ``slow`` (each read waits ``delay``) or
    ``enospc`` (every write fails), on the files matching ``match``, past their first
    ``after_bytes``. Heal (or ``duration``) unmounts it."""

    kind: Literal["disk"]
    target: Name
    mode: Literal["eio", "short", "slow", "enospc"]
    match: tuple[str, ...] = Field(("*.safetensors",), min_length=1)
    delay: Duration | None = None
    short_bytes: int = Field(512, ge=1)
    after_bytes: int = Field(0, ge=0)

    # harness.judge.content.reader_checkpoint gives a reader that such a fault targets a folder of its own
    on_checkpoint: ClassVar[bool] = True

    @model_validator(mode="after")
    def _delay_for_slow(self) -> DiskSpec:
        if self.mode == "slow" and not self.delay:
            raise custom_error("delay", "a disk fault of mode slow needs delay (e.g. delay: 200ms, per read)")
        if self.mode != "slow" and self.delay is not None:
            raise custom_error("delay", f"delay applies to mode slow only, not {self.mode}")
        return self

    def process_refs(self) -> tuple[str, ...]:
        return (self.target,)

    def process_issues(self, processes: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
        spec = processes.get(self.target)
        if spec is None:
            return ()  # reported as a missing process already
        role = getattr(spec, "role", None)
        if role != "reader":
            return (("target", f"a disk fault acts on a reader's checkpoint folder, and {self.target!r} is a {role}"),)
        if getattr(getattr(spec, "options", None), "checkpoint", None) is not None:
            return (("target", f"a disk fault puts the run's checkpoint in a folder of {self.target}'s own, so "
                     f"{self.target} cannot name options.checkpoint"),)
        if getattr(spec, "tamper_checkpoint", None) is not None:
            return (("target", f"a disk fault and tamper_checkpoint both give {self.target} a checkpoint of its own; "
                     "use one"),)
        return ()


@dataclass(frozen=True)
class Mounted:
    """What heal undoes: the layer's process, the folder it is mounted over, its log."""

    target: str
    folder: str
    pid: int
    log: str


def _mounted(folder: str, name: str) -> bool:
    return folder in mounts_named(name)


# what each mode's faulted call is, in the witness's words and figures
SERVED = {"eio": "reads failed with EIO", "short": "short reads", "slow": "delayed reads",
          "enospc": "writes failed with ENOSPC"}
_FAULTED = re.compile(r"^faultfs faulted (\S+) (\d+)(?: (\S+))?", re.M)


def layer_counts(text: str) -> dict[str, int]:
    """The calls the FUSE layer faulted, by operation (``read``, ``write``, ``create``, ``open``,
    ``truncate``), from its own log (``faultfs faulted MODE N OP PATH`` per call; a line of an
    older layer without ``OP`` counts as ``read``)."""
    counts: dict[str, int] = {}
    for match in _FAULTED.finditer(text):
        op = match[3] or "read"
        counts[op] = counts.get(op, 0) + 1
    return counts


def layer_witness(log: str, mode: str, folder: str) -> Witness:
    """What the layer served while mounted: the calls it faulted (counted by the layer itself,
    the harness's own process, one line each in its log); none when no call met the fault."""
    try:
        text = Path(log).read_text(errors="replace")
    except OSError as exc:
        return Witness.unwitnessed(f"the FUSE layer's log {log} cannot be read: {exc.strerror}")
    counts = layer_counts(text)
    total = sum(counts.values())
    figures = {"mode": mode, "faulted": total, "by_call": counts}
    if total:
        return Witness.seen(f"the FUSE layer over {folder} served {total} {SERVED[mode]} "
                            f"({', '.join(f'{op} {n}' for op, n in sorted(counts.items()))})", **figures)
    return Witness.none(f"no call through the FUSE layer over {folder} met the fault (0 {SERVED[mode]})", **figures)


def _detach(folder: str) -> None:
    subprocess.run(["umount", "-l", folder], capture_output=True, timeout=10, check=False)


def _end(pid: int, folder: str, name: str) -> bool:
    """End the layer (SIGTERM: it unmounts), bounded; detach the mount if it is still there. True
    if it was mounted."""
    was = _mounted(folder, name)
    _tether.end(pid, lambda: not _mounted(folder, name), MOUNT_WAIT_S)
    if _mounted(folder, name):
        _detach(folder)
    return was


@register
class Disk(Fault[DiskSpec, Mounted]):
    kind = "disk"
    Spec = DiskSpec
    healable = True
    requires = ("root", "fuse")
    no_ssh_lever = "its FUSE layer mounts over a checkpoint folder on this machine, and a reader on an ssh host reads its own"

    def inject(self, ctx: FaultContext) -> Injected[Mounted]:
        spec = self.spec
        folder = checkpoint_folder(ctx.run_dir, spec.target)
        if not folder.is_dir():
            raise FaultError(f"disk: {spec.target}'s checkpoint folder {folder} does not exist (no checkpoint prepared?)")
        name = fsname(ctx.run_id, self.name)
        if _mounted(str(folder), name):
            raise FaultError(f"disk: {folder} is already behind a fault layer")
        log = ctx.run_dir / "faults" / f"{self.name}.faultfs.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        # run as a file, not ``-m harness.faults._faultfs``: that would import every fault kind first
        argv = [sys.executable, "-P", str(Path(__file__).with_name("_faultfs.py")), str(folder), "--fsname", name,
                "--mode", spec.mode,
                "--short-bytes", str(spec.short_bytes), "--after-bytes", str(spec.after_bytes)]
        argv += [f"--match={pattern}" for pattern in spec.match]
        if spec.delay:
            argv += ["--delay", f"{spec.delay:g}"]
        with undo_on_failure() as undo, log.open("ab") as out:
            proc = _tether.spawn(argv, out)
            undo.callback(_end, proc.pid, str(folder), name)
            deadline = time.monotonic() + MOUNT_WAIT_S
            while not _mounted(str(folder), name):
                if proc.poll() is not None:
                    raise FaultError(f"disk: the FUSE layer over {folder} exited (rc {proc.returncode}) before "
                                     f"mounting; its log: {log}")
                if time.monotonic() > deadline:
                    raise FaultError(f"disk: {folder} was not mounted within {MOUNT_WAIT_S:g}s; its log: {log}")
                ctx.sleep(0.02)
        record = {"target": spec.target, "folder": str(folder), "mode": spec.mode, "match": list(spec.match),
                  "pid": proc.pid}
        if spec.delay:
            record["delay"] = spec.delay
        if spec.after_bytes:
            record["after_bytes"] = spec.after_bytes
        return Injected(Mounted(spec.target, str(folder), proc.pid, str(log)), record)

    def heal(self, ctx: FaultContext, token: Mounted) -> dict[str, Any] | None:
        name = fsname(ctx.run_id, self.name)
        was = _end(token.pid, token.folder, name)
        if _mounted(token.folder, name):
            raise FaultError(f"disk: {token.folder} is still mounted after SIGTERM, SIGKILL and umount -l")
        witness = layer_witness(token.log, self.spec.mode, token.folder)  # the layer has ended: its log is whole
        return {"target": token.target, "folder": token.folder, "unmounted": was,
                "faulted": witness.figures.get("faulted"), "witness": witness.to_json()}

    @classmethod
    def sweep(cls, run_id: str) -> list[str]:
        removed = []
        for folder in mounts_named(f"{FSNAME}.{run_id}."):
            _detach(folder)
            removed.append(f"FUSE mount {folder}")
        return removed
