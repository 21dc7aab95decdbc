"""Shrinking a failing schedule by the goals, in order: fewest faults, earliest times, shortest
durations, first options (the ``goals`` shrinker of ``mxchaos explore``).

Each candidate is one real run of many seconds, and the failures worth finding are
timing-dependent (the TCP-reset abort shows in about half the runs), so the order of the
candidates decides what a budget buys. Hypothesis' own shrinker works on its choice sequence:
measured on ``scenarios/explore/tcp_reset.explore.yaml`` (seed 9, 8 minutes, runs of 11-26 s
on a loaded 2-core machine) it spent 15 runs on candidates that changed a fault's kind, target
or time and never deleted one (3 faults before, 3 after). This shrinker asks for the biggest
win first: it tries every schedule with one fault fewer (each up to ``DELETE_TRIES`` times, as
one passing run of a flaky failure proves little), then each fault at offset 0 (else halfway),
each ranged duration at its low end (else halfway), each ``one_of`` at its first option; it
restarts from the first goal after every success (a candidate that used up its tries is not
asked again) and ends when no candidate fails, or when ``fails`` answers None (the budget is
spent). Candidates are pure functions of the schedule.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

from harness.explore.schedule import DrawnFault, Schedule
from harness.explore.template import Template

__all__ = ["DELETE_TRIES", "GOALS", "shrink"]

DELETE_TRIES = 2  # runs of a candidate with one fault fewer before it counts as passing


def fewer_faults(s: Schedule, t: Template) -> Iterator[Schedule]:
    if len(s.faults) <= t.spec.at_once.min:
        return
    for i in range(len(s.faults)):
        yield Schedule(s.faults[:i] + s.faults[i + 1:])


def _with(s: Schedule, i: int, fault: DrawnFault) -> Schedule:
    return Schedule((*s.faults[:i], fault, *s.faults[i + 1:]))


def earlier(s: Schedule, t: Template) -> Iterator[Schedule]:
    for i, f in enumerate(s.faults):
        if f.offset_ms > 0:
            yield _with(s, i, replace(f, offset_ms=0))
            if f.offset_ms > 1:
                yield _with(s, i, replace(f, offset_ms=f.offset_ms // 2))


def _set(f: DrawnFault, key: str, value: object) -> DrawnFault:
    return replace(f, values=tuple((k, value if k == key else v) for k, v in f.values))


def shorter(s: Schedule, t: Template) -> Iterator[Schedule]:
    for i, f in enumerate(s.faults):
        values = dict(f.values)
        for p in t.faults[f.choice].params:
            if p.form != "range":
                continue
            ms = round(float(values[p.key]) * 1000)
            if ms > p.lo_ms:
                yield _with(s, i, _set(f, p.key, p.lo_ms / 1000))
                mid = (p.lo_ms + ms) // 2
                if p.lo_ms < mid < ms:
                    yield _with(s, i, _set(f, p.key, mid / 1000))


def first_options(s: Schedule, t: Template) -> Iterator[Schedule]:
    for i, f in enumerate(s.faults):
        values = dict(f.values)
        for p in t.faults[f.choice].params:
            if p.form == "one_of" and values[p.key] != p.options[0]:
                yield _with(s, i, _set(f, p.key, p.options[0]))


Candidates = Callable[[Schedule, Template], Iterator[Schedule]]
GOALS: tuple[tuple[str, Candidates, int], ...] = (
    ("fewest faults", fewer_faults, DELETE_TRIES),
    ("earliest times", earlier, 1),
    ("shortest durations", shorter, 1),
    ("first options", first_options, 1),
)


def shrink(start: Schedule, template: Template, fails: Callable[[Schedule, int], bool | None]) -> list[tuple[str, Schedule]]:
    """The accepted steps from ``start`` (goal, schedule), each failing and smaller by the goals.
    ``fails(candidate, attempt)`` runs the candidate (attempt 0, 1, ...): True when it shows the
    failure, False when not, None when no more runs may start."""
    best = start
    steps: list[tuple[str, Schedule]] = []
    passed: set[str] = set()  # candidates that used up their tries without failing: not asked again
    improved = True
    while improved:
        improved = False
        for goal, candidates, tries in GOALS:
            for candidate in candidates(best, template):
                if candidate.key() in passed:
                    continue
                for attempt in range(tries):
                    verdict = fails(candidate, attempt)
                    if verdict is None:
                        return steps
                    if verdict:
                        break
                else:
                    passed.add(candidate.key())
                    continue
                best = candidate
                steps.append((goal, best))
                improved = True
                break
            if improved:
                break
    return steps
