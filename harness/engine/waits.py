"""One run clock: the run's deadline, its abort switch, and every bounded wait of a run.

Every wait in a run goes through a ``RunClock``: it ends at its own deadline, never past the
run's (``budgets.run``), and wakes at once when the run is aborted (a hang, a failed parallel
branch), raising ``Aborted``, or interrupted (SIGINT/SIGTERM of the harness), raising
``RunInterrupted``. The signal is recorded here first, so the run ends as interrupted even when
the exception its handler raised was swallowed on the way (e.g. by a timeline listener). The watchdog reads ``quiet_until`` so a deliberate
``sleep`` step is not taken for a lack of progress.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from harness.errors import RunInterrupted
from harness.record.timeline import Entry, Timeline

__all__ = ["Aborted", "RunClock"]


class Aborted(Exception):
    """A wait woke because the run is being aborted (``RunClock.reason`` says why)."""


class RunClock:
    """Deadlines and the abort switch of one run (thread-safe)."""

    def __init__(self, timeline: Timeline, *, run_budget: float, step_budget: float) -> None:
        self.timeline = timeline
        self.deadline = timeline.t0 + run_budget  # monotonic
        self.step_budget = step_budget
        self._abort = threading.Event()
        self._lock = threading.Lock()
        self._reason: str | None = None
        self._signalled: int | None = None
        self.quiet_until = 0.0  # monotonic: a sleep step is quiet on purpose until then

    # ------------------------------------------------------------------ abort

    def abort(self, reason: str | None = None) -> bool:
        """Abort the run's waits; the first reason given is kept. True for the first abort."""
        with self._lock:
            first = not self._abort.is_set()
            if reason and self._reason is None:
                self._reason = reason
            self._abort.set()
        return first

    def note_signal(self, signum: int) -> None:
        """The harness got ``signum``, said from its signal handler: recorded (the first one is
        kept) without a lock, since the handler may have interrupted the lock's holder; the waits
        wake when ``interrupt`` follows from a thread of the handler's."""
        if self._signalled is None:
            self._signalled = signum

    def interrupt(self, signum: int) -> None:
        """The harness got ``signum``: recorded (the first one is kept), and every wait wakes."""
        with self._lock:
            if self._signalled is None:
                self._signalled = signum
            self._abort.set()

    @property
    def signalled(self) -> int | None:
        """The signal that interrupted the run, if one did."""
        return self._signalled

    def _woken(self) -> Exception:
        return RunInterrupted(self._signalled) if self._signalled is not None else Aborted()

    @property
    def aborted(self) -> bool:
        return self._abort.is_set()

    @property
    def reason(self) -> str | None:
        return self._reason

    # ------------------------------------------------------------------ deadlines

    def step_deadline(self, within: float | None = None) -> float:
        """``within`` seconds from now (default ``budgets.step``), never past the run's deadline."""
        budget = within if within is not None else self.step_budget
        return min(time.monotonic() + budget, self.deadline)

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    # ------------------------------------------------------------------ waits

    def wait_entry(self, predicate: Callable[[Entry], bool], deadline: float, *, start: int = 0, count: int = 1) -> Entry | None:
        """The ``count``-th timeline entry from ``start`` that matches, or None at ``deadline``;
        ``Aborted`` / ``RunInterrupted`` when the run is aborted / interrupted first."""
        entry = self.timeline.wait_for(predicate, deadline, start=start, abort=self._abort, count=count)
        if entry is None and self._abort.is_set():
            raise self._woken()
        return entry

    def sleep(self, seconds: float) -> None:
        """Sleep (quietly: the watchdog does not count it as a stall); wakes on abort."""
        end = time.monotonic() + seconds
        self.quiet_until = max(self.quiet_until, end)
        if self._abort.wait(max(0.0, min(end, self.deadline + 1) - time.monotonic())):
            raise self._woken()

    def pause(self, seconds: float) -> None:
        """Wait between polls (not quiet); wakes on abort."""
        if self._abort.wait(max(0.0, seconds)):
            raise self._woken()
