"""Clock faults: a process whose monotonic clocks (``clock``) or wall clock (``wall_clock``)
are not the host's.

``clock`` stops the target (TERM, ``grace``, KILL) when it runs and starts its next incarnation
in a new time namespace (``unshare --time``) whose ``CLOCK_MONOTONIC`` runs ``monotonic`` ahead
of the host's (negative: behind) and ``CLOCK_BOOTTIME`` ``boottime`` ahead (default: the same
as ``monotonic``). That is the process a replica on another machine is: a host booted days
earlier or later, a container restored or a VM migrated onto a host whose clocks differ. Inside
one process nothing changes (intervals are differences); what breaks is any monotonic (or
boot-time) stamp that crosses a process boundary and is compared with another process's clock:
a stamp in a shared store, a deadline on the wire, an event on the harness's own timeline.

The harness set the offsets, so it takes them off that incarnation's event stamps itself
(``harness.hosts.clocks``), and still bounds every stamp by the incarnation's start and its receipt.
Nothing outlives the incarnation: the namespace ends with its last process, so there is nothing
to heal or sweep; a later start (a step, a ``restart``) is on the host's clocks again. Time
namespaces do not offset the wall clock (``CLOCK_REALTIME``). Needs root, ``unshare`` (util-
linux) and a kernel with time namespaces (5.6+). The kernel refuses an offset that would put a
clock below zero: a negative one must be smaller than the host's uptime, or the start fails
with unshare's word in the target's log.

``wall_clock`` restarts the target the same way with its wall clock (``CLOCK_REALTIME`` and
its kin: ``time.time()``) ``offset`` ahead or behind: libfaketime preloaded into it
(``LD_PRELOAD``, ``FAKETIME=-2``), its monotonic clocks left alone (``FAKETIME_DONT_FAKE_
MONOTONIC``), so its event stamps need no correction. That is a machine whose NTP is off: a
wall stamp it writes, or judges another's by, is skewed. Needs Debian's ``faketime`` (the
library only; a program that calls the kernel without libc, or is statically linked, is not
reached).

Both act where the target runs: its host wraps the start (``Host.wrap_clocks``), so on an ssh
host ``unshare`` and libfaketime are the host's, and ``requires`` is probed there instead
(``Clock.ssh_needs``: a uid-0 login for ``clock``).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, WithJsonSchema, model_validator

from harness.faults import Fault, FaultContext, FaultSpec, Injected, process_of, register
from harness.hosts.clocks import ClockOffsets
from harness.spec import Duration, Target, custom_error, parse_duration

__all__ = ["Clock", "ClockSpec", "WallClock", "WallClockSpec", "parse_offset", "restart_with"]

MAX_OFFSET_S = 10 * 365 * 86400.0  # ten years: far past any host's uptime, far inside the kernel's range
OFFSET_RULE = ("a clock offset is 0 or a whole number of seconds as a duration with an optional sign (+72h, "
               f"-90s, 1.5h, 3600), at most {MAX_OFFSET_S / 86400 / 365:g} years either way")


def parse_offset(value: Any) -> float:
    """Signed seconds from ``0`` / ``+72h`` / ``-90s`` / a number; an error naming the rule otherwise."""
    if isinstance(value, bool):
        raise custom_error("offset", OFFSET_RULE)
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        sign = -1.0 if text.startswith("-") else 1.0
        magnitude = text[1:] if text[:1] in "+-" and text else text
        if magnitude.strip() in ("0", "0s", "0.0"):
            return 0.0
        try:
            seconds = sign * parse_duration(magnitude)
        except ValueError:
            raise custom_error("offset", OFFSET_RULE) from None
    else:
        raise custom_error("offset", OFFSET_RULE)
    if not math.isfinite(seconds) or abs(seconds) > MAX_OFFSET_S or seconds != int(seconds):
        raise custom_error("offset", OFFSET_RULE)
    return seconds


Offset = Annotated[
    float,
    BeforeValidator(parse_offset),
    WithJsonSchema({"anyOf": [{"type": "number"}, {"type": "string"}], "description": OFFSET_RULE}),
]


class ClockSpec(FaultSpec):
    """(Re)start ``target`` with its ``CLOCK_MONOTONIC`` ``monotonic`` and its ``CLOCK_BOOTTIME``
    ``boottime`` (default: ``monotonic``) ahead of the host's; a running target is stopped
    first (TERM, ``grace``, KILL)."""

    kind: Literal["clock"]
    target: Target
    monotonic: Offset = 0.0
    boottime: Offset | None = None
    grace: Duration = 5.0

    @model_validator(mode="after")
    def _moves_a_clock(self) -> ClockSpec:
        if self.offsets().none:
            raise custom_error("monotonic", "a clock fault needs monotonic or boottime not 0 (e.g. monotonic: +72h)")
        return self

    def offsets(self) -> ClockOffsets:
        return ClockOffsets(self.monotonic, self.monotonic if self.boottime is None else self.boottime)

    def process_refs(self) -> tuple[str, ...]:
        return (process_of(self.target),)

    def started_refs(self) -> tuple[str, ...]:
        return (self.target,) if isinstance(self.target, str) else ()


def restart_with(ctx: FaultContext, target: Target, offsets: ClockOffsets, grace: float) -> Injected[None]:
    """Stop ``target`` if it runs (TERM, ``grace``, KILL) and start its next incarnation with
    ``offsets``; nothing to heal (the offsets end with the incarnation)."""
    name = ctx.resolve(target)
    value: dict[str, Any] = {"target": name, "clocks": offsets.record()}
    if ctx.proc(name).alive:
        value["stopped"] = ctx.stop(name, grace)
    value["started"] = ctx.start(name, offsets)
    return Injected(None, value)


@register
class Clock(Fault[ClockSpec, None]):
    kind = "clock"
    Spec = ClockSpec
    requires = ("root", "unshare", "timens")
    ssh_needs = ("root-login", "unshare", "timens")
    needs_on_target_host = True

    def inject(self, ctx: FaultContext) -> Injected[None]:
        return restart_with(ctx, self.spec.target, self.spec.offsets(), self.spec.grace)


class WallClockSpec(FaultSpec):
    """(Re)start ``target`` with its wall clock ``offset`` ahead of the host's (negative:
    behind); a running target is stopped first (TERM, ``grace``, KILL)."""

    kind: Literal["wall_clock"]
    target: Target
    offset: Offset
    grace: Duration = 5.0

    @model_validator(mode="after")
    def _moves_the_clock(self) -> WallClockSpec:
        if not self.offset:
            raise custom_error("offset", "a wall_clock fault needs an offset not 0 (e.g. offset: -2s)")
        return self

    def process_refs(self) -> tuple[str, ...]:
        return (process_of(self.target),)

    def started_refs(self) -> tuple[str, ...]:
        return (self.target,) if isinstance(self.target, str) else ()


@register
class WallClock(Fault[WallClockSpec, None]):
    kind = "wall_clock"
    Spec = WallClockSpec
    requires = ("faketime",)
    ssh_needs = ("faketime",)
    needs_on_target_host = True

    def inject(self, ctx: FaultContext) -> Injected[None]:
        return restart_with(ctx, self.spec.target, ClockOffsets(realtime_s=self.spec.offset), self.spec.grace)
