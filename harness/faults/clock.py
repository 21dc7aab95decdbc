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

Each records a witness of the new incarnation's clocks, measured from outside it at the inject:
``clock`` the offsets of the time namespace it is in, as the kernel shows them
(``/proc/PID/timens_offsets``, and that namespace is not the harness's); ``wall_clock`` that
libfaketime is mapped into it (``/proc/PID/maps``) and the offset its own settings (read from
``/proc/PID/environ``) give ``date`` here. Process on the host's clocks: no effect. A target on
an ssh host is not witnessed (its ``/proc`` is not read from here).

Both act where the target runs: its host wraps the start (``Host.wrap_clocks``), so on an ssh
host ``unshare`` and libfaketime are the host's, and ``requires`` is probed there instead
(``Clock.ssh_needs``: a uid-0 login for ``clock``).
"""

from __future__ import annotations

import math
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, WithJsonSchema, model_validator

from harness.faults import Fault, FaultContext, FaultSpec, Injected, process_of, register
from harness.hosts.clocks import ClockOffsets
from harness.record.witness import Witness
from harness.spec import Duration, Target, custom_error, parse_duration

__all__ = ["Clock", "ClockSpec", "WallClock", "WallClockSpec", "faketime_witness", "parse_offset", "read_timens_offsets",
           "restart_with", "timens_witness"]

EXEC_SETTLE_S = 2.0  # how long a witness of no effect is measured again: unshare / env may not have exec'd yet
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


def restart_with(ctx: FaultContext, target: Target, offsets: ClockOffsets, grace: float,
                 witness: Callable[[int, ClockOffsets], Witness]) -> Injected[None]:
    """Stop ``target`` if it runs (TERM, ``grace``, KILL) and start its next incarnation with
    ``offsets``; nothing to heal (the offsets end with the incarnation). ``witness`` measures,
    from outside it, the clocks the new incarnation (its pid) runs on."""
    name = ctx.resolve(target)
    value: dict[str, Any] = {"target": name, "clocks": offsets.record()}
    if ctx.proc(name).alive:
        value["stopped"] = ctx.stop(name, grace)
    value["started"] = ctx.start(name, offsets)
    view, host = ctx.proc(name), ctx.locate(name)
    if host.kind == "ssh":
        seen = Witness.unwitnessed(f"{name} runs on ssh host {host.name}: its /proc is not read from here")
    elif view.pid is None:
        seen = Witness.unwitnessed(f"{name} {view.ended or 'is not running'}: its clocks cannot be read")
    else:
        seen = witness(view.pid, offsets)
        settle = time.monotonic() + EXEC_SETTLE_S
        while seen.effect == "none" and time.monotonic() < settle:  # its wrapper may not have exec'd it yet
            ctx.sleep(0.05)
            seen = witness(view.pid, offsets)
    value["witness"] = seen.to_json()
    return Injected(None, value)


def read_timens_offsets(text: str) -> dict[str, float]:
    """``/proc/PID/timens_offsets`` (``monotonic  SECONDS NANOSECONDS`` per clock) -> clock ->
    seconds."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[1].lstrip("-").isdigit() and fields[2].isdigit():
            out[fields[0]] = int(fields[1]) + int(fields[2]) / 1e9
    return out


def timens_witness(pid: int, offsets: ClockOffsets, proc: Path = Path("/proc")) -> Witness:
    """The offsets of the time namespace ``pid`` is in, as the kernel shows them
    (``/proc/PID/timens_offsets``), and whether it is another namespace than the harness's own:
    seen when its clocks are offset; none when the process runs on the host's clocks."""
    try:
        text = (proc / str(pid) / "timens_offsets").read_text()
        own = os.readlink(proc / "self" / "ns" / "time") != os.readlink(proc / str(pid) / "ns" / "time")
    except OSError as exc:
        return Witness.unwitnessed(f"pid {pid}'s time namespace cannot be read: {exc.strerror}", pid=pid)
    found = read_timens_offsets(text)
    monotonic, boottime = found.get("monotonic", 0.0), found.get("boottime", 0.0)
    figures = {"pid": pid, "monotonic_s": monotonic, "boottime_s": boottime, "own_namespace": own,
               "asked_monotonic_s": offsets.monotonic_s, "asked_boottime_s": offsets.boottime_s}
    said = f"pid {pid}'s time namespace: monotonic {monotonic:+g}s, boottime {boottime:+g}s"
    if own and (monotonic or boottime):
        asked = (monotonic, boottime) == (offsets.monotonic_s, offsets.boottime_s)
        return Witness.seen(said + ("" if asked else f" (asked {offsets.monotonic_s:+g}s, {offsets.boottime_s:+g}s)"),
                            **figures)
    return Witness.none(said + ("" if own else " (the host's own namespace)"), **figures)


def faketime_witness(pid: int, offsets: ClockOffsets, proc: Path = Path("/proc")) -> Witness:
    """Whether libfaketime is in ``pid`` (mapped into its memory, ``/proc/PID/maps``) and the
    wall clock it gives with the target's own settings (``FAKETIME`` and ``LD_PRELOAD`` read
    from ``/proc/PID/environ``): ``date`` run with them, against this machine's clock."""
    try:
        maps = (proc / str(pid) / "maps").read_text(errors="replace")
        environ = (proc / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError as exc:
        return Witness.unwitnessed(f"pid {pid}'s memory map cannot be read: {exc.strerror}", pid=pid)
    env: dict[str, str] = {}
    for item in environ:
        key, _, val = item.decode(errors="replace").partition("=")
        env.setdefault(key, val)
    library = next((line.split()[-1] for line in maps.splitlines() if "libfaketime" in line), None)
    figures: dict[str, Any] = {"pid": pid, "library": library, "faketime": env.get("FAKETIME"),
                               "asked_s": offsets.realtime_s, "measured_s": None}
    if library is None:
        return Witness.none(f"no libfaketime in pid {pid}'s memory: its wall clock is the host's", **figures)
    probe: dict[str, str] = {"PATH": os.defpath}
    probe |= {k: env[k] for k in ("LD_PRELOAD", "FAKETIME", "FAKETIME_DONT_FAKE_MONOTONIC", "FAKETIME_NO_CACHE") if k in env}
    try:
        before = time.time()
        done = subprocess.run(["date", "+%s.%N"], env=probe, capture_output=True, text=True,
                              timeout=10, check=False)
        measured = round(float(done.stdout.strip()) - (before + time.time()) / 2, 1)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return Witness.unwitnessed(f"libfaketime is in pid {pid} ({library}), but its offset could not be measured",
                                   **figures)
    figures["measured_s"] = measured
    if abs(measured) >= 0.5:
        return Witness.seen(f"libfaketime in pid {pid}: its settings give a wall clock {measured:+g}s off the host's",
                            **figures)
    return Witness.none(f"libfaketime in pid {pid}, but its settings give the host's wall clock ({measured:+g}s)",
                        **figures)


@register
class Clock(Fault[ClockSpec, None]):
    kind = "clock"
    Spec = ClockSpec
    requires = ("root", "unshare", "timens")
    ssh_needs = ("root-login", "unshare", "timens")
    needs_on_target_host = True

    def inject(self, ctx: FaultContext) -> Injected[None]:
        return restart_with(ctx, self.spec.target, self.spec.offsets(), self.spec.grace, timens_witness)


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
        return restart_with(ctx, self.spec.target, ClockOffsets(realtime_s=self.spec.offset), self.spec.grace,
                            faketime_witness)
