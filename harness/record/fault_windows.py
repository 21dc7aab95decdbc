"""Typed fault records of a run: what the timeline's nemesis entries say about each fault.

``FaultEntry.of(entry)`` reads one ``inject`` / ``heal`` entry of the nemesis into named
fields; ``fault_windows(entries)`` pairs them into one ``FaultWindow`` per injection: the
target it resolved, when it was injected and healed, and its outcome. ``target_text`` writes
a target as text. Checks, the console, replay, explore, the matrix and the pages read faults
through these, never by the entries' keys (``History.fault_windows`` is the usual door).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from harness.record.witness import Witness, combined

__all__ = ["FaultAction", "FaultEntry", "FaultOutcome", "FaultWindow", "fault_windows", "target_text"]

FaultAction = Literal["inject", "heal"]
FaultOutcome = Literal["healed", "failed", "skipped", "active"]


def target_text(target: Any) -> str | None:
    """A fault target as text: a name as it is, ``{source_of: r}`` (a model or its JSON) as
    ``source_of(r)``; the one place that writes it (console, pages, replay, explore, steps)."""
    if target is None or isinstance(target, str):
        return target
    if isinstance(target, Mapping) and "source_of" in target:
        return f"source_of({target['source_of']})"
    source_of = getattr(target, "source_of", None)
    if isinstance(source_of, str):
        return f"source_of({source_of})"
    return str(target)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


@dataclass(frozen=True, slots=True)
class FaultEntry:
    """One nemesis entry, typed: an ``inject`` or ``heal`` of fault ``fault`` (``type``:
    invoke / ok / fail / info, as recorded)."""

    index: int
    t: float
    action: FaultAction
    type: str
    fault: str
    kind: str
    target: str | None  # target_text of the entry's target (an inject's ok: what it resolved to)
    proxy: str | None
    error: str | None
    skipped: str | None  # why an ``if_gone: skip`` fault was not injected
    indeterminate: bool  # its outcome could not be known (interrupted, a fault's bug)
    noop: bool  # a heal of a fault that was not active
    healable: bool  # an inject's ok: whether it left something to heal
    reason: str | None  # a heal's: step, duration or teardown
    value: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, entry: _EntryLike) -> FaultEntry | None:
        """The typed view of ``entry``; None when it is not a nemesis inject/heal of a named fault."""
        value = entry.value
        name = value.get("fault")
        if entry.actor != "nemesis" or entry.f not in ("inject", "heal") or not isinstance(name, str):
            return None
        return cls(
            index=entry.index,
            t=entry.t,
            action="inject" if entry.f == "inject" else "heal",
            type=entry.type,
            fault=name,
            kind=str(value.get("kind") or ""),
            target=target_text(value.get("target")),
            proxy=_text(value.get("proxy")),
            error=None if value.get("error") is None else str(value.get("error")),
            skipped=None if value.get("skipped") is None else str(value.get("skipped")),
            indeterminate=value.get("indeterminate") is True,
            noop=value.get("noop") is True,
            healable=value.get("healable") is True,
            reason=_text(value.get("reason")),
            value=entry.value,
        )

    def describe(self) -> str:
        """``fault NAME (KIND WHERE)``: how the console and reports name it."""
        where = self.target or self.proxy
        return f"fault {self.fault} ({self.kind}" + (f" {where})" if where else ")")


@dataclass(frozen=True, slots=True)
class FaultWindow:
    """One fault of a run, from its inject invocation to when it stopped being live.

    ``outcome``: ``healed`` (a heal completed, or a kind with nothing to heal, such as
    ``kill``, completed its inject), ``failed`` (the inject was refused or raised; with
    ``indeterminate`` its outcome could not be known, and the inject undid what it did),
    ``skipped`` (its target was gone and its ``if_gone`` is ``skip``) or ``active`` (still in
    place when the record ends: no heal completed, or the inject never answered).
    ``end``: when it stopped being live (the heal, the one-shot's or the failed inject's
    answer); None while ``active``. ``heal_reason`` ``teardown``: the run's steps left it in
    place and the teardown healed it (``active_at_teardown``)."""

    name: str
    kind: str
    target: str | None  # what it hit: the process the inject resolved, else its target as written
    start: float  # the inject's invocation
    end: float | None
    injected: bool  # the inject completed ok
    outcome: FaultOutcome = "active"
    index: int = -1  # the inject invocation's index in its History
    inject_t: float | None = None  # when the inject answered (ok or not); None: it never did
    answer_index: int = -1  # that answer's index in its History (-1: none)
    heal_t: float | None = None  # when a heal completed
    heal_reason: str | None = None  # step | duration | teardown
    error: str | None = None  # why the inject failed or was skipped, or the last heal failed
    indeterminate: bool = False
    resolved: str | None = None  # the process the inject named as its target (``{source_of: r}`` resolved)
    host: str | None = None  # network kinds: the host (and peer host) it was applied on
    peer_host: str | None = None
    peer: str | None = None  # the process the inject named as its peer
    spec: Mapping[str, Any] = field(default_factory=dict)  # the fault as the step gave it (JSON)
    value: Mapping[str, Any] = field(default_factory=dict)  # the invocation's value, updated by the ok answer
    witnesses: tuple[Witness, ...] = ()  # what the fault measured of its effect, at inject and at heal

    @property
    def witness(self) -> Witness | None:
        """Its witnesses as one (``harness.record.witness.combined``); None: it recorded none."""
        return combined(self.witnesses)

    @property
    def expect_effect(self) -> bool:
        """False for a negative control (``expect_effect: false``): no effect is what it expects."""
        return self.spec.get("expect_effect") is not False

    @property
    def active_at_teardown(self) -> bool:
        """Whether the fault was still in place when the run's teardown began."""
        return self.outcome == "active" or self.heal_reason == "teardown"

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(h for h in (self.host, self.peer_host) if h)


class _OpenWindow:
    """A fault window being read from the entries, in order."""

    def __init__(self, invoke: FaultEntry) -> None:
        self.invoke = invoke
        self.answer: FaultEntry | None = None  # the inject's ok / fail / info
        self.healed: FaultEntry | None = None  # the first heal that completed
        self.heal_error: str | None = None

    def add(self, fe: FaultEntry) -> None:
        if fe.action == "inject" and fe.type != "invoke" and self.answer is None:
            self.answer = fe
        elif fe.action == "heal" and fe.type == "ok" and self.healed is None:
            self.healed = fe
        elif fe.action == "heal" and fe.type == "fail" and self.healed is None:
            self.heal_error = fe.error

    def window(self) -> FaultWindow:
        start, answer, healed = self.invoke, self.answer, self.healed
        ok = answer is not None and answer.type == "ok"
        outcome: FaultOutcome
        error = None
        if answer is None:
            outcome, end = "active", None
        elif not ok:
            outcome, end, error = ("skipped" if answer.skipped else "failed"), answer.t, answer.skipped or answer.error
        elif not answer.healable:
            outcome, end = "healed", answer.t
        elif healed is not None:
            outcome, end = "healed", healed.t
        else:
            outcome, end, error = "active", None, self.heal_error
        record = answer.value if ok and answer is not None else {}
        value = {**start.value, **record}
        # a failed inject may carry what it measured of its effect (a drain its target never began)
        witnesses = [Witness.of((answer.value if answer is not None else {}).get("witness"), "inject")]
        if healed is not None:
            witnesses.append(Witness.of(healed.value.get("witness"), "heal"))
        return FaultWindow(
            name=start.fault,
            kind=start.kind,
            # the injection's answer names the resolved target ({source_of: r} -> a process)
            target=(answer.target if ok and answer is not None else None) or start.target,
            start=start.t,
            end=end,
            injected=ok,
            outcome=outcome,
            index=start.index,
            inject_t=None if answer is None else answer.t,
            answer_index=-1 if answer is None else answer.index,
            heal_t=None if healed is None else healed.t,
            heal_reason=None if healed is None else healed.reason,
            error=error,
            indeterminate=answer is not None and answer.indeterminate,
            resolved=_text(record.get("target")),
            host=_text(record.get("host")),
            peer_host=_text(record.get("peer_host")),
            peer=_text(record.get("peer")),
            spec=dict(start.value.get("spec") or {}),
            value=value,
            witnesses=tuple(w for w in witnesses if w is not None),
        )


class _EntryLike(Protocol):
    """What is read of a timeline entry (``harness.record.timeline.Entry``)."""

    @property
    def index(self) -> int: ...
    @property
    def t(self) -> float: ...
    @property
    def type(self) -> str: ...
    @property
    def actor(self) -> str: ...
    @property
    def f(self) -> str: ...
    @property
    def value(self) -> Mapping[str, Any]: ...


def fault_windows(entries: Iterable[_EntryLike], name: str | None = None) -> list[FaultWindow]:
    """Every fault of ``entries`` (time-ordered; only ``name``'s when given), in the order their
    injects were invoked: each inject invocation opens a window, and the entries after it for
    its fault name (its answer, its heals) fill it in, so faults injected in parallel pair up
    by name, and a name injected again opens a new window."""
    opened: list[_OpenWindow] = []
    latest: dict[str, _OpenWindow] = {}
    for entry in entries:
        fe = FaultEntry.of(entry)
        if fe is None or (name is not None and fe.fault != name):
            continue
        if fe.action == "inject" and fe.type == "invoke":
            latest[fe.fault] = _OpenWindow(fe)
            opened.append(latest[fe.fault])
        elif fe.fault in latest:
            latest[fe.fault].add(fe)
    return [w.window() for w in opened]
