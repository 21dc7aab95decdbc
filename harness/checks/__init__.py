"""Checks: pure functions of a run's timeline, registered by kind.

A check is a function ``(params, history, run) -> CheckResult`` registered with its
typed parameters; the scenario key is the kind::

    class LoadedParams(CheckParams):
        reader: Name
        ...

    @register("loaded", LoadedParams)
    def loaded(p: LoadedParams, h: History, run: RunFacts) -> CheckResult: ...

Verdicts have three values: ``True``, ``False`` and ``"unknown"`` (nothing to judge,
or the check itself failed). ``evaluate`` never raises: a check that raises is
"unknown" with the traceback in its details. ``merge_valid`` lets the worst win:
False over "unknown" over True. Adding a check is adding a module to this package
(imported automatically).
"""

from __future__ import annotations

import importlib
import pkgutil
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from harness.checks.deadlines import ReadWindow
from harness.record.timeline import Entry, History
from harness.spec import Ref, Strict

if TYPE_CHECKING:
    from harness.record.expected import ExpectedModel

__all__ = [
    "REGISTRY",
    "CheckDef",
    "CheckParams",
    "CheckResult",
    "NOT_FOR_SERVER",
    "NOT_FOR_SUBJECT",
    "NOT_THIS_CASE",
    "NamedResult",
    "RunFacts",
    "ServerName",
    "Valid",
    "evaluate",
    "merge_valid",
    "register",
    "resolve_ref",
    "source_matches",
]

Valid = bool | Literal["unknown"]


ServerName = Literal["mxref", "modelexpress"]  # who can play a server (harness.subjects.mx_server.SUBJECT_NAMES)
NOT_FOR_SERVER = "not for this server"  # the words a check that names other servers is shown with
NOT_FOR_SUBJECT = "not for this subject"  # ... and one that names other subjects (who plays sources and readers)
NOT_THIS_CASE = "not this case"  # ... and one whose only_if did not hold in the run


class OnlyIf(Strict):
    """The case a check is written for, decided on the timeline: ``before: [A, B]``, judged only
    in a run where A came before B. For a race the scenario cannot close and whose sides have
    different rules (a freeze landed before a READ began, or after), one check per side."""

    before: tuple[Ref, Ref]

    def text(self) -> str:
        return f"{self.before[0].describe()} before {self.before[1].describe()}"


class CheckParams(Strict):
    """Keys every check has: ``name`` (shown in reports instead of the generated label);
    ``servers``: the servers the check is for (a metric only the real ModelExpress server exports:
    ``servers: [modelexpress]``); unset: every server. A run whose servers are all played by
    others does not judge it: it is shown as "not for this server" (``evaluate``). ``subjects``:
    the same for who plays the sources and readers (what only mxref's client promises, an event
    only it emits: ``subjects: [mxref]``); a run whose concerned sources and readers are all played
    by others shows it as "not for this subject". ``only_if``: the case it is written for
    (``OnlyIf``); in a run of the other case it is shown as "not this case"."""

    name: str | None = None
    servers: tuple[ServerName, ...] | None = None
    subjects: tuple[ServerName, ...] | None = None
    only_if: OnlyIf | None = None

    @field_validator("servers", "subjects")
    @classmethod
    def _servers(cls, value: tuple[str, ...] | None, info: ValidationInfo) -> tuple[str, ...] | None:
        key = info.field_name or "servers"
        one, what = ("server", "servers") if key == "servers" else ("subject", "subjects (who plays the sources and readers)")
        if value is not None and not value:
            raise PydanticCustomError(key, f"name the {what} the check is for (mxref, modelexpress), "
                                      f"or drop the key: it is for every {one}")
        if value is not None and len(set(value)) != len(value):
            raise PydanticCustomError(key, f"name each {one} once")
        return value

    def process_refs(self) -> Iterable[tuple[str, str, tuple[str, ...] | None]]:
        """``(key, process name, allowed roles or None)`` for pre-run validation."""
        return ()

    def label(self, kind: str) -> str:
        return self.name or kind


@dataclass(frozen=True)
class CheckResult:
    valid: Valid
    summary: str
    details: Mapping[str, Any] = field(default_factory=dict)
    marks: tuple[tuple[float, str], ...] = ()  # (t, label) points to mark on the report picture


@dataclass(frozen=True)
class NamedResult:
    """A check's result with its identity, as reports and verdicts hold it."""

    index: int
    kind: str
    name: str
    valid: Valid
    summary: str
    details: Mapping[str, Any] = field(default_factory=dict)
    marks: tuple[tuple[float, str], ...] = ()
    seconds: float = 0.0

    @property
    def not_judged(self) -> str | None:
        """Why a valid check was not judged ("not for this server"), or None when it was."""
        why = self.details.get("not_judged") if self.valid is True else None
        return str(why) if why else None

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "kind": self.kind,
            "name": self.name,
            "valid": self.valid,
            "summary": self.summary,
            "details": dict(self.details),
            "marks": [list(m) for m in self.marks],
            "seconds": round(self.seconds, 6),
        }


@dataclass(frozen=True)
class RunFacts:
    """What a check may know besides the timeline: process roles (from the scenario), and
    the model's expected content as the harness computes it (``expected()``: computed on the
    first call, once; None when the caller has no scenario model to compute it from)."""

    roles: Mapping[str, str] = field(default_factory=dict)  # process name -> role
    expected: Callable[[], ExpectedModel] | None = None
    # the model with N more tensors (a manifest that grew after publishing), as the harness computes it
    grown: Callable[[int], ExpectedModel] | None = None
    players: Mapping[str, str] = field(default_factory=dict)  # process name -> subject playing it (unset: mxref)
    # reader -> its chunked READ as the scenario gives it (read_chunk_mib, read_window; None: the default)
    read_windows: Mapping[str, tuple[float | None, int | None]] = field(default_factory=dict)

    def played_by(self, name: str) -> str:
        return self.players.get(name, "mxref")

    def read_window(self, reader: str | None) -> ReadWindow:
        """``reader``'s chunked READ as its scenario gives it (the stall contract's window)."""
        return ReadWindow(*self.read_windows.get(reader or "", (None, None)))

    def processes(self, role: str) -> list[str]:
        return [name for name, r in self.roles.items() if r == role]


CheckFn = Callable[[Any, History, RunFacts], CheckResult]


@dataclass(frozen=True)
class CheckDef:
    kind: str
    params: type[CheckParams]
    fn: CheckFn
    doc: str


REGISTRY: dict[str, CheckDef] = {}


def register(kind: str, params: type[CheckParams]) -> Callable[[CheckFn], CheckFn]:
    def deco(fn: CheckFn) -> CheckFn:
        if kind in REGISTRY and REGISTRY[kind].fn is not fn:
            raise ValueError(f"check kind {kind!r} registered twice")
        REGISTRY[kind] = CheckDef(kind, params, fn, (fn.__doc__ or "").strip())
        return fn

    return deco


def merge_valid(values: Iterable[Valid]) -> Valid:
    """False wins over "unknown", which wins over True; no values is True."""
    result: Valid = True
    for value in values:
        if value is False:
            return False
        if value != True:  # noqa: E712 - "unknown" (or anything unexpected) is unknown
            result = "unknown"
    return result


def not_for_server(params: BaseModel, run: RunFacts) -> CheckResult | None:
    """The result of a check declared for other servers than the run's (``servers:``), or None
    when it is to be judged. The servers it concerns: the server its ``process`` names, else
    every server of the run; it is judged when one of them is played by a server it names."""
    servers = params.servers if isinstance(params, CheckParams) else None
    if servers is None:
        return None
    named = getattr(params, "process", None)
    concerned = [named] if isinstance(named, str) and run.roles.get(named) == "server" else run.processes("server")
    players = {name: run.played_by(name) for name in concerned}
    if any(player in servers for player in players.values()):
        return None
    played = ", ".join(f"{n} played by {s}" for n, s in players.items()) or "no server in the run"
    return CheckResult(True, f"{NOT_FOR_SERVER}: for {', '.join(servers)} (servers:), here {played}; not judged",
                       {"not_judged": NOT_FOR_SERVER, "servers": list(servers), "players": players})


PEER_KEYS = ("process", "reader", "source")  # a check's keys that may name the source or reader it judges


def not_for_subject(params: BaseModel, run: RunFacts) -> CheckResult | None:
    """The result of a check declared for other subjects than the run's (``subjects:``), or None
    when it is to be judged. The processes it concerns: the sources and readers its ``process``,
    ``reader`` or ``source`` names, else every source and reader of the run; it is judged when
    one of them is played by a subject it names."""
    subjects = params.subjects if isinstance(params, CheckParams) else None
    if subjects is None:
        return None
    peers = ("source", "reader")
    named = [v for key in PEER_KEYS if isinstance(v := getattr(params, key, None), str) and run.roles.get(v) in peers]
    concerned = named or [n for n, r in run.roles.items() if r in peers]
    players = {name: run.played_by(name) for name in concerned}
    if any(player in subjects for player in players.values()):
        return None
    played = ", ".join(f"{n} played by {s}" for n, s in players.items()) or "no source or reader in the run"
    return CheckResult(True, f"{NOT_FOR_SUBJECT}: for {', '.join(subjects)} (subjects:), here {played}; not judged",
                       {"not_judged": NOT_FOR_SUBJECT, "subjects": list(subjects), "players": players})


def not_this_case(params: BaseModel, history: History) -> CheckResult | None:
    """The result of a check whose ``only_if`` did not hold in this run ("not this case"), an
    unknown one when a point of it never happened (the case cannot be told), or None when it is
    to be judged."""
    only_if = params.only_if if isinstance(params, CheckParams) else None
    if only_if is None:
        return None
    first, then = (resolve_ref(ref, history) for ref in only_if.before)
    missing = [ref.describe() for ref, entry in zip(only_if.before, (first, then), strict=True) if entry is None]
    if missing:
        return CheckResult("unknown", f"only if {only_if.text()}: {' and '.join(missing)} never happened, "
                                      "so the case cannot be told")
    assert first is not None and then is not None
    if first.t < then.t:
        return None
    return CheckResult(True, f"{NOT_THIS_CASE}: only if {only_if.text()}; here {only_if.before[1].describe()} "
                             f"({then.t:.3f}s) came first ({only_if.before[0].describe()} {first.t:.3f}s); not judged",
                       {"not_judged": NOT_THIS_CASE, "only_if": only_if.text(), "first": round(first.t, 6),
                        "then": round(then.t, 6)})


def evaluate(index: int, kind: str, params: BaseModel, history: History, run: RunFacts) -> NamedResult:
    """Run one check; never raises. A check declared for other servers (or subjects) than the
    run's is not judged: valid, its summary starting "not for this server" (``not_for_server``)
    or "not for this subject" (``not_for_subject``); one whose ``only_if`` did not hold in the
    run, "not this case" (``not_this_case``)."""
    label = params.label(kind) if isinstance(params, CheckParams) else kind
    started = time.perf_counter()
    try:
        skipped = not_for_server(params, run) or not_for_subject(params, run) or not_this_case(params, history)
        result = skipped if skipped is not None else REGISTRY[kind].fn(params, history, run)
        if not isinstance(result, CheckResult) or result.valid not in (True, False, "unknown"):
            raise TypeError(f"check {kind!r} returned {result!r}, not a CheckResult")
    except Exception as exc:  # noqa: BLE001 - rule: a check that raises is "unknown"
        result = CheckResult(
            "unknown",
            f"check raised {type(exc).__name__}: {exc}",
            {"traceback": traceback.format_exc()},
        )
    return NamedResult(
        index=index,
        kind=kind,
        name=label,
        valid=result.valid,
        summary=result.summary,
        details=result.details,
        marks=result.marks,
        seconds=time.perf_counter() - started,
    )


# --- helpers shared by check modules -------------------------------------------------


def resolve_ref(ref: Ref, history: History) -> Entry | None:
    """The entry a reference points at, or None when it never happened."""
    if ref.fault is not None:  # when it was injected: its inject's invocation, or its answer (at: landed)
        windows = history.fault_windows(ref.fault)
        if ref.at == "landed":
            found = [history[w.answer_index] for w in windows if w.injected and w.answer_index >= 0]
        else:
            found = [history[w.index] for w in windows]
    elif ref.mark is not None:
        found = history.select(actor="harness", f="mark", where={"mark": ref.mark})
    elif ref.event is None:
        found = history.select(actor=ref.process, f="start", type="ok")
    else:
        found = history.select(actor=ref.process, f=ref.event, where=ref.where)
    if not found:
        return None
    return found[0] if ref.occurrence == "first" else found[-1]


def process_start(history: History, process: str) -> Entry | None:
    return history.first(actor=process, f="start", type="ok")


def source_matches(history: History, reported: Any, process: str) -> bool:
    """Whether a reader's reported source (process name, agent name or worker id) is ``process``."""
    if reported is None:
        return False
    text = str(reported)
    if text == process:
        return True
    for entry in history.select(actor=process, f=("agent_ready", "published", "started")):
        for key in ("agent_name", "worker_id", "mx_source_id"):
            if key in entry.value and str(entry.value[key]) == text:
                return True
    return text.startswith(process + "-") or text.startswith(process + "/")


def ref_or_start(ref: Ref | None, history: History, process: str) -> tuple[float | None, str]:
    """The time a window starts: ``ref`` when given, else the process's first start."""
    if ref is not None:
        entry = resolve_ref(ref, history)
        return (entry.t if entry else None), ref.describe()
    entry = process_start(history, process)
    return (entry.t if entry else None), f"{process} start"


def truthy_integrity(value: Any) -> bool | None:
    """load_done's ``integrity`` as a bool (accepts a bool or an ``{"ok": ...}`` object)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("ok"), bool):
        return bool(value["ok"])
    if isinstance(value, str) and value.lower() in ("ok", "verified", "true", "pass"):
        return True
    if isinstance(value, str) and value.lower() in ("bad", "failed", "false", "fail", "mismatch"):
        return False
    return None


def _discover() -> None:
    for module in pkgutil.iter_modules(__path__):
        if not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")


_discover()
