"""The machine as a share: runs that may sit side by side hold it shared, a run that must have
it to itself holds it alone.

A matrix column deals its scenarios into lanes and runs the ones that must be alone with
nothing beside them (``harness.matrix.schedule.place``: global faults, CPU hogs, tight timing
windows). pytest-xdist deals items to its workers with no such rule, so a scenario running
eight CPU hogs could run beside one whose verdict is a 1 s window, and a healthy source's READ
was called stalled there. So every scenario item and every test marked ``integration`` holds
the share while it runs (``harness.cli.pytest_plugin``): shared, or alone where ``place`` says so
(or the item is marked ``alone``). The share is the machine's, not one session's: two pytest
sessions on one machine also keep out of each other's way.

The share is two ``flock``-ed files in the harness's state directory (``share/``, opened
through ``statedir.open_lock``): ``gate`` and ``share``. A holder takes the gate, then the
share (shared or exclusive), then lets the gate go; so a run waiting to be alone holds the
gate and no new shared holder slips in ahead of it (no starvation). The kernel drops a dead
holder's locks with its descriptors. Every wait is bounded (``WAIT_S``); past it the holder
gets ``ShareTimeout`` naming what it waited for.

A holder's descendants inherit its hold: each holder leaves a note ``holder-<pid>-<start>-<n>``
(its mode; ``start``: the process's start time, so a reused pid is not taken for the holder) in
the folder while it holds, and ``held_by_ancestor`` finds the note of a process this one
descends from. The pytest plugin takes no share for an item of a session started under a holder
(a test of the plugin itself runs a pytest session of its own: its alone item would otherwise
wait for its own parent). Notes whose process is gone (a holder that crashed, its pid maybe
another process's by now) are removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from harness.errors import HarnessError
from harness.machine import procscan, runscope, statedir

__all__ = ["POLL_S", "WAIT_S", "Held", "ShareTimeout", "held_by_ancestor", "hold"]

MAX_ANCESTORS = 64  # how far up the process tree a hold is looked for

WAIT_S = 1800.0  # the longest any run waits for the machine (a run budget is minutes)
POLL_S = 0.05


class ShareTimeout(HarnessError):
    """The machine share was not had within the bound."""


@dataclass(frozen=True)
class Held:
    """What a holder got: ``alone`` or shared, and how long it waited."""

    alone: bool
    waited_s: float


def _take(fd: int, operation: int, deadline: float, what: str, wait_s: float) -> None:
    while True:
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise ShareTimeout(f"waited {wait_s:g}s for {what} and did not get it") from None
            time.sleep(POLL_S)


_NOTES = itertools.count()


def held_by_ancestor() -> str | None:
    """``alone`` or ``shared`` when a process this one descends from holds the share, else None;
    notes of processes that are gone are removed on the way."""
    folder = statedir.subdir("share", create=False)
    if folder is None:
        return None
    notes: dict[int, str] = {}
    for note in folder.glob("holder-*"):
        words = note.name.split("-")
        if len(words) not in (3, 4) or not all(word.isdigit() for word in words[1:]):
            continue  # not a note this module wrote
        holder = int(words[1])
        start = int(words[2]) if len(words) == 4 else None  # a note of an earlier version: no start time
        if not procscan.harness_alive(holder, start):  # gone, a zombie nobody reaped yet, or its pid reused
            note.unlink(missing_ok=True)
            continue
        with contextlib.suppress(OSError, statedir.StateDirError):
            notes[holder] = statedir.read_owned(note).decode()
    ancestor: int | None = os.getppid()
    for _ in range(MAX_ANCESTORS):
        if ancestor is None or ancestor <= 1:
            return None
        if ancestor in notes:
            return notes[ancestor]
        stat = runscope.proc_stat(ancestor)
        ancestor = stat.ppid if stat is not None else None
    return None


@contextmanager
def hold(alone: bool, *, wait_s: float = WAIT_S) -> Iterator[Held]:
    """Hold the machine alone (nothing else that holds the share runs meanwhile) or shared."""
    folder = statedir.subdir("share")
    assert folder is not None
    began = time.monotonic()
    deadline = began + wait_s
    gate = statedir.open_lock(folder / "gate")
    share = -1
    try:
        _take(gate, fcntl.LOCK_EX, deadline, "the machine share's gate", wait_s)
        share = statedir.open_lock(folder / "share")
        what = "the machine alone" if alone else "a share of the machine"
        try:
            _take(share, fcntl.LOCK_EX if alone else fcntl.LOCK_SH, deadline, what, wait_s)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        me = runscope.proc_stat(os.getpid())
        assert me is not None  # this process's own stat
        note = folder / f"holder-{me.pid}-{me.start}-{next(_NOTES)}"
        statedir.write_new(note, b"alone" if alone else b"shared")
        try:
            yield Held(alone, round(time.monotonic() - began, 3))
        finally:
            note.unlink(missing_ok=True)
    finally:
        if share >= 0:
            os.close(share)  # closing drops the lock
        os.close(gate)
