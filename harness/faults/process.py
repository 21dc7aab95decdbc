"""Process faults: kill (any signal), pause/resume, graceful stop, restart, depart.

All act on the target's current incarnation through ``FaultContext``; by default
on its whole process group (each scenario process is started in its own session,
so helpers it spawned are hit too). Only ``pause`` has something to heal: its token is the
pid it stopped, so heal resumes that process, not a later incarnation of the target. The
others are done once done (a killed process stays dead), so their token is None.

``kill``, ``pause`` and ``depart`` need their target running (``running_refs``: a target that
is gone is the nemesis's ``if_gone`` outcome); ``stop`` of a process already gone records
``already_exited``, and ``restart`` of one starts it again.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from harness.errors import FaultError
from harness.faults import Fault, FaultContext, FaultSpec, Injected, Signal, process_of, register
from harness.spec import Duration, Name, Scalar, Target

__all__ = ["Depart", "Kill", "Pause", "Paused", "Restart", "Stop"]


def _signame(sig: int) -> str:
    return signal.Signals(sig).name


class KillSpec(FaultSpec):
    """Send ``signal`` (default KILL) to the target. Nothing to heal."""

    kind: Literal["kill"]
    target: Target
    signal: Signal = int(signal.SIGKILL)
    group: bool = True

    def process_refs(self) -> tuple[str, ...]:
        return (process_of(self.target),)

    def running_refs(self) -> tuple[Target, ...]:
        return (self.target,)


@register
class Kill(Fault[KillSpec, None]):
    kind = "kill"
    Spec = KillSpec

    def inject(self, ctx: FaultContext) -> Injected[None]:
        target = ctx.resolve(self.spec.target)
        pid = ctx.send_signal(target, self.spec.signal, group=self.spec.group)
        return Injected(None, {"target": target, "pid": pid, "signal": _signame(self.spec.signal)})


class PauseSpec(FaultSpec):
    """SIGSTOP the target; heal (or ``duration``) sends SIGCONT to the same pid."""

    kind: Literal["pause"]
    target: Target
    group: bool = True

    def process_refs(self) -> tuple[str, ...]:
        return (process_of(self.target),)

    def running_refs(self) -> tuple[Target, ...]:
        return (self.target,)


@dataclass(frozen=True)
class Paused:
    """The process a pause stopped: heal resumes this pid (its group when ``group``)."""

    target: str
    pid: int
    group: bool


@register
class Pause(Fault[PauseSpec, Paused]):
    kind = "pause"
    Spec = PauseSpec
    healable = True

    def inject(self, ctx: FaultContext) -> Injected[Paused]:
        group = self.spec.group
        target = ctx.resolve(self.spec.target)
        pid = ctx.proc(target).pid  # the incarnation about to be stopped
        try:
            stopped = ctx.send_signal(target, signal.SIGSTOP, group=group)
        except FaultError:
            raise  # nothing was sent
        except BaseException:  # interrupted: the SIGSTOP may have landed; resume it
            if pid is not None:
                ctx.signal_pid(pid, signal.SIGCONT, group=group)
            raise
        return Injected(Paused(target, stopped, group), {"target": target, "pid": stopped, "signal": "SIGSTOP"})

    def heal(self, ctx: FaultContext, token: Paused) -> dict[str, Any] | None:
        resumed = ctx.signal_pid(token.pid, signal.SIGCONT, group=token.group)
        return {"target": token.target, "pid": token.pid, "signal": "SIGCONT", "resumed": resumed}


class StopSpec(FaultSpec):
    """Graceful stop: TERM, wait ``grace``, then KILL (the escalation is recorded)."""

    kind: Literal["stop"]
    target: Target
    grace: Duration = 5.0

    def process_refs(self) -> tuple[str, ...]:
        return (process_of(self.target),)


@register
class Stop(Fault[StopSpec, None]):
    kind = "stop"
    Spec = StopSpec

    def inject(self, ctx: FaultContext) -> Injected[None]:
        target = ctx.resolve(self.spec.target)
        return Injected(None, {"target": target, **ctx.stop(target, self.spec.grace)})


class RestartSpec(FaultSpec):
    """Stop the target (gracefully, or with ``signal``), wait ``delay``, start a new incarnation."""

    kind: Literal["restart"]
    target: Target
    grace: Duration = 5.0
    signal: Signal | None = None
    delay: Duration | None = None

    def process_refs(self) -> tuple[str, ...]:
        return (process_of(self.target),)


@register
class Restart(Fault[RestartSpec, None]):
    kind = "restart"
    Spec = RestartSpec

    def inject(self, ctx: FaultContext) -> Injected[None]:
        spec = self.spec
        target = ctx.resolve(spec.target)
        value: dict[str, Any] = {"target": target}
        if spec.signal is not None and ctx.proc(target).alive:
            value["pid"] = ctx.send_signal(target, spec.signal)
            value["signal"] = _signame(spec.signal)
        value["stopped"] = ctx.stop(target, spec.grace)
        if spec.delay:
            ctx.sleep(spec.delay)
        value["started"] = ctx.start(target)
        return Injected(None, value)


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

    def process_refs(self) -> tuple[str, ...]:
        return (self.target,)

    def running_refs(self) -> tuple[Target, ...]:
        return (self.target,)


@register
class Depart(Fault[DepartSpec, None]):
    kind = "depart"
    Spec = DepartSpec

    def inject(self, ctx: FaultContext) -> Injected[None]:
        spec = self.spec
        seen = ctx.wait_event(spec.target, spec.after, spec.where, spec.within)
        was_alive = ctx.proc(spec.target).alive
        pid = ctx.send_signal(spec.target, spec.signal)
        return Injected(None, {
            "target": spec.target,
            "pid": pid,
            "signal": _signame(spec.signal),
            "after": spec.after,
            "after_t": seen.get("t"),
            "alive_at_kill": was_alive,
        })
