"""Cross-reference rules of fault and heal steps: what a fault names (processes, proxies,
hosts) exists and fits its kind, only healable faults take a duration, a heal names a
fault injected before it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness import faults as fault_registry
from harness.faults import FaultSpec
from harness.locate import Loc, did_you_mean
from harness.scenario.rules.context import Context
from harness.scenario.steps import FaultStep, HealStep, iter_steps
from harness.spec import SourceOf, Target

__all__ = ["FaultRefs", "check_faults", "fault_refs"]


@dataclass(frozen=True)
class FaultRefs:
    """What a fault spec names: processes, proxies, (key, host target) pairs, and the host
    kinds its host targets must have; ``healable``: whether it takes a duration."""

    processes: tuple[str, ...]
    proxies: tuple[str, ...]
    hosts: tuple[tuple[str, Target], ...]
    host_kinds: tuple[str, ...]
    healable: bool


def fault_refs(spec: FaultSpec) -> FaultRefs:
    """The one place that asks the fault registry what a spec references."""
    cls = fault_registry.REGISTRY[spec.kind]
    return FaultRefs(spec.process_refs(), spec.proxy_refs(), spec.host_refs(), spec.host_kinds, cls.healable)


def check_faults(cx: Context) -> None:
    procs = cx.sc.processes
    injected: set[str] = set()
    counter = 0
    for ref in iter_steps(cx.sc.steps):
        item, loc = ref.step, ref.loc
        if isinstance(item, FaultStep):
            counter += 1
            spec = item.fault
            refs = fault_refs(spec)
            for name in refs.processes:
                cx.need_process((*loc, "fault", "target"), name)
            for proxy in refs.proxies:
                cx.need_proxy((*loc, "fault", "proxy"), proxy)
            for key, message in spec.process_issues(procs):
                cx.add((*loc, "fault", key), message)
            for key, host_target in refs.hosts:
                _host_target(cx, (*loc, "fault", key), host_target, spec.kind, refs.host_kinds)
            target = getattr(spec, "target", None)
            if isinstance(target, SourceOf) and target.source_of in procs and procs[target.source_of].role != "reader":
                cx.add((*loc, "fault", "target", "source_of"), f"source_of names a reader, and "
                       f"{target.source_of!r} is a {procs[target.source_of].role}", target.source_of)
            if spec.duration is not None and not refs.healable:
                cx.add((*loc, "fault", "duration"), f"a {spec.kind} fault has nothing to heal, so it takes no duration")
            after = getattr(spec, "after", None)
            if isinstance(after, str) and isinstance(target, str) and target in procs:
                cx.need_event((*loc, "fault", "after"), target, after)
            injected.add(spec.name or f"{spec.kind}-{counter}")
        elif isinstance(item, HealStep):
            for i, name in enumerate(item.heal):
                if name == "all" or cx.unknown("faults", name):
                    continue
                if name not in cx.faults:
                    known = ", ".join(cx.faults) or "none defined"
                    cx.add((*loc, "heal", i), f"no fault named {name!r}{did_you_mean(name, list(cx.faults))} "
                           f"(faults: {known})")
                elif name not in injected:
                    cx.add((*loc, "heal", i), f"fault {name!r} is healed before it is injected")


def _host_target(cx: Context, loc: Loc, target: Target, kind: str, kinds: Sequence[str]) -> None:
    """A network fault's host parameter: a host, a process (its host) or ``{source_of: reader}``
    (the host of whichever source it attempts: every source must then be on a fitting host)."""
    sc = cx.sc
    procs, hosts = sc.processes, sc.hosts
    wanted = " or ".join(kinds)
    if isinstance(target, SourceOf):
        reader = target.source_of
        if not cx.need_process((*loc, "source_of"), reader):
            return
        if procs[reader].role != "reader":
            cx.add((*loc, "source_of"), f"source_of names a reader, and {reader!r} is a {procs[reader].role}", reader)
            return
        sources = [n for n, p in procs.items() if p.role == "source" and sc.host_of(n) in hosts]
        off = [n for n in sources if hosts[sc.host_of(n)].kind not in kinds]
        if off:
            cx.add(loc, f"a {kind} fault acts on {wanted} hosts, and source(s) {', '.join(off)} run on "
                   f"{' '.join(sorted({hosts[sc.host_of(n)].kind for n in off}))} hosts")
        return
    if target in hosts:
        if target in procs and sc.host_of(target) != target:
            cx.add(loc, f"{target!r} is both a host and a process on host {sc.host_of(target)!r}; rename one")
            return
        host = target
    elif target in procs:
        host = sc.host_of(target)
    else:
        if not (cx.unknown("hosts", target) or cx.unknown("processes", target)):
            cx.add(loc, f"no host or process named {target!r}{did_you_mean(target, [*hosts, *procs])} "
                   f"(hosts: {', '.join(hosts)}; processes: {', '.join(procs)})")
        return
    if host not in hosts:
        return  # the process's own host key is reported already
    if hosts[host].kind not in kinds:
        cx.add(loc, f"a {kind} fault acts on {wanted} hosts, and host {host!r} is {hosts[host].kind} "
               f"(declare it `{host}: {{kind: netns}}` under hosts)")
