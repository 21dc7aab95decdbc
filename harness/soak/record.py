"""The soak's record: ``samples.jsonl`` in the output folder, one line per process per sample,
appended and flushed as it goes, so a soak that crashes leaves every sample it took readable and
``--resume`` continues it (a new *segment*: new processes, the transfer count going on).

A line: ``{"segment", "transfers", "failed", "elapsed_s", "t", "process", "role", "pid", "loads",
"values": {resource: value}, "made": {resource: count}}`` (``made``: the audit's made counters,
``loads``: the verified loads a reader reported so far in its segment). A torn last line (the
crash came mid-write) is skipped on reading.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["SAMPLES", "Record", "Sample", "read_samples"]

SAMPLES = "samples.jsonl"


@dataclass(frozen=True)
class Sample:
    segment: int
    transfers: int
    failed: int
    elapsed_s: float
    process: str
    role: str
    pid: int
    loads: int
    values: dict[str, float]
    made: dict[str, float]

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Sample:
        return cls(segment=int(doc["segment"]), transfers=int(doc["transfers"]), failed=int(doc.get("failed", 0)),
                   elapsed_s=float(doc.get("elapsed_s", 0.0)), process=str(doc["process"]), role=str(doc["role"]),
                   pid=int(doc.get("pid", 0)), loads=int(doc.get("loads", 0)),
                   values={k: float(v) for k, v in dict(doc.get("values") or {}).items()},
                   made={k: float(v) for k, v in dict(doc.get("made") or {}).items()})


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    with path.open() as f:
        for line in f:
            try:
                doc = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn line (the soak died writing it)
            if isinstance(doc, dict):
                yield doc


def read_samples(out: Path) -> list[Sample]:
    """Every whole sample of ``out/samples.jsonl`` (none when it does not exist). A line that is JSON
    but not a sample raises ValueError naming the file and the line."""
    path = out / SAMPLES
    if not path.exists():
        return []
    samples = []
    for i, doc in enumerate(_lines(path), start=1):
        try:
            samples.append(Sample.from_json(doc))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}: sample {i}: not a soak sample ({type(exc).__name__}: {exc})") from exc
    return samples


class Record:
    """Appends samples to ``out/samples.jsonl``; knows where a resumed soak goes on from."""

    def __init__(self, out: Path, resume: bool) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        path = out / SAMPLES
        if path.exists() and path.stat().st_size and not resume:
            raise FileExistsError(f"{path} holds a soak already: --resume continues it, or give another --out")
        self.previous = read_samples(out) if resume else []
        self.segment = max((s.segment for s in self.previous), default=-1) + 1
        self.start_transfers = max((s.transfers for s in self.previous), default=0)
        self.start_failed = max((s.failed for s in self.previous), default=0)
        self.start_elapsed = max((s.elapsed_s for s in self.previous), default=0.0)
        self._file = path.open("a")

    def write(self, doc: dict[str, Any]) -> None:
        self._file.write(json.dumps(doc, separators=(",", ":")) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()
