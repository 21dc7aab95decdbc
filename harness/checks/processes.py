"""Process outcomes: ``exit_codes``, ``nothing_leaked``."""

from __future__ import annotations

import signal
from collections.abc import Iterable
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, WithJsonSchema

from harness.checks import CheckParams, CheckResult, RunFacts, register
from harness.record.timeline import History
from harness.spec import Name, custom_error


def _exit_code(value: Any) -> int | str:
    """An int (negative: killed by that signal, as Popen reports), a signal name (``KILL`` ->
    -9) or ``any``."""
    if isinstance(value, bool):
        raise custom_error("exit_code", f"{value!r} is not an exit code")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        word = value.strip()
        if word == "any":
            return "any"
        if word.lstrip("-").isdigit():
            return int(word)
        name = word.upper() if word.upper().startswith("SIG") else "SIG" + word.upper()
        if name in signal.Signals.__members__:
            return -int(signal.Signals[name])
    raise custom_error("exit_code", f"{value!r} is not an exit code, a signal name (KILL, TERM) or 'any'")


ExitCode = Annotated[
    int | str,
    BeforeValidator(_exit_code),
    WithJsonSchema({"anyOf": [{"type": "integer"}, {"type": "string"}]}),
]
# One code or a list of them; always a list once validated.
ExitCodes = Annotated[list[ExitCode], BeforeValidator(lambda v: v if isinstance(v, list | tuple) else [v])]


class ExitCodesParams(CheckParams):
    """The last incarnation of each listed process exited with the expected code (one
    code or a list; negative or a signal name: killed by that signal; ``any``).
    ``by_itself``: these processes must have exited before the harness stopped them."""

    expect: dict[Name, ExitCodes] = Field(min_length=1)
    by_itself: tuple[Name, ...] = ()

    def process_refs(self) -> Iterable[tuple[str, str, tuple[str, ...] | None]]:
        for name in self.expect:
            yield f"expect.{name}", name, None
        for i, name in enumerate(self.by_itself):
            yield f"by_itself[{i}]", name, None


@register("exit_codes", ExitCodesParams)
def exit_codes(p: ExitCodesParams, h: History, run: RunFacts) -> CheckResult:
    """Compare each process's last recorded exit with its expectation."""
    problems: list[str] = []
    unknown: list[str] = []
    seen: dict[str, Any] = {}
    for name, expected in p.expect.items():
        incarnations = h.incarnations(name)
        if not incarnations:
            problems.append(f"{name} never started")
            continue
        last = incarnations[-1]
        seen[name] = {"rc": last.rc, "stopped_by_harness": last.stopped_by_harness, "incarnation": last.incarnation}
        if last.end is None:
            unknown.append(f"{name} has no recorded exit")
            continue
        allowed = list(expected)
        if "any" not in allowed and last.rc not in allowed:
            problems.append(f"{name} exited {last.rc}, expected {' or '.join(str(a) for a in allowed)}")
        if name in p.by_itself and last.stopped_by_harness:
            problems.append(f"{name} was still running when the harness stopped it")
    details = {"exits": seen}
    if problems:
        return CheckResult(False, "; ".join(problems), details)
    if unknown:
        return CheckResult("unknown", "; ".join(unknown), details)
    return CheckResult(True, ", ".join(f"{n}={v['rc']}" for n, v in seen.items()), details)


class NothingLeakedParams(CheckParams):
    """After teardown no process of the run is alive (children and grandchildren of its processes
    included: whatever is in the run's scope, ``harness.machine.runscope``, or carries its tag), no port a
    process reported is open and (netns hosts) none of the run's namespaces, veths or bridge is left."""


def _described(process: dict[str, Any]) -> str:
    """``pid 123 (store: redis-server 127.0.0.1:6379)``: a leftover child is named after the
    process of the run it descends from."""
    cmdline = str(process.get("cmdline") or "")[:60]
    who = f"{process.get('proc') or '?'}: {cmdline}" if cmdline else str(process.get("proc") or "?")
    return f"pid {process.get('pid')} ({who})"


@register("nothing_leaked", NothingLeakedParams)
def nothing_leaked(p: NothingLeakedParams, h: History, run: RunFacts) -> CheckResult:
    """Reads the harness's post-teardown ``leak_scan`` entry."""
    scan = h.last(actor="harness", f="leak_scan")
    if scan is None:
        return CheckResult("unknown", "no leak scan was recorded (teardown did not finish)")
    procs = list(scan.get("processes", []))
    ports = list(scan.get("ports", []))
    details = {"processes": procs, "ports": ports, "checked_ports": scan.get("checked_ports", [])}
    reused = list(scan.get("reused_ports") or [])  # free again, and taken since by another run's process
    if reused:
        details["reused_ports"] = reused
    network = h.last(actor="harness", f="network")
    down = h.last(actor="harness", f="network_down")
    net_left: list[str] = []
    if network is not None and network.type == "ok":  # the run made namespaces: all must be gone
        if down is None:
            return CheckResult("unknown", "the run's network was never torn down (teardown did not finish)", details)
        net_left = [str(x) for x in down.get("leftovers", [])] or ([f"error: {down.get('error')}"] if down.get("error") else [])
        details["network"] = net_left
    unreachable = dict(scan.get("unreachable") or {})  # ssh hosts that could not be scanned
    if unreachable:
        details["unreachable"] = unreachable
        return CheckResult("unknown", f"host(s) {', '.join(sorted(unreachable))} could not be scanned: "
                           + next(iter(unreachable.values())), details)
    if procs or ports or net_left:
        parts = []
        if procs:
            parts.append(f"{len(procs)} process(es) alive: " + ", ".join(_described(x) for x in procs[:5]))
        if ports:
            parts.append("ports still open: " + ", ".join(str(x) for x in ports[:5]))
        if net_left:
            parts.append("network left: " + ", ".join(net_left[:5]))
        return CheckResult(False, "; ".join(parts), details)
    checked = len(scan.get("checked_ports", []))
    extra = ", namespaces and links deleted" if network is not None and network.type == "ok" else ""
    if reused:
        extra += (f" ({len(reused)} of them since taken by another run: "
                  + ", ".join(f"{r.get('port')}" for r in reused[:5]) + ")")
    return CheckResult(True, f"no process left, {checked} reported port(s) closed{extra}", details)
