"""Each process's clocks as the harness sees them: the offsets the harness gave it, and where
on the run's timeline one of its event stamps may lie.

A process stamps its events with its own ``CLOCK_MONOTONIC`` (``mono``). On a plain start that
is the harness's clock (an ssh host's is mapped by the offset probed at open). A ``clock``
fault starts an incarnation in a time namespace (``unshare --time``) whose ``CLOCK_MONOTONIC``
and ``CLOCK_BOOTTIME`` run ``ClockOffsets`` ahead of (or behind) the host's: the harness set
those offsets, so it subtracts them itself (the declared offset, never one the process reports).

Whatever the offset, a stamp is not taken on the process's word alone: an event can only have
been written after its incarnation was started and before the harness read it. ``place`` puts
an event at its stamp when the stamp, mapped onto the harness clock, lies within those bounds
(with ``STAMP_SLACK_S`` of slack, plus an ssh host's probe error), and otherwise at the moment
the harness read it, saying why in the entry (``clock_rejected``): a clock offset nobody
declared, or a process that writes nonsense stamps, shows in the timeline instead of moving
its events hours away from everything they relate to.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["FAKETIME_LIBRARIES", "FAKETIME_PROBE", "HOST_CLOCKS", "STAMP_SLACK_S", "ClockOffsets", "IncarnationClock",
           "faketime_library", "found_faketime", "place"]

# how far outside [incarnation start, receipt] a stamp may fall and still be believed: the start
# is recorded just before the spawn, a receipt just after the read, on one clock
STAMP_SLACK_S = 0.5


@dataclass(frozen=True)
class ClockOffsets:
    """Whole seconds the process's ``CLOCK_MONOTONIC`` and ``CLOCK_BOOTTIME`` run ahead of the
    host's (negative: behind; the kernel refuses an offset that would put a clock below zero;
    ``unshare`` takes whole seconds)."""

    monotonic_s: float = 0.0
    boottime_s: float = 0.0
    realtime_s: float = 0.0  # the wall clock (CLOCK_REALTIME and its kin), through libfaketime

    def __post_init__(self) -> None:
        for name, value in (("monotonic_s", self.monotonic_s), ("boottime_s", self.boottime_s), ("realtime_s", self.realtime_s)):
            if not math.isfinite(value) or value != int(value):
                raise ValueError(f"clock offset {name} must be a whole number of seconds (got {value!r})")

    @property
    def none(self) -> bool:
        return self.monotonic_s == 0 and self.boottime_s == 0 and self.realtime_s == 0

    def wrap(self, argv: Sequence[str], faketime: str | None = None) -> list[str]:
        """``argv`` started with these offsets: a new time namespace for the monotonic clocks
        (``unshare``), libfaketime preloaded for the wall clock (``env``, monotonic clocks left
        alone); each execs the next, so the pid the harness holds is the program's. The words are
        run where the program runs (``Host.wrap_clocks``): ``faketime`` is the library there
        (default: this machine's, ``faketime_library``)."""
        out = list(argv)
        if self.realtime_s:
            out = ["env", f"LD_PRELOAD={faketime or faketime_library()}", f"FAKETIME={int(self.realtime_s):+d}",
                   "FAKETIME_DONT_FAKE_MONOTONIC=1", "FAKETIME_NO_CACHE=1", *out]
        if self.monotonic_s or self.boottime_s:
            out = ["unshare", "--time", f"--monotonic={int(self.monotonic_s)}", f"--boottime={int(self.boottime_s)}", "--",
                   *out]
        return out

    def record(self) -> dict[str, Any]:
        out = {"monotonic_s": self.monotonic_s, "boottime_s": self.boottime_s}
        if self.realtime_s:
            out["realtime_s"] = self.realtime_s
        return out


# where Debian's libfaketime (package ``faketime``) puts its thread-safe library
FAKETIME_LIBRARIES = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/faketime/libfaketimeMT.so.1",
)


def faketime_library() -> str:
    """The libfaketime library of this machine; ``FileNotFoundError`` naming where it was looked for."""
    for path in FAKETIME_LIBRARIES:
        if os.path.exists(path):
            return path
    raise FileNotFoundError(f"no libfaketime (apt-get install faketime); looked in {', '.join(FAKETIME_LIBRARIES)}")


# one shell line that prints ``faketime-library PATH`` for the first of ``FAKETIME_LIBRARIES`` a
# host has (an ssh host's probe, ``harness.hosts.ssh``); nothing when it has none
FAKETIME_PROBE = ("for p in " + " ".join(FAKETIME_LIBRARIES)
                  + "; do [ -e \"$p\" ] && { echo \"faketime-library $p\"; break; }; done; true")


def found_faketime(output: str) -> str | None:
    """The library ``FAKETIME_PROBE`` printed in ``output`` (other lines ignored); None: none."""
    for line in output.splitlines():
        key, _, rest = line.strip().partition(" ")
        if key == "faketime-library" and rest.strip() in FAKETIME_LIBRARIES:
            return rest.strip()
    return None


HOST_CLOCKS = ClockOffsets()  # no offset: the host's own clocks (a plain start)


@dataclass(frozen=True)
class IncarnationClock:
    """One incarnation's clock: when the harness started it (run seconds) and the offsets it
    gave it."""

    started_t: float
    offsets: ClockOffsets = HOST_CLOCKS


def place(stamp_t: float, *, started_t: float | None, received_t: float, slack: float = STAMP_SLACK_S) -> tuple[float, dict[str, Any] | None]:
    """Where an event goes on the timeline (run seconds) and, when its stamp is not believed, why.

    ``stamp_t``: its stamp on the harness clock (offsets already taken off); ``started_t``: when
    its incarnation was started (None: unknown, no lower bound); ``received_t``: when the
    harness read it. A stamp within the bounds (± ``slack``) is kept; any other (or one that is
    not finite) gives way to ``received_t``."""
    if not math.isfinite(stamp_t):
        return received_t, {"stamp_t": str(stamp_t), "why": "the stamp is not a finite number"}
    if stamp_t > received_t + slack:
        why = f"stamped {stamp_t - received_t:.3f}s after the harness read it"
    elif started_t is not None and stamp_t < started_t - slack:
        why = f"stamped {started_t - stamp_t:.3f}s before its incarnation was started"
    else:
        return stamp_t, None
    return received_t, {"stamp_t": round(stamp_t, 6), "why": why}
