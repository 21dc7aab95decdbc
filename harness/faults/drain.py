"""A donor's refit, asked of a source: the ``drain`` fault.

A source started with ``options: {debug_hooks: true}`` takes SIGHUP as a refit (an RL weight
update): it stops admitting tensor read leases, waits for the live ones to be given back or run
out (bounded by its ``drain_timeout``), rewrites its weights and admits leases again; each step
is an event (``drain_started``, then ``drain_done`` and ``refit``, or ``drain_timed_out``).
``drain`` sends the SIGHUP to the source process only (not its group) and waits, bounded by
``confirm``, for ``drain_started``; how the drain ends is the scenario's to await and judge.
Nothing to heal: a drain ends by itself, within its timeout, and re-opens admission either way.

Limit: as with ``corrupt``, the wait matches any ``drain_started`` of the current incarnation,
so a second drain of the same incarnation is confirmed by the first one's event.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from typing import Any, Literal

from harness.faults import Fault, FaultContext, FaultSpec, Injected, process_of, register
from harness.faults.corrupt import hooked_source_issues
from harness.spec import Duration, Target

__all__ = ["Drain", "DrainSpec"]

REFIT = int(signal.SIGHUP)
EVENT = "drain_started"


class DrainSpec(FaultSpec):
    """Ask a source (``options: {debug_hooks: true}``) to refit: drain its tensor read leases,
    rewrite its weights, admit leases again. ``confirm``: how long to wait for ``drain_started``."""

    kind: Literal["drain"]
    target: Target
    confirm: Duration = 10.0

    def process_refs(self) -> tuple[str, ...]:
        return (process_of(self.target),)

    def running_refs(self) -> tuple[Target, ...]:
        return (self.target,)

    def process_issues(self, processes: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
        return hooked_source_issues("drain", self.target, processes, "drains a source's tensor read leases",
                                    "asks a source's refit")


@register
class Drain(Fault[DrainSpec, None]):
    kind = "drain"
    Spec = DrainSpec

    def inject(self, ctx: FaultContext) -> Injected[None]:
        target = ctx.resolve(self.spec.target)
        pid = ctx.send_signal(target, REFIT, group=False)
        started = ctx.wait_event(target, EVENT, {}, self.spec.confirm)
        return Injected(None, {"target": target, "pid": pid, "signal": "SIGHUP", "live": started.get("live"),
                               "timeout_s": started.get("timeout_s"), "confirmed_t": started.get("t")})
