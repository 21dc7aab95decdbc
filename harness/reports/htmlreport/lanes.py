"""What a process lane of the timeline shows besides its lifetime, read from the history.

* ``attempts``: a reader's source attempts (``attempt_start`` .. ``attempt_outcome``), each with
  its index, the source it tried (the process whose ``published`` event carried that worker
  id, else the worker id) and its load phases (``load_phase`` events of that index, each drawn
  as the ``seconds`` before its event);
* ``server_view``: the server's view of each source (``source_published`` / ``source_status``
  of the server, matched to a source process by worker id): READY, STALE ... over time;
* ``host_hit``: the fault windows that hit a host (the injection names ``host`` / ``peer_host``),
  for every process on that host;
* ``scrape_gaps``: when a process could not be scraped (a failed scrape until the next good one);
* ``interrupt_at``: when the harness was interrupted (SIGINT/SIGTERM), if it was.

Pure functions of a ``History``; ``harness.reports.htmlreport.timeline`` and ``charts`` draw them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from harness.record.timeline import FaultWindow, History

__all__ = ["PHASES", "Attempt", "Phase", "attempts", "host_hit", "interrupt_at", "scrape_gaps", "server_view"]

# the load phases drawn in their own colour (the rest: "other"), in load order
PHASES: tuple[str, ...] = ("allocate", "register", "handshake", "read", "verify")


@dataclass(frozen=True)
class Phase:
    name: str
    start: float
    end: float
    ok: bool
    overlapped: bool  # ran beside the load's path (a prestarted target), not on it


@dataclass(frozen=True)
class Attempt:
    index: int
    source: str  # the source process tried (or its worker id when no process published it)
    start: float
    end: float | None  # None: no outcome by the end of the run
    outcome: str | None  # success, transfer_retry, ... (None: unfinished)
    error: str = ""
    phases: tuple[Phase, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return self.outcome == "success"


def _published(h: History) -> dict[str, str]:
    """worker id -> the source process that published it."""
    return {str(e.get("worker_id")): e.actor for e in h.select(f="published") if e.get("worker_id")}


def attempts(h: History, process: str) -> list[Attempt]:
    """The source attempts of ``process`` in order (empty: it made none, or is no reader)."""
    by_worker = _published(h)
    starts: dict[int, tuple[float, str]] = {}
    ends: dict[int, tuple[float, str, str]] = {}
    phases: dict[int, list[Phase]] = {}
    for e in h.select(actor=process):
        index = e.get("index")
        if not isinstance(index, int):
            continue
        if e.f == "attempt_start":
            worker = str(e.get("worker_id") or "?")
            starts.setdefault(index, (e.t, by_worker.get(worker, f"worker {worker}")))
        elif e.f == "attempt_outcome":
            ends.setdefault(index, (e.t, str(e.get("outcome")), str(e.get("error") or "")))
        elif e.f == "load_phase" and isinstance(e.get("seconds"), int | float):
            seconds = float(e.get("seconds"))
            phases.setdefault(index, []).append(
                Phase(str(e.get("phase")), max(0.0, e.t - seconds), e.t, bool(e.get("ok")), bool(e.get("overlapped"))))
    out = []
    for index, (t0, source) in sorted(starts.items()):
        t1, outcome, error = ends.get(index, (None, None, ""))
        out.append(Attempt(index, source, t0, t1, outcome, error, tuple(phases.get(index, ()))))
    return out


def server_view(h: History, sources: Iterable[str]) -> dict[str, list[tuple[float, str]]]:
    """Per source process: ``(t, status)`` as the server recorded it (published, then each status change)."""
    wanted = set(sources)
    by_worker = _published(h)
    out: dict[str, list[tuple[float, str]]] = {}
    for e in h.select(f=("source_published", "source_status")):
        process = by_worker.get(str(e.get("worker_id")))
        status = e.get("status")
        if process in wanted and isinstance(status, str):
            out.setdefault(process, []).append((e.t, status))
    return out


def host_hit(windows: Sequence[FaultWindow], host_of: Mapping[str, str]) -> dict[str, list[FaultWindow]]:
    """Per process: the windows of faults on its host (not aimed at the process itself)."""
    out: dict[str, list[FaultWindow]] = {}
    for w in windows:
        for process, host in host_of.items():
            if host in w.hosts and w.target != process:
                out.setdefault(process, []).append(w)
    return out


def scrape_gaps(h: History, process: str) -> list[tuple[float, float]]:
    """When ``process`` could not be scraped: from a failed scrape to the next good one (or its exit)."""
    gaps: list[tuple[float, float]] = []
    opened: float | None = None
    for e in h.select(actor=process, f="scrape"):
        if not e.get("ok"):
            opened = e.t if opened is None else opened
        elif opened is not None:
            gaps.append((opened, e.t))
            opened = None
    if opened is not None:
        ends = [i.end for i in h.incarnations(process) if i.end is not None and i.end >= opened]
        gaps.append((opened, min(ends) if ends else h.end))
    return gaps


def interrupt_at(h: History) -> float | None:
    """When the run was interrupted: its first step cut short by the interrupt, else its outcome."""
    for e in h.select(actor="harness", f="step"):
        if e.get("error") == "interrupted":
            return e.t
    outcome = h.last(actor="harness", f="outcome")
    return outcome.t if outcome is not None and outcome.get("status") == "interrupted" else None
