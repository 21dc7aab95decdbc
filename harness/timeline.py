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
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, overload

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
_NOT_PROGRESS = frozenset({"scrape"})


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


class Timeline:
    """Append-only, thread-safe; ``t`` measured from ``t0`` on the monotonic clock."""

    def __init__(self, t0: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.t0 = clock() if t0 is None else t0
        self._entries: list[Entry] = []
        self._cond = threading.Condition(threading.Lock())
        self._listeners: list[Callable[[Entry], None]] = []
        self.last_progress = self.t0

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
        with self._cond:
            entry = Entry(len(self._entries), when, type, actor, f, dict(value or {}))
            self._entries.append(entry)
            if f not in _NOT_PROGRESS:
                self.last_progress = self._clock()
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
class FaultWindow:
    """When a fault was live: from its inject invocation to its heal (``end`` None: never healed)."""

    name: str
    kind: str
    target: str | None
    start: float
    end: float | None
    injected: bool  # the inject completed ok
    value: Mapping[str, Any] = field(default_factory=dict)


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

    def __init__(self, entries: Iterable[Entry]) -> None:
        ordered = sorted(entries, key=lambda e: (e.t, e.index))
        self._entries: tuple[Entry, ...] = tuple(
            Entry(i, e.t, e.type, e.actor, e.f, e.value) for i, e in enumerate(ordered)
        )

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

    def fault_windows(self) -> list[FaultWindow]:
        starts: dict[str, Entry] = {}
        injected: dict[str, Entry] = {}
        healed: dict[str, float] = {}
        order: list[str] = []
        for entry in self._entries:
            if entry.actor != "nemesis":
                continue
            name = entry.get("fault")
            if not isinstance(name, str):
                continue
            if entry.f == "inject" and entry.type == "invoke":
                starts[name] = entry
                order.append(name)
            elif entry.f == "inject" and entry.type == "ok":
                injected[name] = entry
                if not entry.get("healable", False):
                    healed.setdefault(name, entry.t)
            elif (
                (entry.f == "inject" and entry.type in ("fail", "info"))  # never took hold
                or (entry.f == "heal" and entry.type in ("ok", "info") and name in starts)
            ):
                healed.setdefault(name, entry.t)
        windows = []
        for name in order:
            start = starts[name]
            done = injected.get(name)
            value = dict(start.value)
            if done is not None:
                value.update(done.value)
            windows.append(
                FaultWindow(
                    name=name,
                    kind=str(start.get("kind", "")),
                    # the injection's answer names the resolved target ({source_of: r} -> a process)
                    target=_target_text((done.get("target") if done is not None else None) or start.get("target")),
                    start=start.t,
                    end=healed.get(name),
                    injected=done is not None,
                    value=value,
                )
            )
        return windows

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
        with open(path, "w", encoding="utf-8") as out:
            for entry in self._entries:
                out.write(json.dumps(entry.to_json(), default=str, separators=(",", ":")) + "\n")

    @classmethod
    def from_jsonl(cls, path: str | Path) -> History:
        entries = []
        with open(path, encoding="utf-8") as src:
            for line in src:
                if line.strip():
                    entries.append(Entry.from_json(json.loads(line)))
        return cls(entries)

    @classmethod
    def build(cls, rows: Iterable[tuple[float, str, str, str] | tuple[float, str, str, str, Mapping[str, Any]]]) -> History:
        """For tests: ``(t, type, actor, f[, value])`` rows -> History."""
        entries = []
        for i, row in enumerate(rows):
            t, type_, actor, f = row[0], row[1], row[2], row[3]
            value = row[4] if len(row) > 4 else {}
            entries.append(Entry(i, float(t), type_, actor, f, dict(value)))
        return cls(entries)


def _target_text(target: Any) -> str | None:
    if target is None or isinstance(target, str):
        return target
    if isinstance(target, Mapping) and "source_of" in target:
        return f"source_of({target['source_of']})"
    return str(target)
