"""A donor's refit, asked of a source: the ``drain`` fault.

A source started with ``options: {debug_hooks: true}`` takes SIGHUP as a refit (an RL weight
update): it stops admitting tensor read leases, waits for the live ones to be given back or run
out (bounded by its ``drain_timeout``), rewrites its weights and admits leases again; each step
is an event (``drain_started``, then ``drain_done`` and ``refit``, or ``drain_timed_out``).
``drain`` sends the SIGHUP to the source process only (not its group) and waits, bounded by
``confirm``, for ``drain_started``; how the drain ends is the scenario's to await and judge.
Nothing to heal: a drain ends by itself, within its timeout, and re-opens admission either way.

Its witness (recorded at the inject): the drain began (the ``drain_started`` the harness's
timeline received from the incarnation it signalled), what it had to wait for (its ``live``
leases), and the target's state as the harness reads it: the process catches SIGHUP
(``SigCgt`` in ``/proc/PID/status``, read before the signal: one that does not would be ended
by it) and is still running once the drain began. A drain with no live lease waited for
nothing: no effect. A target on an ssh host has its state unread (the events still count).
A drain that never began (no ``drain_started`` within ``confirm``: its signal landed nowhere)
fails its step and records a witness of no effect with that failure (``never_began``), so the
run is NOT EXERCISED with the failed step still named, not a FAIL of the system. Its record says
where the SIGHUP went, read by the harness in ``/proc/PID/status`` once ``confirm`` ran out
(``hup_state``): still pending (``SigPnd``/``ShdPnd``: delivered, never taken, as by a stopped
process, state ``T``, or one that blocks it, ``SigBlk``), ignored (``SigIgn``: the kernel
discarded it), or taken by the target's handler (``SigCgt``, no longer pending) that began no
drain: an undelivered signal and a source that ignored it are told apart. On an ssh host it is
unread.

Limit: as with ``corrupt``, the wait matches any ``drain_started`` of the current incarnation,
so a second drain of the same incarnation is confirmed by the first one's event.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from harness.errors import FaultError
from harness.faults import Fault, FaultContext, FaultSpec, Injected, process_of, register
from harness.faults.corrupt import hooked_source_issues
from harness.record.witness import Witness
from harness.spec import Duration, Target

__all__ = ["Drain", "DrainSpec", "SignalState", "catches", "confirmed", "drain_witness", "hup_state", "never_began",
           "signal_refit"]

REFIT = int(signal.SIGHUP)
EVENT = "drain_started"


class RefitSpec(FaultSpec):
    """A fault that asks one source's refit (SIGHUP to a source with ``debug_hooks``) and waits
    ``confirm`` for the event that says it began: the drain's and the grow fault's shared shape."""

    target: Target
    confirm: Duration = 10.0

    def process_refs(self) -> tuple[str, ...]:
        return (process_of(self.target),)

    def running_refs(self) -> tuple[Target, ...]:
        return (self.target,)


class DrainSpec(RefitSpec):
    """Ask a source (``options: {debug_hooks: true}``) to refit: drain its tensor read leases,
    rewrite its weights, admit leases again. ``confirm``: how long to wait for ``drain_started``."""

    kind: Literal["drain"]

    def process_issues(self, processes: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
        return hooked_source_issues("drain", self.target, processes, "drains a source's tensor read leases",
                                    "asks a source's refit")


def catches(pid: int, sig: int, proc: Path = Path("/proc")) -> bool | None:
    """Whether ``pid`` has a handler for ``sig`` (its ``SigCgt`` mask); None when unreadable."""
    try:
        status = (proc / str(pid) / "status").read_text()
    except OSError:
        return None
    found = re.search(r"^SigCgt:\s*([0-9a-fA-F]+)", status, re.M)
    return None if found is None else bool(int(found[1], 16) >> (sig - 1) & 1)


@dataclass(frozen=True)
class SignalState:
    """Where one signal stands in a process, as its ``/proc/PID/status`` shows it."""

    state: str  # the process's state letter (``T``: stopped)
    pending: bool  # in SigPnd (the thread's) or ShdPnd (the process's): delivered, not yet taken
    blocked: bool  # SigBlk
    ignored: bool  # SigIgn: the kernel discards it
    caught: bool  # SigCgt: a handler takes it

    def where(self, sig: int, what: str = "drain") -> str:
        """Where the signal went, in words (``what``: the act its handler should have begun)."""
        name = signal.Signals(sig).name
        if self.pending:
            why = ("the process is stopped (state T)" if self.state in ("T", "t")
                   else "it blocks the signal" if self.blocked else f"state {self.state}")
            return f"its {name} is still pending, never taken ({why})"
        if self.ignored:
            return f"it ignores {name} (SigIgn): the kernel discarded it"
        if self.caught:
            return f"its {name} was taken by its handler, which began no {what}"
        return f"its {name} is neither pending, ignored nor caught (state {self.state})"


def hup_state(pid: int, sig: int = REFIT, proc: Path = Path("/proc")) -> SignalState | None:
    """Where ``sig`` stands in ``pid`` (None when its status is unreadable: gone, or not here)."""
    try:
        status = (proc / str(pid) / "status").read_text()
    except OSError:
        return None
    masks: dict[str, bool] = {}
    for key in ("SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt"):
        found = re.search(rf"^{key}:\s*([0-9a-fA-F]+)", status, re.M)
        if found is None:
            return None
        masks[key] = bool(int(found[1], 16) >> (sig - 1) & 1)
    state = re.search(r"^State:\s*(\S)", status, re.M)
    return SignalState(state[1] if state else "?", masks["SigPnd"] or masks["ShdPnd"], masks["SigBlk"],
                       masks["SigIgn"], masks["SigCgt"])


def drain_witness(target: str, pid: int, started: Mapping[str, Any], caught: bool | None, alive: bool | None) -> Witness:
    """What the drain did: it began (``started``, the event the timeline received), what it
    waited for (its live leases), the target catching SIGHUP and alive after it."""
    live = started.get("live")
    figures = {"pid": pid, "live": live, "timeout_s": started.get("timeout_s"), "catches_sighup": caught,
               "alive": alive}
    if caught is False or alive is False:
        return Witness.none(f"{target} (pid {pid}) " + ("has no SIGHUP handler" if caught is False
                                                         else "ended as its drain began"), **figures)
    if not isinstance(live, int):
        return Witness.unwitnessed(f"{target}'s drain_started carries no live lease count", **figures)
    said = f"{target} (pid {pid}) began its drain with {live} live leases to wait for"
    state = "" if caught is None else ", catching SIGHUP and running"
    return (Witness.seen if live else Witness.none)(said + state, **figures)


def never_began(target: str, pid: int, waited: float, caught: bool | None, alive: bool | None,
                hup: SignalState | None = None, event: str = EVENT, what: str = "drain") -> Witness:
    """A drain (``what``) whose ``event`` (``drain_started``) never came within ``waited`` seconds:
    it landed nowhere (no effect), recorded with the inject's failure so the run is NOT EXERCISED,
    not a FAIL. ``hup``: where the SIGHUP went (``hup_state``, read after the wait; None: unread)."""
    figures: dict[str, Any] = {"pid": pid, "live": None, "waited_s": waited, "catches_sighup": caught,
                               "alive": alive, "drain_started": False,
                               "hup_pending": None if hup is None else hup.pending,
                               "hup_ignored": None if hup is None else hup.ignored,
                               "hup_state": None if hup is None else hup.state}
    state = "" if alive is None else (", still running" if alive else ", no longer running")
    where = "" if hup is None or not alive else f": {hup.where(REFIT, what)}"
    return Witness.none(f"{target} (pid {pid}) never began a {what}: no {event} within {waited:g}s{state}{where}",
                        **figures)


def confirmed(ctx: FaultContext, target: str, pid: int, confirm: float, caught: bool | None, local: bool,
              event: str = EVENT, what: str = "drain") -> Mapping[str, Any]:
    """The ``event`` the signalled incarnation ``pid`` emits within ``confirm``; none: the step
    fails with a witness of no effect (``never_began``) saying where the SIGHUP went."""
    try:
        return ctx.wait_event(target, event, {}, confirm)
    except FaultError as exc:
        view = ctx.proc(target)
        alive = (view.alive and view.pid == pid) if local else None
        hup = hup_state(pid) if local and alive else None
        missed = never_began(target, pid, confirm, caught, alive, hup, event, what)
        raise FaultError(str(exc), witness=missed.to_json()) from None


def signal_refit(ctx: FaultContext, target: str, confirm: float, event: str = EVENT,
                 what: str = "drain") -> tuple[int, Mapping[str, Any], bool | None, bool | None]:
    """A refit's SIGHUP to ``target`` alone, and what came of it: (the signalled pid, its ``event``
    within ``confirm`` (``confirmed``: none fails the step), whether it caught SIGHUP before the
    signal, whether that incarnation still runs after); the last two None on an ssh host."""
    local = ctx.locate(target).kind != "ssh"
    before = ctx.proc(target).pid
    caught = catches(before, REFIT) if local and before is not None else None
    pid = ctx.send_signal(target, REFIT, group=False)
    started = confirmed(ctx, target, pid, confirm, caught, local, event, what)
    view = ctx.proc(target)
    alive = (view.alive and view.pid == pid) if local else None
    return pid, started, caught, alive


@register
class Drain(Fault[DrainSpec, None]):
    kind = "drain"
    Spec = DrainSpec

    def inject(self, ctx: FaultContext) -> Injected[None]:
        target = ctx.resolve(self.spec.target)
        pid, started, caught, alive = signal_refit(ctx, target, self.spec.confirm)
        witness = drain_witness(target, pid, started, caught, alive)
        return Injected(None, {"target": target, "pid": pid, "signal": "SIGHUP", "live": started.get("live"),
                               "timeout_s": started.get("timeout_s"), "confirmed_t": started.get("t"),
                               "witness": witness.to_json()})
