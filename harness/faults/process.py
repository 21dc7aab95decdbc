"""Process faults: kill (any signal), pause/resume, graceful stop, restart, depart.

All act on the target's current incarnation through ``FaultContext``; by default
on its whole process group (each scenario process is started in its own session,
so helpers it spawned are hit too).
"""

from __future__ import annotations

import signal
from typing import Any, Literal

from pydantic import Field

from harness.faults import Fault, FaultContext, FaultSpec, Signal, register
from harness.spec import Duration, Name, Scalar, Target

__all__ = ["Depart", "Kill", "Pause", "Restart", "Stop"]


def _signame(sig: int) -> str:
    return signal.Signals(sig).name


class KillSpec(FaultSpec):
    """Send ``signal`` (default KILL) to the target. Nothing to heal."""

    kind: Literal["kill"]
    target: Target
    signal: Signal = int(signal.SIGKILL)
    group: bool = True


@register
class Kill(Fault):
    kind = "kill"
    Spec = KillSpec

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        spec: KillSpec = self.spec  # type: ignore[assignment]
        target = ctx.resolve(spec.target)
        pid = ctx.send_signal(target, spec.signal, group=spec.group)
        return {"target": target, "pid": pid, "signal": _signame(spec.signal)}


class PauseSpec(FaultSpec):
    """SIGSTOP the target; heal (or ``duration``) sends SIGCONT to the same pid."""

    kind: Literal["pause"]
    target: Target
    group: bool = True


@register
class Pause(Fault):
    kind = "pause"
    Spec = PauseSpec
    healable = True

    def __init__(self, spec: FaultSpec, name: str) -> None:
        super().__init__(spec, name)
        self._pid: int | None = None
        self._target: str | None = None

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        spec: PauseSpec = self.spec  # type: ignore[assignment]
        self._target = ctx.resolve(spec.target)
        self._pid = ctx.send_signal(self._target, signal.SIGSTOP, group=spec.group)
        return {"target": self._target, "pid": self._pid, "signal": "SIGSTOP"}

    def heal(self, ctx: FaultContext) -> dict[str, Any] | None:
        spec: PauseSpec = self.spec  # type: ignore[assignment]
        if self._pid is None:
            return None
        resumed = ctx.signal_pid(self._pid, signal.SIGCONT, group=spec.group)
        return {"target": self._target, "pid": self._pid, "signal": "SIGCONT", "resumed": resumed}


class StopSpec(FaultSpec):
    """Graceful stop: TERM, wait ``grace``, then KILL (the escalation is recorded)."""

    kind: Literal["stop"]
    target: Target
    grace: Duration = 5.0


@register
class Stop(Fault):
    kind = "stop"
    Spec = StopSpec

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        spec: StopSpec = self.spec  # type: ignore[assignment]
        target = ctx.resolve(spec.target)
        return {"target": target, **ctx.stop(target, spec.grace)}


class RestartSpec(FaultSpec):
    """Stop the target (gracefully, or with ``signal``), wait ``delay``, start a new incarnation."""

    kind: Literal["restart"]
    target: Target
    grace: Duration = 5.0
    signal: Signal | None = None
    delay: Duration | None = None


@register
class Restart(Fault):
    kind = "restart"
    Spec = RestartSpec

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        spec: RestartSpec = self.spec  # type: ignore[assignment]
        target = ctx.resolve(spec.target)
        value: dict[str, Any] = {"target": target}
        if spec.signal is not None and ctx.proc(target).alive:
            value["pid"] = ctx.send_signal(target, spec.signal)
            value["signal"] = _signame(spec.signal)
        value["stopped"] = ctx.stop(target, spec.grace)
        if spec.delay:
            ctx.sleep(spec.delay)
        value["started"] = ctx.start(target)
        return value


class DepartSpec(FaultSpec):
    """Kill the target right after it emits ``after`` (default ``load_done``): a reader that
    leaves without disconnecting from its source. Use with ``serve_after_load: true`` (or
    ``skip_release``) so the reader cannot release the source before the kill lands."""

    kind: Literal["depart"]
    target: Name
    after: str = "load_done"
    where: dict[str, Scalar] = Field(default_factory=dict)
    within: Duration = 60.0
    signal: Signal = int(signal.SIGKILL)


@register
class Depart(Fault):
    kind = "depart"
    Spec = DepartSpec

    def inject(self, ctx: FaultContext) -> dict[str, Any]:
        spec: DepartSpec = self.spec  # type: ignore[assignment]
        seen = ctx.wait_event(spec.target, spec.after, spec.where, spec.within)
        was_alive = ctx.proc(spec.target).alive
        pid = ctx.send_signal(spec.target, spec.signal)
        return {
            "target": spec.target,
            "pid": pid,
            "signal": _signame(spec.signal),
            "after": spec.after,
            "after_t": seen.get("t"),
            "alive_at_kill": was_alive,
        }
