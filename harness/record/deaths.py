"""How a process ended, said as a person reads it: a negative exit code is the signal that
killed it (``-6`` is ``SIGABRT``), and the processes that died by a signal the harness did not
send, found in the timeline; the last lines of a process's log.

The pages, the terminal's recap, JUnit's failure bodies and the CI summary all name a death
here, so ``exited -6`` reads ``exited -6 (SIGABRT)`` everywhere a person looks."""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from harness.record.timeline import Entry

__all__ = ["Death", "deaths", "log_tail", "name_signals", "signal_name"]

_EXITED = re.compile(r"\b(exited|rc[ =:]) ?(-\d+)\b(?! \(SIG)")


def signal_name(rc: int | None) -> str | None:
    """``SIGABRT`` for ``-6``; None for a code that is not a death by signal (0, positive, None,
    or a number no signal has)."""
    if rc is None or rc >= 0:
        return None
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return None


def name_signals(text: str) -> str:
    """``reader-1 exited -6, expected 0`` -> ``reader-1 exited -6 (SIGABRT), expected 0``: each
    negative exit code in a line of text followed by the signal's name (once: a named one is kept)."""

    def named(m: re.Match[str]) -> str:
        name = signal_name(int(m.group(2)))
        return f"{m.group(0)} ({name})" if name else m.group(0)

    return _EXITED.sub(named, text)


@dataclass(frozen=True)
class Death:
    """A process that died by a signal the harness did not send it."""

    process: str
    signal: str
    t: float


def deaths(entries: Iterable[Entry]) -> list[Death]:
    """Every ``process_exit`` by a signal that the harness did not cause by stopping the process
    (its ``stopped_by_harness``) nor by a fault that kills it (a ``kill`` fault names its target:
    that death is the scenario's, still listed, since its log says how it went)."""
    found = []
    for e in entries:
        if e.f != "process_exit" or e.get("stopped_by_harness"):
            continue
        rc = e.get("rc")
        name = e.get("signal") or (signal_name(rc) if isinstance(rc, int) else None)
        if name:
            found.append(Death(e.actor, str(name), e.t))
    return found


def log_tail(path: Path, lines: int = 20, max_chars: int = 4000) -> str:
    """The last ``lines`` lines of a log (at most ``max_chars``, cut at a line start); '' when
    the file cannot be read. Reads only the file's end, so a huge log costs no more."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - max_chars * 2))
            data = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    tail = data.splitlines()[-lines:]
    text = "\n".join(tail)
    while len(text) > max_chars and len(tail) > 1:
        tail = tail[1:]
        text = "\n".join(tail)
    return text[-max_chars:]
