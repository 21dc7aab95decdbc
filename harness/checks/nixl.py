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
from harness.spec import Name
from harness.timeline import History

FAILURES = ("transfer_timeout", "transfer_error")
# what a failed READ must have given back by the time it is reported (peers and registrations go
# with the rollback that follows, which the next nixl_audit judges)
AFTER_FAILURE = ("handles_open", "dlists_open")


class NixlBalanceParams(CheckParams):
    """Every NIXL agent of ``processes`` (default: every reader) gave back all it made: each
    ``nixl_audit`` shows nothing open, each failed READ had released its handles and descriptor
    lists when reported, and a balance followed each failure (the attempt's rollback). Unknown
    when no judged process dropped an agent."""

    processes: tuple[Name, ...] = ()

    def process_refs(self) -> Iterable[tuple[str, str, tuple[str, ...] | None]]:
        for i, name in enumerate(self.processes):
            yield f"processes[{i}]", name, ("source", "reader")


@register("nixl_balance", NixlBalanceParams)
def nixl_balance(p: NixlBalanceParams, h: History, run: RunFacts) -> CheckResult:
    """Reads each judged process's ``nixl_audit`` events and its failed READs' ``*_open`` fields."""
    asked = list(p.processes) or run.processes("reader")
    names = [n for n in asked if run.played_by(n) == "mxref"]
    unobserved = {n: run.played_by(n) for n in asked if n not in names}
    if asked and not names:
        return CheckResult(True, "not observable: " + ", ".join(f"{n} is played by {s}" for n, s in unobserved.items())
                           + ", which reports no NIXL resource audit (nothing judged)", {"not_observed": unobserved})
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
        for f in h.select(actor=name, f=FAILURES):
            failures += 1
            held = {k.removesuffix("_open"): f.get(k) for k in AFTER_FAILURE if f.get(k)}
            if held:
                problems.append(f"{name}: {f.f} at {f.t:.3f}s with {_words(held)} still open")
            if not any(a.t > f.t for a in audits):
                problems.append(f"{name}: no balance (nixl_audit) after the {f.f} at {f.t:.3f}s")
    details: dict[str, object] = {"open": balances, "failures": failures}
    if unobserved:
        details["not_observed"] = unobserved
    if problems:
        return CheckResult(False, "; ".join(problems[:5]), details)
    agents = sum(len(v) for v in balances.values())
    if not agents:
        return CheckResult("unknown", f"no agent of {', '.join(names) or 'no process'} was dropped (no nixl_audit)",
                           details)
    return CheckResult(True, f"{agents} agent(s) dropped with nothing open, {failures} failed READ(s) released", details)


def _words(counts: dict[str, object]) -> str:
    return ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
