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
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from harness.errors import FaultError
from harness.faults import Fault, FaultContext, FaultSpec, Injected, Signal, process_of, register
from harness.record.witness import Witness
from harness.spec import Duration, Name, Scalar, Target

__all__ = ["Depart", "Kill", "Pause", "Paused", "Restart", "Stop"]


def _signame(sig: int) -> str:
    return signal.Signals(sig).name


PROC = Path("/proc")
STOP_SETTLE_S = 0.5  # how long a pause's witness waits for every thread to reach state T


def thread_states(pid: int, proc: Path | None = None) -> Counter[str] | None:
    """The scheduler state of each thread of ``pid`` (``/proc/PID/task/*/stat``, the letter after
    the command's closing parenthesis) counted; None when the process is gone."""
    counts: Counter[str] = Counter()
    try:
        tasks = list(((proc or PROC) / str(pid) / "task").iterdir())
    except OSError:
        return None
    for task in tasks:
        try:
            stat = (task / "stat").read_text(encoding="ascii", errors="replace")
        except OSError:
            continue  # a thread that ended meanwhile
        tail = stat[stat.rfind(")") + 1:].split()
        if tail:
            counts[tail[0]] += 1
    return counts if counts else None


def _stopped(states: Counter[str]) -> bool:
    return all(state in ("T", "t") for state in states)


def pause_witness(pid: int, *, settle: float = 0.0, proc: Path | None = None) -> Witness:
    """Whether every thread of ``pid`` is stopped (state T), waiting up to ``settle`` seconds for
    the last of them to get there (a SIGSTOP reaches each thread in turn)."""
    deadline = time.monotonic() + settle
    while True:
        states = thread_states(pid, proc)
        if states is None:
            return Witness.unwitnessed(f"pid {pid} is gone: its threads cannot be read", pid=pid)
        if _stopped(states) or time.monotonic() >= deadline:
            break
        time.sleep(0.005)
    figures = {"pid": pid, "threads": sum(states.values()), "stopped": states["T"] + states["t"],
               "states": dict(sorted(states.items()))}
    if _stopped(states):
        return Witness.seen(f"all {figures['threads']} threads of pid {pid} in state T", **figures)
    return Witness.none(f"{figures['stopped']} of {figures['threads']} threads of pid {pid} in state T", **figures)


def _local(ctx: FaultContext, target: str) -> str | None:
    """Why the target's /proc cannot be read from here (it runs on an ssh host), else None."""
    host = ctx.locate(target)
    return None if host.kind != "ssh" else f"{target} runs on ssh host {host.name}: its /proc is not read from here"


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
    remote: str | None = None  # why its threads cannot be read from here (an ssh host)


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
        remote = _local(ctx, target)
        witness = Witness.unwitnessed(remote) if remote else pause_witness(stopped, settle=STOP_SETTLE_S)
        return Injected(Paused(target, stopped, group, remote), {
            "target": target, "pid": stopped, "signal": "SIGSTOP", "witness": witness.to_json()})

    def heal(self, ctx: FaultContext, token: Paused) -> dict[str, Any] | None:
        # measured before the SIGCONT: did it hold until now (nothing else resumed it)?
        witness = Witness.unwitnessed(token.remote) if token.remote else pause_witness(token.pid)
        resumed = ctx.signal_pid(token.pid, signal.SIGCONT, group=token.group)
        return {"target": token.target, "pid": token.pid, "signal": "SIGCONT", "resumed": resumed,
                "witness": witness.to_json()}


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
        stopped = ctx.stop(target, self.spec.grace)
        return Injected(None, {"target": target, **stopped, "witness": stop_witness(target, stopped).to_json()})


def stop_witness(target: str, stopped: dict[str, Any]) -> Witness:
    """A stop's effect, as the harness saw it end (its wait status), not as it said."""
    if stopped.get("already_exited"):
        return Witness.none(f"{target} had already exited: nothing to stop")
    rc = stopped.get("rc")
    return Witness.seen(f"{target} (pid {stopped.get('pid')}) ended, rc {rc}", pid=stopped.get("pid"), rc=rc,
                        escalated=bool(stopped.get("escalated")))


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
        started = ctx.proc(target)
        if value["stopped"].get("already_exited"):
            witness = Witness.none(f"{target} had already exited: a start, not a restart", incarnation=started.incarnation)
        else:
            witness = Witness.seen(f"{target} ended (rc {value['stopped'].get('rc')}) and incarnation "
                                   f"{started.incarnation} started (pid {started.pid})",
                                   rc=value["stopped"].get("rc"), incarnation=started.incarnation, pid=started.pid)
        value["witness"] = witness.to_json()
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
