"""What every cross-reference rule shares: the scenario (or the parts of it that validated),
the issues found so far, and the lookups that report a missing name with a did-you-mean.

A rule never complains about a name whose definition failed schema validation (that
problem is reported already): ``broken`` holds the sections that did not validate at all,
``broken_names`` the names of the entries that did not (a process, a proxy, a host, the
fault and mark names of a step that did not).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.locate import Loc, did_you_mean
from harness.scenario.document import Scenario
from mxref.events import COMMON_FIELDS, EVENTS

__all__ = ["Context", "SemanticIssue"]

# (location, message, value, show the value)
SemanticIssue = tuple[Loc, str, Any, bool]


@dataclass
class Context:
    sc: Scenario
    broken: frozenset[str] = frozenset()
    broken_names: Mapping[str, frozenset[str]] = field(default_factory=dict)
    issues: list[SemanticIssue] = field(default_factory=list)
    # filled by the step rules, read by the fault and check rules: name -> where defined
    faults: dict[str, Loc] = field(default_factory=dict)
    marks: dict[str, Loc] = field(default_factory=dict)

    def add(self, loc: Loc, message: str, value: Any = None, show: bool = False) -> None:
        self.issues.append((loc, message, value, show))

    def unknown(self, section: str, name: str) -> bool:
        """True when ``name`` may be defined in ``section`` but did not validate."""
        return section in self.broken or name in self.broken_names.get(section, frozenset())

    def need_process(self, loc: Loc, name: str, roles: Sequence[str] | None = None, what: str = "process") -> bool:
        """Is ``name`` a valid process (of one of ``roles``)? Reports it when not."""
        procs = self.sc.processes
        if name not in procs:
            if not self.unknown("processes", name):
                self.add(loc, f"no {what} named {name!r}{did_you_mean(name, list(procs))} "
                         f"(processes: {', '.join(procs) or 'none valid'})")
            return False
        if roles is not None and procs[name].role not in roles:
            self.add(loc, f"{name!r} is a {procs[name].role}, expected a {' or '.join(roles)}")
            return False
        return True

    def need_proxy(self, loc: Loc, name: str) -> bool:
        proxies = self.sc.proxies
        if name in proxies:
            return True
        if not self.unknown("proxies", name):
            self.add(loc, f"no proxy named {name!r}{did_you_mean(name, list(proxies))} "
                     f"(proxies: {', '.join(proxies) or 'none defined'})")
        return False

    def need_event(self, loc: Loc, process: str, event: str,
                   where: Mapping[str, Any] | None = None, where_loc: Loc | None = None) -> None:
        """``process`` writes events, ``event`` is one of mxref's, and ``where`` names its
        fields (and, for a field with a fixed set of values, one of those)."""
        procs = self.sc.processes
        if process in procs and procs[process].role == "command":
            self.add(loc, f"{process!r} is a command process and writes no events")
            return
        spec = EVENTS.get(event)
        if spec is None:
            self.add(loc, f"{event!r} is not an mxref event{did_you_mean(event, list(EVENTS))}")
            return
        for key, value in (where or {}).items():
            here = (*(where_loc or loc), key)
            fields = [*spec.fields, *COMMON_FIELDS]
            if key not in fields:
                self.add(here, f"{key!r} is not a field of {event} events{did_you_mean(key, fields)} "
                         f"(fields: {', '.join(fields)})")
                continue
            allowed = spec.fields.get(key)
            if allowed and value not in allowed:
                hint = next((f"; did you mean {a!r}?" for a in allowed if str(value).lower() == a.lower()), "")
                hint = hint or did_you_mean(str(value), allowed)
                self.add(here, f"not one of the values {event}.{key} takes ({', '.join(allowed)}){hint}", value, True)

    def need_within(self, loc: Loc, seconds: float | None) -> None:
        if "budgets" in self.broken:
            return
        run = self.sc.budgets.run
        if seconds is not None and seconds > run:
            self.add(loc, f"{seconds:g}s is longer than the whole run's budget (budgets.run {run:g}s)", seconds, True)
