"""System-call faults: fail or delay chosen system calls of one process (``strace --inject``).

``syscall`` attaches strace to every thread of the target's current incarnation (``-f -p``)
and has the kernel-side tracer fail the chosen ``calls`` with ``error`` (an errno name: the
call is not made, the process sees -1 and that errno) and/or delay each on entry by ``delay``,
on the calls numbered by ``when`` (strace's ``first[..last][+[step]]``, counted per call from
the attach: ``1+`` every call, ``3`` the third only, ``2..4`` the second to the fourth). What
the process meets is what a kernel out of memory (``mmap: ENOMEM``), a dead peer
(``sendmsg: ECONNRESET``), a full socket table (``socket: EMFILE``) or a stalled device does to
it, and nothing else of it changes: no signal, no stop, its memory untouched.

The inject waits, bounded by ``attach``, until every thread of the target shows strace as its
tracer (``/proc/<pid>/task/*/status``: the kernel's word, not strace's). Heal ends strace
(SIGTERM: it detaches, and the process runs on untraced), waits until no thread is traced any
more, and records its witness (``strace_witness``): the calls strace failed or delayed, per call,
read from strace's own output (``<run>/faults/<name>.strace``: it marks each ``(INJECTED)`` or
``(DELAYED)``); a strace that faulted no call (the target made none of ``calls``, or fewer than
``when`` numbers) had no effect. strace runs under ``harness.faults._tether``, so it never
outlives the harness; a tracer that dies detaches its tracees in the kernel. Needs root (to
trace a process it did not start) and ``strace``.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator

from harness.errors import FaultError
from harness.faults import Fault, FaultContext, FaultSpec, Injected, _tether, process_of, register, undo_on_failure
from harness.record.witness import Witness
from harness.spec import Duration, Target, custom_error

__all__ = ["StraceCounts", "Syscall", "SyscallSpec", "Traced", "strace_witness", "traced_threads"]

DETACH_WAIT_S = 5.0
_CALL = re.compile(r"^[a-z_][a-z0-9_]*$")
_WHEN = re.compile(r"^[1-9][0-9]*(\.\.[1-9][0-9]*)?(\+([1-9][0-9]*)?)?$")


def _call(value: str) -> str:
    if not _CALL.match(value):
        raise custom_error("calls", f"{value!r} is not a system call name (lower case, e.g. mmap, sendmsg, connect)")
    return value


def _errno(value: str) -> str:
    if value not in errno.errorcode.values():
        raise custom_error("error", f"{value!r} is not an errno name (e.g. ENOMEM, ECONNRESET, EMFILE, EIO)")
    return value


def _when(value: str) -> str:
    if not _WHEN.match(value):
        raise custom_error("when", f"{value!r} is not FIRST[..LAST][+[STEP]] (e.g. 1+ every call, 3 the third, 2..4)")
    return value


class SyscallSpec(FaultSpec):
    """Fail (``error``) and/or delay (``delay``, on entry) the ``calls`` of ``target`` numbered
    ``when`` (default ``1+``: every one) until healed. ``attach`` bounds the wait for the
    tracer to hold every thread."""

    kind: Literal["syscall"]
    target: Target
    calls: tuple[Annotated[str, AfterValidator(_call)], ...] = Field(min_length=1, max_length=16)
    error: Annotated[str, AfterValidator(_errno)] | None = None
    delay: Duration | None = None
    when: Annotated[str, AfterValidator(_when)] = "1+"
    attach: Duration = 5.0

    @model_validator(mode="after")
    def _does_something(self) -> SyscallSpec:
        if self.error is None and not self.delay:
            raise custom_error("error", "a syscall fault needs error (an errno name), delay, or both")
        return self

    def process_refs(self) -> tuple[str, ...]:
        return (process_of(self.target),)

    def running_refs(self) -> tuple[Target, ...]:
        return (self.target,)

    def inject_arg(self) -> str:
        """strace's ``--inject`` argument."""
        parts = [",".join(self.calls)]
        if self.error is not None:
            parts.append(f"error={self.error}")
        if self.delay:
            parts.append(f"delay_enter={max(1, round(self.delay * 1e6))}")  # microseconds
        parts.append(f"when={self.when}")
        return ":".join(parts)


def traced_threads(pid: int) -> dict[int, int]:
    """Thread id -> its tracer's pid (0: untraced) of every thread of ``pid``; {} when it is gone."""
    out: dict[int, int] = {}
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    for tid in tasks:
        try:
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:
            continue
        found = re.search(r"^TracerPid:\s*(\d+)", status, re.M)
        out[int(tid)] = int(found.group(1)) if found else 0
    return out


@dataclass(frozen=True)
class Traced:
    """What heal undoes: the strace (its tether's pid) tracing ``pid`` of ``target``."""

    target: str
    pid: int
    tether: int
    log: str


# one line of ``strace -f -o``: ``PID call(args) = RET ...``, or the end of a call another
# thread's line cut (``PID <... call resumed>...) = RET ...``); a call's start that was cut
# (``<unfinished ...>``) ends on its resumed line
_LINE = re.compile(r"^(?:\d+\s+)?(?:<\.\.\. (?P<resumed>[a-z_][a-z0-9_]*) resumed>|(?P<call>[a-z_][a-z0-9_]*)\()")


@dataclass(frozen=True)
class StraceCounts:
    """What strace's own output says it did, per system call: the calls it saw return
    (``traced``), those it failed (marked ``(INJECTED)``), those it delayed (``(DELAYED)``), and
    ``faulted``: the calls either (one failed and delayed counts once)."""

    traced: dict[str, int]
    failed: dict[str, int]
    delayed: dict[str, int]
    faulted: int

    @classmethod
    def parse(cls, text: str) -> StraceCounts:
        traced: dict[str, int] = {}
        failed: dict[str, int] = {}
        delayed: dict[str, int] = {}
        faulted = 0
        for line in text.splitlines():
            match = _LINE.match(line)
            if match is None or line.rstrip().endswith("<unfinished ...>"):
                continue  # strace's own notes (attached, exited, signals), or a call's cut start
            call = match["resumed"] or match["call"]
            traced[call] = traced.get(call, 0) + 1
            marks = line[line.rfind(" = "):].split()  # the result's tail: RET [ERRNO (text)] (INJECTED) (DELAYED)
            if "(INJECTED)" in marks:
                failed[call] = failed.get(call, 0) + 1
            if "(DELAYED)" in marks:
                delayed[call] = delayed.get(call, 0) + 1
            faulted += "(INJECTED)" in marks or "(DELAYED)" in marks
        return cls(traced, failed, delayed, faulted)


def strace_witness(log: str, target: str, pid: int) -> Witness:
    """What strace did to ``target``: the calls it failed or delayed, from its own output (read
    after it ended, so whole); none when it faulted no call (the target never made one, or
    ``when`` numbered past those it made)."""
    try:
        text = Path(log).read_text(errors="replace")
    except OSError as exc:
        return Witness.unwitnessed(f"strace's output {log} cannot be read: {exc.strerror}")
    counts = StraceCounts.parse(text)
    failed, delayed = sum(counts.failed.values()), sum(counts.delayed.values())
    figures = {"faulted": counts.faulted, "traced": counts.traced, "failed": counts.failed, "delayed": counts.delayed}
    said = f"{failed} calls failed, {delayed} delayed of {sum(counts.traced.values())} traced"
    if counts.faulted:
        return Witness.seen(f"strace on {target} (pid {pid}): {said} ({_per_call(counts)})", **figures)
    return Witness.none(f"strace on {target} (pid {pid}): {said}", **figures)


def _per_call(counts: StraceCounts) -> str:
    calls = sorted(set(counts.failed) | set(counts.delayed))
    return ", ".join(f"{c} {counts.failed.get(c, 0)} failed {counts.delayed.get(c, 0)} delayed" for c in calls)


def _detach(token: Traced) -> bool:
    """End strace (SIGTERM to its tether), wait bounded until ``pid`` is untraced; True when it is
    (or is gone). A strace that did not let go is killed: the kernel detaches its tracees."""
    _tether.end(token.tether, lambda: not any(traced_threads(token.pid).values()), DETACH_WAIT_S)
    for tracer in set(traced_threads(token.pid).values()) - {0}:
        if _is_strace(tracer):
            os.kill(tracer, signal.SIGKILL)
    end = time.monotonic() + 1.0
    while time.monotonic() < end and any(traced_threads(token.pid).values()):
        time.sleep(0.02)
    return not any(traced_threads(token.pid).values())


def _is_strace(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "strace"
    except OSError:
        return False


@register
class Syscall(Fault[SyscallSpec, Traced]):
    kind = "syscall"
    Spec = SyscallSpec
    healable = True
    requires = ("root", "strace")
    no_ssh_lever = "strace attaches here by pid, and an ssh host's pids are not this machine's"

    def inject(self, ctx: FaultContext) -> Injected[Traced]:
        spec = self.spec
        target = ctx.resolve(spec.target)
        pid = ctx.proc(target).pid
        if pid is None:
            raise FaultError(f"syscall: {target} is not running")
        if any(traced_threads(pid).values()):
            raise FaultError(f"syscall: {target} (pid {pid}) is already traced")
        log = ctx.run_dir / "faults" / f"{self.name}.strace"
        log.parent.mkdir(parents=True, exist_ok=True)
        argv = ["strace", "-f", "-p", str(pid), "-o", str(log), "-e", f"trace={','.join(spec.calls)}",
                "-e", f"inject={spec.inject_arg()}"]
        with undo_on_failure() as undo, open(f"{log}.stderr", "ab") as err:
            proc = _tether.spawn(argv, err)
            token = Traced(target, pid, proc.pid, str(log))
            undo.callback(_detach, token)
            deadline = time.monotonic() + spec.attach
            while True:
                threads = traced_threads(pid)
                if threads and all(threads.values()):
                    break
                if proc.poll() is not None or not threads:
                    said = Path(f"{log}.stderr").read_text(errors="replace").strip()[-400:]
                    raise FaultError(f"syscall: strace ended before it held {target} (pid {pid}): {said or 'no output'}")
                if time.monotonic() > deadline:
                    untraced = sorted(tid for tid, tracer in threads.items() if not tracer)
                    raise FaultError(f"syscall: strace did not hold every thread of {target} (pid {pid}) within "
                                     f"{spec.attach:g}s (untraced: {untraced[:8]})")
                ctx.sleep(0.02)
        record: dict[str, Any] = {"target": target, "pid": pid, "calls": list(spec.calls), "when": spec.when,
                                  "threads": len(threads), "inject": spec.inject_arg()}
        if spec.error is not None:
            record["error"] = spec.error
        if spec.delay:
            record["delay"] = spec.delay
        return Injected(token, record)

    def heal(self, ctx: FaultContext, token: Traced) -> dict[str, Any] | None:
        if not _detach(token):
            raise FaultError(f"syscall: {token.target} (pid {token.pid}) is still traced after strace was ended")
        witness = strace_witness(token.log, token.target, token.pid)  # strace has ended: its output is whole
        return {"target": token.target, "pid": token.pid, "detached": True, "faulted": witness.figures.get("faulted"),
                "witness": witness.to_json()}
