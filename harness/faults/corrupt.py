"""Corruption of a source's registered memory: the ``corrupt`` fault.

A source started with ``options: {debug_hooks: true}`` toggles the corruption of the memory it
serves on SIGUSR2 (byte 0 of every tensor XORed with 0xFF; a second SIGUSR2 restores it) and
confirms each toggle with a ``debug_corrupt {corrupted, tensors}`` event. ``corrupt`` sends the
first SIGUSR2 to the source process only (not its group) and waits, bounded by ``confirm``, for
``corrupted: true``; heal sends the second to the pid it corrupted (its token) and waits for
``corrupted: false``. A process that is gone by then took its memory with it: nothing to restore.
A toggle that is not confirmed in time is toggled back before the error; an interrupt inside the
send is taken as landed, as ``pause`` takes it, and toggled back too.

Limit: the wait matches any such event of the current incarnation, so a second corruption of
the same incarnation is confirmed by the first one's event (the toggle itself still happens).
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from harness.errors import FaultError
from harness.faults import Fault, FaultContext, FaultSpec, Injected, process_of, register, undo_on_failure
from harness.spec import Duration, SourceOf, Target

__all__ = ["Corrupt", "CorruptSpec", "Corrupted", "hooked_source_issues"]

TOGGLE = int(signal.SIGUSR2)
EVENT = "debug_corrupt"


class CorruptSpec(FaultSpec):
    """Corrupt the memory a source serves (byte 0 of every tensor flipped) until healed; the
    target must be a source with ``options: {debug_hooks: true}`` (for ``{source_of: reader}``:
    every source). ``confirm``: how long to wait for the source to confirm each toggle."""

    kind: Literal["corrupt"]
    target: Target
    confirm: Duration = 10.0

    def process_refs(self) -> tuple[str, ...]:
        return (process_of(self.target),)

    def process_issues(self, processes: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
        return hooked_source_issues("corrupt", self.target, processes, "corrupts a source's memory",
                                    "toggles a source's memory")


def hooked_source_issues(kind: str, target: Target, processes: Mapping[str, Any], does: str,
                         acts: str) -> tuple[tuple[str, str], ...]:
    """The rule of a fault that acts through a source's debug hooks (``corrupt``, ``drain``): its
    target is a source started with ``options: {debug_hooks: true}`` (for ``{source_of: reader}``:
    every source). ``does``: what the fault does to a source; ``acts``: what it reaches through the
    hooks (both for the messages)."""
    if isinstance(target, SourceOf):
        sources = [n for n, p in processes.items() if getattr(p, "role", None) == "source"]
        off = [n for n in sources if not _hooked(processes[n])]
        if off:
            return (("target", f"a {kind} fault on {{source_of: {target.source_of}}} may hit any source, "
                     f"so every source needs `options: {{debug_hooks: true}}`, and {', '.join(off)} "
                     "has not"),)
        return ()
    spec = processes.get(target)
    if spec is None:
        return ()  # reported as a missing process already
    role = getattr(spec, "role", None)
    if role != "source":
        return (("target", f"a {kind} fault {does}, and {target!r} is a {role}"),)
    if not _hooked(spec):
        return (("target", f"a {kind} fault {acts} through its debug hooks, and "
                 f"{target!r} is not started with `options: {{debug_hooks: true}}`"),)
    return ()


def _hooked(process: Any) -> bool:
    return bool(getattr(getattr(process, "options", None), "debug_hooks", False))


@dataclass(frozen=True)
class Corrupted:
    """What heal restores: the source process and the pid whose memory was corrupted."""

    target: str
    pid: int


@register
class Corrupt(Fault[CorruptSpec, Corrupted]):
    kind = "corrupt"
    Spec = CorruptSpec
    healable = True

    def inject(self, ctx: FaultContext) -> Injected[Corrupted]:
        target = ctx.resolve(self.spec.target)
        before = ctx.proc(target).pid  # the incarnation about to be toggled
        try:
            pid = ctx.send_signal(target, TOGGLE, group=False)
        except FaultError:
            raise  # nothing was sent
        except BaseException:  # interrupted: taken as landed (as pause does); toggle it back
            if before is not None:
                ctx.signal_pid(before, TOGGLE, group=False)
            raise
        with undo_on_failure() as undo:
            undo.callback(ctx.signal_pid, pid, TOGGLE, group=False)  # sent: failing now means toggling back
            confirmed = ctx.wait_event(target, EVENT, {"corrupted": True}, self.spec.confirm)
        return Injected(
            Corrupted(target, pid),
            {"target": target, "pid": pid, "signal": "SIGUSR2", "tensors": confirmed.get("tensors"),
             "confirmed_t": confirmed.get("t")},
        )

    def heal(self, ctx: FaultContext, token: Corrupted) -> dict[str, Any] | None:
        if not ctx.signal_pid(token.pid, TOGGLE, group=False):
            return {"target": token.target, "pid": token.pid, "gone": True}
        try:
            restored = ctx.wait_event(token.target, EVENT, {"corrupted": False}, self.spec.confirm)
        except FaultError as exc:
            raise FaultError(f"{token.target} (pid {token.pid}) did not confirm its memory restored: {exc}") from None
        return {"target": token.target, "pid": token.pid, "restored": True, "tensors": restored.get("tensors")}
