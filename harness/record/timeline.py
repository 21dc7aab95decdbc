"""One timeline per run: harness actions, process events, fault windows and metric scrapes.

Entries are Jepsen-style operations::

    Entry(index, t, type, actor, f, value)

- ``t``: seconds since the run started, on CLOCK_MONOTONIC (``time.monotonic()``),
  the clock every mxref process stamps its events with (``mono``), so one clock
  orders everything on a host.
- ``type``: ``invoke`` / ``ok`` / ``fail`` for actions with an outcome (a step, a
  fault injection, a process start), ``info`` for observations (process events,
  exits, scrapes, marks). An outcome that cannot be known is ``info`` with
  ``indeterminate: true`` in its value, never ``fail``.
- ``actor``: who the entry is about: ``harness`` (run, steps, marks, scans),
  ``nemesis`` (faults), or a scenario process name (its events, its start/stop by the
  harness, its exit as the harness saw it, its metric scrapes).
- ``f``: what: a step / fault verb (``step``, ``inject``, ``heal``, ``start``,
  ``stop``), an mxref event name (``load_done``...), ``process_exit``, ``scrape``.

``Timeline`` is the live, append-only, thread-safe recorder (dense ``index`` in
append order; waiters block on it). ``History`` is its frozen view for checks and
reports: sorted by ``t`` (ties keep append order) and re-indexed densely.

**The file, as it happens.** ``Timeline.open_sink(path)`` (the runner calls it as soon as
the run folder exists) writes every entry recorded so far, then each new one, to
``<run>/timeline.jsonl``: one JSON line per entry, written with a single ``write(2)`` on an
``O_APPEND`` descriptor under the timeline's lock, so lines from many threads never
interleave and the file's line order is the ``index`` order. Nothing is buffered in the
harness, so a harness that crashes or is SIGKILLed loses no entry it had recorded: what
the kernel has reaches the disk. There is deliberately no ``fsync`` per line (scrapes
are big and frequent; a power cut may lose the tail, a crash of the harness does not).
A failed write (disk full) closes the sink and is kept in ``sink_error``; recording in
memory goes on, and the run folder's writer rewrites the file at the end. ``t`` is
rounded to the microsecond when recorded, so the file read back is the same history.
``History.from_jsonl`` drops a torn last line (a crash in the middle of a write) and
counts it (``History.torn_lines``).
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, overload

from harness.record.fault_windows import FaultWindow, fault_windows

__all__ = [
    "ENTRY_TYPES",
    "Entry",
    "FaultWindow",
    "History",
    "Incarnation",
    "Timeline",
    "matches",
]

EntryType = Literal["invoke", "ok", "fail", "info"]
ENTRY_TYPES: tuple[str, ...] = ("invoke", "ok", "fail", "info")

# Entries that do not count as progress for the watchdog.
_NOT_PROGRESS = frozenset({"scrape", "observed"})


@dataclass(frozen=True, slots=True)
class Entry:
    index: int
    t: float
    type: str
    actor: str
    f: str
    value: Mapping[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.value.get(key, default)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "t": round(self.t, 6),
            "type": self.type,
            "actor": self.actor,
            "f": self.f,
            "value": dict(self.value),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Entry:
        return cls(
            index=int(data["index"]),
            t=float(data["t"]),
            type=str(data["type"]),
            actor=str(data["actor"]),
            f=str(data["f"]),
            value=dict(data.get("value") or {}),
        )

    def describe(self) -> str:
        return f"[{self.t:8.3f}s] {self.actor} {self.type} {self.f}"


def matches(entry: Entry, where: Mapping[str, Any] | None) -> bool:
    """Every ``where`` key equals the entry's value field (numbers compare numerically)."""
    if not where:
        return True
    for key, expected in where.items():
        if key not in entry.value:
            return False
        actual = entry.value[key]
        if isinstance(expected, bool) or isinstance(actual, bool):
            if actual is not expected:
                return False
        elif actual != expected:
            return False
    return True


def _encode_value(value: Mapping[str, Any]) -> str:
    """An entry's value as JSON (what cannot be encoded is recorded as its ``repr``)."""
    try:
        return json.dumps(value, default=str, separators=(",", ":"))
    except (TypeError, ValueError):  # a circular value, a non-string key
        return json.dumps({"unencodable": repr(value)}, separators=(",", ":"))


def _entry_line(entry: Entry, value: str) -> bytes:
    """``entry.to_json()`` as one line, its value already encoded (outside the lock)."""
    return (
        f'{{"index":{entry.index},"t":{json.dumps(round(entry.t, 6))},"type":{json.dumps(entry.type)},'
        f'"actor":{json.dumps(entry.actor)},"f":{json.dumps(entry.f)},"value":{value}}}\n'
    ).encode()


class _FileSink:
    """An ``O_APPEND`` descriptor written one whole line per ``write(2)``; closed at the latest
    when it is garbage collected."""

    def __init__(self, path: Path) -> None:
        self.path = path
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC, 0o644)
        self.fd = fd
        self._close = weakref.finalize(self, os.close, fd)

    def write(self, line: bytes) -> None:
        view = memoryview(line)
        while view:  # a regular file takes it all at once; a short write (disk full) goes on
            view = view[os.write(self.fd, view) :]

    def close(self) -> None:
        self._close()


class Timeline:
    """Append-only, thread-safe; ``t`` measured from ``t0`` on the monotonic clock; with a
    sink open, every entry is also appended to a file as it is recorded."""

    def __init__(self, t0: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.t0 = clock() if t0 is None else t0
        self._entries: list[Entry] = []
        # reentrant: a signal handler of the main thread may record an entry while that thread
        # is inside append (a plain lock would deadlock the harness there)
        self._cond = threading.Condition(threading.RLock())
        self._listeners: list[Callable[[Entry], None]] = []
        self._sink: _FileSink | None = None
        self.sink_error: str | None = None  # why the sink closed early, if it did
        self.last_progress = self.t0

    def open_sink(self, path: str | Path) -> None:
        """Append every entry to ``path`` (created or truncated) from now on, those recorded so
        far first; one ``write(2)`` per line, no fsync (see the module docstring)."""
        with self._cond:
            if self._sink is not None:
                self._sink.close()
            self._sink = _FileSink(Path(path))
            self.sink_error = None
            for entry in self._entries:
                self._write(entry, _encode_value(entry.value))

    def close_sink(self) -> None:
        """Stop writing to the file (entries still go on being recorded in memory)."""
        with self._cond:
            if self._sink is not None:
                self._sink.close()
                self._sink = None

    @property
    def sink_path(self) -> Path | None:
        sink = self._sink
        return sink.path if sink is not None else None

    def _write(self, entry: Entry, value: str) -> None:
        """Under the lock: the entry's line to the sink; a failure closes the sink, never raises."""
        if self._sink is None:
            return
        try:
            self._sink.write(_entry_line(entry, value))
        except OSError as exc:
            self.sink_error = f"{self._sink.path}: entry {entry.index}: {exc}"
            self._sink.close()
            self._sink = None

    def now(self) -> float:
        return self._clock() - self.t0

    def t_of_mono(self, mono: float) -> float:
        return mono - self.t0

    def add_listener(self, callback: Callable[[Entry], None]) -> None:
        self._listeners.append(callback)

    def append(
        self,
        type: str,
        actor: str,
        f: str,
        value: Mapping[str, Any] | None = None,
        *,
        t: float | None = None,
    ) -> Entry:
        if type not in ENTRY_TYPES:
            raise ValueError(f"entry type {type!r} is not one of {', '.join(ENTRY_TYPES)}")
        when = self.now() if t is None else t
        if not math.isfinite(when):
            raise ValueError(f"entry time {when!r} is not finite")
        when = round(when, 6)  # what the file keeps: the history read back is the same
        data = dict(value or {})
        encoded = _encode_value(data) if self._sink is not None else None  # big scrapes: outside the lock
        with self._cond:
            entry = Entry(len(self._entries), when, type, actor, f, data)
            self._entries.append(entry)
            if f not in _NOT_PROGRESS:
                self.last_progress = self._clock()
            if self._sink is not None:
                self._write(entry, encoded if encoded is not None else _encode_value(data))
            self._cond.notify_all()
        for listener in self._listeners:
            try:
                listener(entry)
            except Exception:  # noqa: BLE001 - a display problem must never break recording
                pass
        return entry

    def __len__(self) -> int:
        with self._cond:
            return len(self._entries)

    def entries(self, start: int = 0) -> list[Entry]:
        with self._cond:
            return self._entries[start:]

    def wait_for(
        self,
        predicate: Callable[[Entry], bool],
        deadline: float,
        *,
        start: int = 0,
        abort: threading.Event | None = None,
        count: int = 1,
    ) -> Entry | None:
        """The ``count``-th entry (from index ``start``) matching ``predicate``, waiting until
        ``deadline`` (monotonic); None at the deadline or when ``abort`` is set."""
        seen = 0
        position = start
        with self._cond:
            while True:
                while position < len(self._entries):
                    entry = self._entries[position]
                    position += 1
                    if predicate(entry):
                        seen += 1
                        if seen >= count:
                            return entry
                if abort is not None and abort.is_set():
                    return None
                remaining = deadline - self._clock()
                if remaining <= 0:
                    return None
                self._cond.wait(min(remaining, 0.1))

    def snapshot(self) -> History:
        with self._cond:
            return History(self._entries)


@dataclass(frozen=True, slots=True)
class Incarnation:
    """One start of a scenario process, as the harness saw it."""

    process: str
    incarnation: int
    pid: int | None
    start: float
    end: float | None
    rc: int | None
    stopped_by_harness: bool


class History(Sequence[Entry]):
    """Immutable, time-ordered view of a timeline: what checks and reports read."""

    def __init__(self, entries: Iterable[Entry], *, torn_lines: int = 0) -> None:
        ordered = sorted(entries, key=lambda e: (e.t, e.index))
        self._entries: tuple[Entry, ...] = tuple(
            Entry(i, e.t, e.type, e.actor, e.f, e.value) for i, e in enumerate(ordered)
        )
        self.torn_lines = torn_lines  # read from a file: a torn last line dropped (a crash mid-write)

    @overload
    def __getitem__(self, index: int) -> Entry: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Entry]: ...
    def __getitem__(self, index: int | slice) -> Entry | Sequence[Entry]:
        return self._entries[index]

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Entry]:
        return iter(self._entries)

    def select(
        self,
        *,
        actor: str | None = None,
        f: str | Iterable[str] | None = None,
        type: str | None = None,
        where: Mapping[str, Any] | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> list[Entry]:
        names = {f} if isinstance(f, str) else (set(f) if f is not None else None)
        out = []
        for entry in self._entries:
            if actor is not None and entry.actor != actor:
                continue
            if names is not None and entry.f not in names:
                continue
            if type is not None and entry.type != type:
                continue
            if since is not None and entry.t < since:
                continue
            if until is not None and entry.t > until:
                continue
            if not matches(entry, where):
                continue
            out.append(entry)
        return out

    def first(self, **query: Any) -> Entry | None:
        found = self.select(**query)
        return found[0] if found else None

    def last(self, **query: Any) -> Entry | None:
        found = self.select(**query)
        return found[-1] if found else None

    @property
    def end(self) -> float:
        return self._entries[-1].t if self._entries else 0.0

    def actors(self) -> list[str]:
        seen: dict[str, None] = {}
        for entry in self._entries:
            seen.setdefault(entry.actor, None)
        return list(seen)

    def fault_windows(self, name: str | None = None) -> list[FaultWindow]:
        """Every fault of the run (only ``name``'s when given), typed (``harness.record.fault_windows``)."""
        return fault_windows(self._entries, name)

    def incarnations(self, process: str | None = None) -> list[Incarnation]:
        """Process starts (``start`` ok entries) paired with their ``process_exit``."""
        spans: dict[tuple[str, int], dict[str, Any]] = {}
        for entry in self._entries:
            if process is not None and entry.actor != process:
                continue
            if entry.f == "start" and entry.type == "ok" and "incarnation" in entry.value:
                key = (entry.actor, int(entry.value["incarnation"]))
                spans[key] = {"start": entry.t, "pid": entry.get("pid"), "end": None, "rc": None, "by": False}
            elif entry.f == "process_exit" and "incarnation" in entry.value:
                key = (entry.actor, int(entry.value["incarnation"]))
                if key in spans:
                    spans[key].update(end=entry.t, rc=entry.get("rc"), by=bool(entry.get("stopped_by_harness")))
        return [
            Incarnation(name, inc, span["pid"], span["start"], span["end"], span["rc"], span["by"])
            for (name, inc), span in sorted(spans.items(), key=lambda kv: kv[1]["start"])
        ]

    def scrapes(self, process: str) -> list[Entry]:
        return [e for e in self._entries if e.actor == process and e.f == "scrape" and e.get("ok")]

    def to_jsonl(self, path: str | Path) -> None:
        """Write the file whole, atomically (a temporary file renamed over ``path``): a reader
        sees the old file or the new one, never a part."""
        target = Path(path)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            with open(tmp, "wb") as out:
                for entry in self._entries:
                    out.write(_entry_line(entry, _encode_value(entry.value)))
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)

    @classmethod
    def from_jsonl(cls, path: str | Path) -> History:
        """Read a timeline file back. A last line that is not a whole entry (the harness died in
        the middle of writing it) is dropped and counted in ``torn_lines``; a bad line before the
        last one is damage, not a crash: ``ValueError`` naming the line."""
        with open(path, "rb") as src:
            lines = src.read().split(b"\n")
        # a whole file ends with a newline: its last piece is empty; anything else there is torn
        entries = []
        torn = 0
        for number, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            try:
                entries.append(Entry.from_json(json.loads(raw)))
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                if number == len(lines):
                    torn += 1
                    continue
                raise ValueError(f"{path}:{number}: not a timeline entry: {exc}") from None
        return cls(entries, torn_lines=torn)

    @classmethod
    def build(cls, rows: Iterable[tuple[float, str, str, str] | tuple[float, str, str, str, Mapping[str, Any]]]) -> History:
        """For tests: ``(t, type, actor, f[, value])`` rows -> History."""
        entries = []
        for i, row in enumerate(rows):
            t, type_, actor, f = row[0], row[1], row[2], row[3]
            value = row[4] if len(row) > 4 else {}
            entries.append(Entry(i, float(t), type_, actor, f, dict(value)))
        return cls(entries)

