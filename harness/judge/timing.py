"""Which failed checks are timing checks, and the machine-load caveat that goes with them only.

A check fails on a time bound when it is an ``elapsed`` check or words a bound as missed
(``loaded``, ``fell_back``: "later than", "earlier than", ", budget "); not when it failed on
the stall deadlines a reader announced (``harness.checks.deadlines``: a behaviour). One run's
FAIL of a time bound may be the machine's load: the rerun repeats it, and when the machine was
oversubscribed (``harness.record.load``) the terminal, the run page and the index say so beside
that check, and beside no other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.checks.deadlines import BROKEN_CONTRACT
from harness.record.load import oversubscribed, run_load

if TYPE_CHECKING:
    from harness.judge.verdict import RunResult

__all__ = ["is_time_bound", "load_caveat", "timing_checks_failed"]

_MISSED_BOUND = ("later than", "earlier than", ", budget ")  # how the checks word a missed time bound


def is_time_bound(kind: str, summary: str) -> bool:
    """Whether a failed check failed on a time bound (an ``elapsed`` check, or a bound a
    ``loaded``/``fell_back`` check words as missed); not when it failed on the stall deadlines
    a reader announced (``harness.checks.deadlines``): that is a behaviour."""
    if BROKEN_CONTRACT in summary:
        return False
    return kind == "elapsed" or any(words in summary for words in _MISSED_BOUND)


def timing_checks_failed(result: RunResult) -> list[str]:
    """The names of the checks that failed on a time bound (``is_time_bound``)."""
    return [c.name for c in result.checks if c.valid is False and is_time_bound(c.kind, c.summary)]


def load_caveat(result: RunResult) -> str:
    """The machine's load, when more tasks wanted a CPU than it has and a timing check failed
    (``harness.record.load``): that check may have failed for the machine, not the subject. ''
    otherwise: a failed check that is no time bound is not the load's doing, so it gets none."""
    if not timing_checks_failed(result) or not oversubscribed(result.history):
        return ""
    return run_load(result.history)
