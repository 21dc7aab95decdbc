"""NIXL's resources given back: ``nixl_balance``.

mxref's resource audit (``mxref.audit``) counts, per agent, transfer handles, prepared descriptor
lists, memory registrations and loaded remote agents, made and released. A failed READ's
``transfer_timeout``/``transfer_error`` carries what its agent still holds (``handles_open``,
``dlists_open``); each dropped agent says what it made, released and left open (``nixl_audit``).
Dropping an agent releases what was forgotten without a word, so the balance is the only place
a forgotten handle or an undisconnected peer shows.
"""

from __future__ import annotations

from collections.abc import Iterable

from harness.checks import CheckParams, CheckResult, RunFacts, register
from harness.record.timeline import Entry, History
from harness.spec import Name

FAILURES = ("transfer_timeout", "transfer_error")
# what a failed READ must have given back by the time it is reported (peers and registrations go
# with the rollback that follows, which the next nixl_audit judges)
AFTER_FAILURE = ("handles_open", "dlists_open")
# a process that made an agent or began a READ used NIXL
USED_NIXL = ("agent_ready", "transfer_start")


class NixlBalanceParams(CheckParams):
    """Every NIXL agent of ``processes`` (default: every reader) gave back all it made: each
    ``nixl_audit`` shows nothing open, each failed READ had released its handles and descriptor
    lists when reported, a balance followed each failure (the attempt's rollback), and a process
    that used NIXL and exited 0 dropped its agent with a balance. Unknown when no judged process
    dropped an agent.

    Every run gets this check implicitly (``Scenario.judged_entries``) over its sources and readers
    when its file does not state one: ``implicit`` then excuses a failure with no balance after it
    when its process was killed before it could give one (no exit of its own after the failure),
    and passes, saying so, when no judged process dropped an agent. ``not_audited``: processes
    played by a subject that emits no audit (ModelExpress's client), named as not judged (a stated
    check's processes that another subject plays are too: ``RunFacts.players``); with nothing else
    to judge the check passes saying "not observable", naming the gap. ``departs``: readers that leave without a NIXL
    teardown by design (``skip_release``), named as not judged."""

    processes: tuple[Name, ...] = ()
    implicit: bool = False
    not_audited: tuple[Name, ...] = ()
    departs: tuple[Name, ...] = ()

    def process_refs(self) -> Iterable[tuple[str, str, tuple[str, ...] | None]]:
        for key, names in (("processes", self.processes), ("not_audited", self.not_audited),
                           ("departs", self.departs)):
            for i, name in enumerate(names):
                yield f"{key}[{i}]", name, ("source", "reader")


@register("nixl_balance", NixlBalanceParams)
def nixl_balance(p: NixlBalanceParams, h: History, run: RunFacts) -> CheckResult:
    """Reads each judged process's ``nixl_audit`` events and its failed READs' ``*_open`` fields."""
    asked = list(p.processes) or ([] if p.implicit else run.processes("reader"))
    names = [n for n in asked if run.played_by(n) == "mxref"]
    not_audited = {**{n: run.played_by(n) for n in p.not_audited}, **{n: run.played_by(n) for n in asked if n not in names}}
    gap = "; ".join(filter(None, [
        ", ".join(f"{n} (played by {s})" for n, s in not_audited.items()) + " not judged: only mxref emits a NIXL audit"
        if not_audited else "",
        f"{', '.join(p.departs)} not judged: they leave without a NIXL teardown by design (skip_release)"
        if p.departs else ""]))
    if not names:
        if not_audited:  # what the subject cannot show is named, never failed nor left unknown
            return CheckResult(True, f"not observable: {gap}; nothing judged", {"not_audited": not_audited,
                                                                                "departs": list(p.departs)})
        return CheckResult("unknown", gap or "no source or reader to judge", {"departs": list(p.departs)})
    problems: list[str] = []
    balances: dict[str, list[dict[str, int]]] = {}
    failures = 0
    for name in names:
        audits = h.select(actor=name, f="nixl_audit")
        balances[name] = [dict(a.get("open") or {}) for a in audits]
        for a in audits:
            left = {k: v for k, v in dict(a.get("open") or {}).items() if v}
            if left:
                problems.append(f"{name}: agent {a.get('agent_name')} dropped with {_words(left)} open")
        exits = h.select(actor=name, f="exit")
        for f in h.select(actor=name, f=FAILURES):
            failures += 1
            held = {k.removesuffix("_open"): f.get(k) for k in AFTER_FAILURE if f.get(k)}
            if held:
                problems.append(f"{name}: {f.f} at {f.t:.3f}s with {_words(held)} still open")
            killed = not any(e.t > f.t for e in exits)  # it never exited on its own afterwards
            if not any(a.t > f.t for a in audits) and not (p.implicit and killed):
                problems.append(f"{name}: no balance (nixl_audit) after the {f.f} at {f.t:.3f}s")
        problems += _unbalanced_exits(name, h, audits, exits)
    details = {"open": balances, "failures": failures, "not_audited": not_audited, "departs": list(p.departs)}
    if problems:
        return CheckResult(False, "; ".join(problems[:5]), details)
    agents = sum(len(v) for v in balances.values())
    tail = f"; {gap}" if gap else ""
    if not agents:
        nothing = f"no agent of {', '.join(names)} was dropped (no nixl_audit)"
        if p.implicit:
            return CheckResult(True, f"nothing to balance: {nothing}; none exited 0 after using NIXL{tail}", details)
        return CheckResult("unknown", nothing + tail, details)
    return CheckResult(True, f"{agents} agent(s) dropped with nothing open, {failures} failed READ(s) released{tail}",
                       details)


def _unbalanced_exits(name: str, h: History, audits: list[Entry], exits: list[Entry]) -> list[str]:
    """A process that used NIXL (made an agent, or began a READ) and exited 0 must have dropped its
    agent with a balance before that exit: a shutdown that skips it hides whatever it leaked."""
    problems = []
    used = h.select(actor=name, f=USED_NIXL)
    since = float("-inf")  # the incarnation's start: the previous exit
    for e in exits:
        began, since = since, e.t
        if e.get("code") != 0 or not any(began < u.t < e.t for u in used):
            continue
        if not any(began < a.t <= e.t for a in audits):
            problems.append(f"{name}: exited 0 at {e.t:.3f}s after using NIXL without a balance (nixl_audit)")
    return problems


def _words(counts: dict[str, object]) -> str:
    return ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
