"""The first stage of a verdict: did the scenario happen? Each fault's witness, read from the run.

Most kinds record their witness themselves, at inject and at heal (``harness.record.witness``).
A ``kill`` or ``depart`` is a one-shot whose effect comes later: the harness's own record of
the target's exit (its wait status, ``History.incarnations``) is its witness, read here. A
run one of whose injected faults shows no effect (``none``) did not exercise what it claims:
``not_exercised`` names each such fault with its witness, and the verdict is NOT EXERCISED
(``harness.judge.verdict``). A fault the scenario marks ``expect_effect: false`` (a negative
control) is the other way round: an effect is what makes it not exercised.
"""

from __future__ import annotations

import signal

from harness.record.fault_windows import FaultWindow
from harness.record.timeline import History
from harness.record.witness import Witness

__all__ = ["LETHAL", "fault_witness", "not_exercised"]

# signals whose default action ends a process (one it handles may still end it, or not)
LETHAL = frozenset({"SIGKILL", "SIGTERM", "SIGINT", "SIGQUIT", "SIGABRT", "SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL",
                    "SIGHUP", "SIGPIPE", "SIGALRM", "SIGUSR1", "SIGUSR2", "SIGSYS", "SIGTRAP", "SIGXCPU", "SIGXFSZ"})
_KILLS = ("kill", "depart")


def _exit_witness(window: FaultWindow, history: History) -> Witness:
    """A kill's effect: the target's incarnation it signalled ended after it (by that signal)."""
    pid, sig, target = window.value.get("pid"), str(window.value.get("signal") or ""), window.resolved
    if sig not in LETHAL:
        return Witness("unwitnessed", f"{sig or 'its signal'} need not end a process", {"pid": pid}, "run")
    at = window.inject_t if window.inject_t is not None else window.start
    for inc in history.incarnations(target):
        if inc.pid != pid:
            continue
        if inc.end is None:
            return Witness("none", f"{target} (pid {pid}) was still running when the run's record ended",
                           {"pid": pid}, "run")
        after = round(inc.end - at, 3)
        if inc.stopped_by_harness:
            return Witness("none", f"{target} (pid {pid}) outlived the {sig}: the harness stopped it {after:g}s later",
                           {"pid": pid, "rc": inc.rc, "after_s": after}, "run")
        by = -int(inc.rc) == int(signal.Signals[sig]) if isinstance(inc.rc, int) else False
        how = f"by {sig}" if by else f"rc {inc.rc}"
        return Witness("seen", f"{target} (pid {pid}) exited {how} {after:g}s after it",
                       {"pid": pid, "rc": inc.rc, "after_s": after, "by_signal": by}, "run")
    return Witness("unwitnessed", f"no incarnation of {target} with pid {pid} in the record", {"pid": pid}, "run")


def fault_witness(window: FaultWindow, history: History) -> Witness | None:
    """What ``window``'s fault did, as measured: its recorded witnesses, or for a kill the
    target's exit; None when the fault recorded none (it did not inject, or predates witnesses).
    A failed inject is judged by the witness it recorded with its failure, if any: a fault that
    failed because it landed nowhere did not exercise the scenario (its step's failure is still
    reported: ``harness.judge.verdict.verdict_of`` puts NOT EXERCISED before a failed step)."""
    if not window.injected:
        return window.witness if window.outcome == "failed" else None
    if window.kind in _KILLS:
        return _exit_witness(window, history)
    if window.witness is None and window.outcome == "healed":
        return Witness("unwitnessed", f"a {window.kind} fault recorded no witness of its effect (a run recorded before it measured one)", {}, "run")
    return window.witness


def not_exercised(history: History) -> list[str]:
    """``fault NAME (KIND TARGET): no effect: <why>`` for each fault that did not do what the
    scenario meant it to (no effect; or an effect, for a negative control), in inject order."""
    found = []
    for window in history.fault_windows():
        witness = fault_witness(window, history)
        if witness is None or witness.effect == "unwitnessed":
            continue
        where = window.target
        name = f"fault {window.name} ({window.kind}" + (f" {where})" if where else ")")
        if window.expect_effect and witness.effect == "none":
            found.append(f"{name}: {witness.describe()}")
        elif not window.expect_effect and witness.effect == "seen":
            found.append(f"{name}, a negative control (expect_effect: false): {witness.describe()}")
    return found
