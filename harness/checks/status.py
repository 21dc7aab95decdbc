"""Source health as seen by the source itself or by the metadata server: ``health``, ``listed``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import Field

from harness.checks import CheckParams, CheckResult, RunFacts, ref_or_start, register, resolve_ref
from harness.record.timeline import Entry, History
from harness.spec import Duration, Name, Ref, format_seconds

View = Literal["source", "server"]
ListedView = Literal["source", "server", "client"]
OBSERVED_FRESH_S = 1.0  # the client's view at a moment: an observation at most this old (harness.engine.observer)


def worker_ids(h: History, source: str) -> set[str]:
    ids: set[str] = set()
    for entry in h.select(actor=source, f=("published", "agent_ready")):
        for key in ("worker_id", "mx_source_id"):
            if entry.get(key) is not None:
                ids.add(str(entry.get(key)))
    return ids


def status_changes(h: History, source: str, view: View, until: float | None = None) -> list[tuple[float, str]]:
    """(t, status) with repeats removed, from the source's own status_change events or the
    server's source_status events for the source's worker ids."""
    if view == "source":
        raw = [(e.t, str(e.get("status"))) for e in h.select(actor=source, f="status_change", until=until)]
    else:
        ids = worker_ids(h, source)
        raw = [
            (e.t, str(e.get("status")))
            for e in h.select(f="source_status", until=until)
            if str(e.get("worker_id")) in ids
        ]
    out: list[tuple[float, str]] = []
    for t, status in raw:
        if not out or out[-1][1] != status:
            out.append((t, status))
    return out


class HealthParams(CheckParams):
    """The source's status went through ``sequence`` (consecutive transitions, e.g.
    [READY, STALE, READY]) after ``from`` (default: the source's start); ``within``: the
    last status of the sequence came at most this long after ``from`` when given, else
    after the sequence's first status."""

    source: Name
    sequence: tuple[str, ...] = Field(min_length=2)
    within: Duration | None = None
    from_: Ref | None = Field(default=None, alias="from")
    view: View = "source"

    def process_refs(self) -> Iterable[tuple[str, str, tuple[str, ...] | None]]:
        yield "source", self.source, ("source", "reader")

    def label(self, kind: str) -> str:
        return self.name or f"health({self.source}: {' -> '.join(self.sequence)})"


@register("health", HealthParams)
def health(p: HealthParams, h: History, run: RunFacts) -> CheckResult:
    """Earliest contiguous match of the sequence in the de-duplicated status changes."""
    t_ref, ref_text = ref_or_start(p.from_, h, p.source)
    if t_ref is None:
        return CheckResult("unknown", f"reference point ({ref_text}) never happened")
    changes = [(t, s) for t, s in status_changes(h, p.source, p.view) if t >= t_ref]
    seen = " -> ".join(s for _, s in changes) or "none"
    details = {"statuses": [[round(t, 6), s] for t, s in changes], "view": p.view, "reference": ref_text}
    if not changes:
        return CheckResult("unknown" if p.view == "server" else False, f"no {p.view}-side status of {p.source}", details)
    want = list(p.sequence)
    for i in range(len(changes) - len(want) + 1):
        if [s for _, s in changes[i : i + len(want)]] == want:
            first, last = changes[i][0], changes[i + len(want) - 1][0]
            start = t_ref if p.from_ is not None else first
            took = last - start
            marks = tuple((t, f"{p.source} {s}") for t, s in changes[i : i + len(want)])
            if p.within is not None and took > p.within:
                return CheckResult(
                    False,
                    f"{p.source}: {' -> '.join(want)} took {took:.3f}s, budget {format_seconds(p.within)}",
                    details,
                    marks,
                )
            return CheckResult(True, f"{p.source}: {' -> '.join(want)} in {took:.3f}s", details, marks)
    return CheckResult(False, f"{p.source}: expected {' -> '.join(want)}, saw {seen}", details)


class ListedParams(CheckParams):
    """Which sources are READY at a moment (``at`` plus ``after``): ``ready`` must be READY,
    ``not_ready`` must not be; ``exact``: nobody else is READY. ``view: server`` reads the
    server's source_status events, ``view: source`` each source's own status (a source
    that exited is not READY), ``view: client`` what a reader is offered: the harness's own
    ListSources (READY) and GetMetadata answers (``harness.engine.observer``; READY when listed with
    metadata found, else NOT_OFFERED or LISTED_NO_METADATA)."""

    at: Ref
    after: Duration | None = None
    ready: tuple[Name, ...] = ()
    not_ready: tuple[Name, ...] = ()
    exact: bool = False
    view: ListedView = "server"

    def process_refs(self) -> Iterable[tuple[str, str, tuple[str, ...] | None]]:
        for i, name in enumerate(self.ready):
            yield f"ready[{i}]", name, ("source", "reader")
        for i, name in enumerate(self.not_ready):
            yield f"not_ready[{i}]", name, ("source", "reader")

    def label(self, kind: str) -> str:
        return self.name or f"listed(at {self.at.describe()}: {', '.join(self.ready) or 'none'} READY)"


@register("listed", ListedParams)
def listed(p: ListedParams, h: History, run: RunFacts) -> CheckResult:
    """Last known status of every source at the moment, compared with the expectation."""
    anchor = resolve_ref(p.at, h)
    if anchor is None:
        return CheckResult("unknown", f"reference point ({p.at.describe()}) never happened")
    moment = anchor.t + (p.after or 0.0)
    teardown = h.first(actor="harness", f="teardown")
    if teardown is not None and moment >= teardown.t:
        return CheckResult("unknown", f"at {moment:.3f}s the run was tearing down (from {teardown.t:.3f}s, after the "
                                      "last step): the scenario must last past the moment it judges (a sleep step)",
                           {"t": round(moment, 6), "teardown_t": round(teardown.t, 6), "view": p.view})
    candidates = set(run.processes("source")) | set(p.ready) | set(p.not_ready)
    status: dict[str, str | None] = {}
    if p.view == "client":
        seen = [e for e in h.select(f="observed", since=moment - OBSERVED_FRESH_S, until=moment) if e.get("ok")]
        if not seen:
            return CheckResult("unknown", f"no client-side observation in the {OBSERVED_FRESH_S:g}s before {moment:.3f}s",
                               {"t": round(moment, 6), "view": p.view})
        status = {name: offered_status(h, name, seen[-1]) for name in sorted(candidates)}
    else:
        status = {name: stored_status(h, name, p.view, moment) for name in sorted(candidates)}
    ready_now = sorted(n for n, s in status.items() if s == "READY")
    details = {"t": round(moment, 6), "status": status, "ready": ready_now, "view": p.view}
    marks = ((moment, f"listed: {', '.join(ready_now) or 'none'} READY"),)
    unknown = [n for n in (*p.ready, *p.not_ready) if status.get(n) is None]
    problems = [f"{n} is {status.get(n)}, expected READY" for n in p.ready if status.get(n) not in (None, "READY")]
    problems += [f"{n} is READY, expected not READY" for n in p.not_ready if status.get(n) == "READY"]
    if p.exact:
        extra = sorted(set(ready_now) - set(p.ready))
        problems += [f"{n} is READY but not expected" for n in extra]
    if problems:
        return CheckResult(False, f"at {moment:.3f}s: " + "; ".join(problems), details, marks)
    if unknown:
        return CheckResult("unknown", f"at {moment:.3f}s: no {p.view}-side status for {', '.join(unknown)}", details, marks)
    return CheckResult(True, f"at {moment:.3f}s READY: {', '.join(ready_now) or 'none'}", details, marks)


def offered_status(h: History, source: str, observed: Entry) -> str:
    """READY when an observation (``harness.engine.observer``) lists one of the source's worker ids with
    metadata found; LISTED_NO_METADATA when listed without; else NOT_OFFERED."""
    ids = worker_ids(h, source)
    offered = [o for o in observed.get("offered") or [] if str(o.get("worker_id")) in ids]
    if any(o.get("metadata") for o in offered):
        return "READY"
    return "LISTED_NO_METADATA" if offered else "NOT_OFFERED"


def stored_status(h: History, source: str, view: View, moment: float) -> str | None:
    """The last status the server stored (``view: server``) or the source reported (``view:
    source``; EXITED once it exited) at ``moment``."""
    changes = status_changes(h, source, view, until=moment)
    current = changes[-1][1] if changes else None
    if view == "source" and current is not None:
        exits = h.select(actor=source, f="process_exit", until=moment)
        starts = h.select(actor=source, f="start", type="ok", until=moment)
        if exits and (not starts or exits[-1].t >= starts[-1].t):
            current = "EXITED"
    return current
