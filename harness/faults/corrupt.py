"""Corruption of a source's registered memory: the ``corrupt`` fault.

A source started with ``options: {debug_hooks: true}`` toggles the corruption of the memory it
serves on SIGUSR2 (byte 0 of every tensor XORed with 0xFF; a second SIGUSR2 restores it) and
confirms each toggle with a ``debug_corrupt {corrupted, tensors}`` event. ``corrupt`` sends the
first SIGUSR2 to the source process only (not its group) and waits, bounded by ``confirm``, for
``corrupted: true``; heal sends the second to the pid it corrupted (its token) and waits for
``corrupted: false``. A process that is gone by then took its memory with it: nothing to restore.
A toggle that is not confirmed in time is toggled back before the error; an interrupt inside the
send is taken as landed, as ``pause`` takes it, and toggled back too.

Its witness is the harness's own reading of the target's memory: the toggle's event names the
address of each byte it flips (``addrs``; the subject says *where*, never *what*), the harness
reads those bytes through ``/proc/PID/mem`` once the corruption is confirmed, again just before
the heal (did it hold?) and once the heal is confirmed, and counts the bytes that differ by
0xFF between corrupted and restored. A toggle that flipped nothing (whatever its event said)
has no effect. Not witnessed: a source on an ssh host, tensors in device memory, a subject
whose event names no addresses, a source gone by the heal.

Limit: the wait matches any such event of the current incarnation, so a second corruption of
the same incarnation is confirmed by the first one's event (the toggle itself still happens).
"""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from harness.errors import FaultError
from harness.faults import Fault, FaultContext, FaultSpec, Injected, process_of, register, undo_on_failure
from harness.record.witness import Witness
from harness.spec import Duration, SourceOf, Target

__all__ = ["Corrupt", "CorruptSpec", "Corrupted", "hooked_source_issues", "memory_witness", "read_bytes", "where_flipped"]

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
    """What heal restores: the source process and the pid whose memory was corrupted; ``addrs``
    the bytes the toggle said it flipped and ``read`` what the harness read there once corrupted
    (None: not read, ``why`` says why)."""

    target: str
    pid: int
    addrs: tuple[int, ...] = ()
    read: bytes | None = None
    why: str = ""


def read_bytes(pid: int, addrs: Sequence[int], proc: Path = Path("/proc")) -> bytes | None:
    """The byte at each address of ``pid``'s memory (``/proc/PID/mem``); None when it cannot be
    read (the process is gone, an address is not mapped)."""
    try:
        with open(proc / str(pid) / "mem", "rb", buffering=0) as mem:
            out = bytearray()
            for addr in addrs:
                mem.seek(addr)
                byte = mem.read(1)
                if len(byte) != 1:
                    return None
                out += byte
            return bytes(out)
    except (OSError, OverflowError, ValueError):
        return None


def where_flipped(confirmed: Mapping[str, Any], host_kind: str) -> tuple[tuple[int, ...], str]:
    """The addresses a toggle's ``debug_corrupt`` names, or () and why they cannot be read here."""
    addrs = confirmed.get("addrs")
    if host_kind == "ssh":
        return (), "the source runs on an ssh host: its memory is not read from here"
    if confirmed.get("memory") == "device":
        return (), "its tensors are in device memory, which /proc/PID/mem does not reach"
    if not isinstance(addrs, list) or not addrs or not all(isinstance(a, int) and a > 0 for a in addrs):
        return (), "its debug_corrupt names no addresses (a subject whose hooks do not say where they flip)"
    return tuple(addrs), ""


def memory_witness(token: Corrupted, restored: bytes | None, held: bytes | None) -> Witness:
    """What the toggle did to the memory, as the harness read it: each flipped byte as read while
    corrupted (inject) against the same byte once restored (heal): a corruption changes it by
    0xFF, and it held until the heal (``held``: read just before it)."""
    if token.read is None or restored is None:
        return Witness.unwitnessed(token.why or f"{token.target} (pid {token.pid})'s memory could not be read back "
                                   "at its heal (gone?)", pid=token.pid)
    changed = sum(1 for a, b in zip(token.read, restored, strict=True) if a ^ b == 0xFF)
    kept = None if held is None else sum(1 for a, b in zip(token.read, held, strict=True) if a == b)
    figures = {"pid": token.pid, "bytes": len(token.addrs), "changed": changed, "held": kept}
    said = (f"{changed} of {len(token.addrs)} bytes of {token.target}'s tensors read back (/proc/{token.pid}/mem) "
            "flipped while corrupted against restored")
    if changed:
        return Witness.seen(said + ("" if kept is None else f", {kept} held until the heal"), **figures)
    return Witness.none(said, **figures)


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
        addrs, why = where_flipped(confirmed, ctx.locate(target).kind)
        read = read_bytes(pid, addrs) if addrs else None
        if addrs and read is None:
            why = f"{target} (pid {pid})'s memory could not be read at the addresses its toggle named"
        return Injected(
            Corrupted(target, pid, addrs, read, why),
            {"target": target, "pid": pid, "signal": "SIGUSR2", "tensors": confirmed.get("tensors"),
             "confirmed_t": confirmed.get("t"), "read": None if read is None else read.hex()},
        )

    def heal(self, ctx: FaultContext, token: Corrupted) -> dict[str, Any] | None:
        held = read_bytes(token.pid, token.addrs) if token.read is not None else None
        if not ctx.signal_pid(token.pid, TOGGLE, group=False):
            witness = Witness.unwitnessed(f"{token.target} (pid {token.pid}) was gone at the heal: its memory with it")
            return {"target": token.target, "pid": token.pid, "gone": True, "witness": witness.to_json()}
        try:
            restored = ctx.wait_event(token.target, EVENT, {"corrupted": False}, self.spec.confirm)
        except FaultError as exc:
            raise FaultError(f"{token.target} (pid {token.pid}) did not confirm its memory restored: {exc}") from None
        after = read_bytes(token.pid, token.addrs) if token.read is not None else None
        witness = memory_witness(token, after, held)
        return {"target": token.target, "pid": token.pid, "restored": True, "tensors": restored.get("tensors"),
                "witness": witness.to_json()}
