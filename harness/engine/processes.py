"""The process table: every scenario process of a run, its incarnations, ports and exits.

``ProcessTable`` spawns and stops processes on their hosts and records both; tails each
process's events file into the timeline (tagging lines with the incarnation that wrote them);
learns the ports each incarnation reports (``listening`` events); records exits (and how and
when each incarnation ended, for a fault whose target is gone); answers
"which port does X listen on" (waiting, bounded); signals processes for faults; and scans for
anything of the run that outlived its stop. It builds no command lines (``harness.engine.launch``)
and runs no threads of its own (``harness.engine.watch`` polls it).
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
import traceback
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.engine.waits import RunClock
from harness.errors import FaultError, HarnessError, StepFailed
from harness.hosts.base import Host, Proc
from harness.hosts.clocks import HOST_CLOCKS, STAMP_SLACK_S, ClockOffsets, IncarnationClock, place
from harness.machine import procscan, runscope
from harness.record import ucxlog
from harness.record.timeline import Entry, Timeline, matches
from harness.scenario import CommandProcess, Scenario
from harness.spec import Scalar

__all__ = ["ProcState", "ProcessTable", "await_event"]


@dataclass
class ProcState:
    """One scenario process: its spec, host, files, and its current incarnation."""

    name: str
    role: str
    host: Host
    events_path: Path | None  # None: a plain command (it writes no events)
    log_path: Path
    incarnation: int = 0
    proc: Proc | None = None
    pid: int | None = None
    start_index: int = 0  # timeline index when the current incarnation started
    exit_recorded: bool = True
    stopping: bool = False
    offset: int = 0
    partial: bytes = b""
    ports: dict[str, int] = field(default_factory=dict)  # what -> port (current incarnation)
    last_grpc_port: int | None = None  # a restarted server binds its previous port again
    started_order: int = 0
    all_ports: set[int] = field(default_factory=set)
    last_ports: dict[str, int] = field(default_factory=dict)  # the last port reported per ``what``
    pids: dict[int, int] = field(default_factory=dict)  # pid -> incarnation
    last_exit: dict[str, Any] | None = None  # the latest process_exit value, with its t
    log_start: int = 0  # where the current incarnation's writes begin in log_path
    clocks: dict[int, IncarnationClock] = field(default_factory=dict)  # incarnation -> its start and clock offsets

    @property
    def alive(self) -> bool:
        return self.proc is not None and not self.exit_recorded

    @property
    def ended(self) -> str | None:
        """How the current incarnation ended (``exited (rc -9, SIGKILL) at 3.21s``, ``was never
        started``); None while it runs."""
        if self.alive:
            return None
        if self.proc is None or self.last_exit is None:
            return "was never started"
        rc, sig = self.last_exit.get("rc"), self.last_exit.get("signal")
        how = f"rc {rc}, {sig}" if sig else f"rc {rc}"
        by = ", stopped by the harness" if self.last_exit.get("stopped_by_harness") else ""
        return f"exited ({how}{by}) at {self.last_exit['t']:.3f}s"


SWEEP_WAIT_S = 5.0  # how long a sweep waits for the processes it killed to be gone


class ProcessTable:
    """The run's processes (thread-safe: the monitor, branches and faults share it)."""

    def __init__(self, timeline: Timeline, clock: RunClock, states: Iterable[ProcState]) -> None:
        self.timeline = timeline
        self.clock = clock
        self.states: dict[str, ProcState] = {st.name: st for st in states}
        self.lock = threading.RLock()
        self._start_counter = 0

    @classmethod
    def for_scenario(cls, sc: Scenario, hosts: Mapping[str, Host], proc_dir: Path, timeline: Timeline, clock: RunClock) -> ProcessTable:
        states = [
            ProcState(
                name=name,
                role=str(spec.role),
                host=hosts[sc.host_of(name)],
                events_path=None if isinstance(spec, CommandProcess) else proc_dir / f"{name}.events.jsonl",
                log_path=proc_dir / f"{name}.log",
            )
            for name, spec in sc.processes.items()
        ]
        return cls(timeline, clock, states)

    def state(self, name: str) -> ProcState:
        try:
            return self.states[name]
        except KeyError:
            raise HarnessError(f"no process named {name!r}") from None

    def live(self) -> list[ProcState]:
        """The running processes, in the order they were started."""
        with self.lock:
            return sorted((st for st in self.states.values() if st.alive), key=lambda s: s.started_order)

    # ------------------------------------------------------------------ start / stop

    def spawn(self, name: str, argv: Sequence[str], env: Mapping[str, str], cwd: Path,
              clocks: ClockOffsets = HOST_CLOCKS) -> dict[str, Any]:
        """Start the next incarnation of ``name`` (recorded: invoke, then ok with its pid), in a
        time namespace with ``clocks``' offsets when they are not zero."""
        st = self.state(name)
        with self.lock:
            if st.alive:
                raise StepFailed("-", f"{name} is already running (pid {st.pid})")
            incarnation = st.incarnation + 1
            # wrapped by its host, whose unshare and libfaketime run it (an ssh host's, not this machine's),
            # before anything is recorded: the host may have no libfaketime
            launched = list(argv) if clocks.none else st.host.wrap_clocks(argv, clocks)
            invoked = self.timeline.append("invoke", name, "start", {"incarnation": incarnation})
            st.start_index = len(self.timeline)
            st.log_start = st.log_path.stat().st_size if st.log_path.is_file() else 0
            st.clocks[incarnation] = IncarnationClock(invoked.t, clocks)
            proc = st.host.spawn(launched, env=env, cwd=cwd, log_path=st.log_path)
            st.ports = {}
            self._start_counter += 1
            st.started_order = self._start_counter
            st.proc, st.pid, st.incarnation = proc, proc.pid, incarnation
            st.pids[proc.pid] = incarnation
            st.exit_recorded, st.stopping = False, False
            value = {"incarnation": incarnation, "pid": proc.pid, "argv": list(argv), "host": st.host.name}
            if not clocks.none:
                value["clocks"] = clocks.record()
            self.timeline.append("ok", name, "start", value)
        return value

    def stop(self, name: str, grace: float, reason: str = "step") -> dict[str, Any]:
        """TERM, ``grace`` seconds, KILL (recorded); a process already gone is recorded as such."""
        st = self.state(name)
        with self.lock:
            if not st.alive or st.proc is None:
                value: dict[str, Any] = {"already_exited": True, "reason": reason}
                self.timeline.append("info", name, "stop", value)
                return value
            st.stopping = True
            proc, pid = st.proc, st.pid
            self.timeline.append("invoke", name, "stop", {"pid": pid, "grace": grace, "reason": reason})
        result = proc.stop(grace)
        self.record_exit(st, result.rc)
        value = {"pid": pid, "rc": result.rc, "escalated": result.escalated, "seconds": round(result.seconds, 3)}
        self.timeline.append("ok", name, "stop", value)
        return value

    # ------------------------------------------------------------------ signals (faults)

    def send_signal(self, name: str, sig: int, *, group: bool = True) -> int:
        """Signal the current incarnation of ``name``; its pid. FaultError naming how and when
        it ended when it is not running (an exit the monitor has not seen yet included)."""
        st = self.state(name)
        with self.lock:
            self._check_exit(st)
            if not st.alive or st.proc is None or st.pid is None:
                raise FaultError(f"{name} is not running: it {st.ended}")
            if not st.proc.signal(sig, group=group):
                self._check_exit(st)
                raise FaultError(f"{name} (pid {st.pid}) is gone" + (f": it {st.ended}" if st.ended else ""))
            return st.pid

    def refresh(self, name: str) -> ProcState:
        """``name``'s state with its exit recorded now if it has ended (not at the next poll)."""
        st = self.state(name)
        with self.lock:
            self._check_exit(st)
        return st

    def signal_pid(self, pid: int, sig: int, *, group: bool = True) -> bool:
        """Signal ``pid`` only while it is still a live process of this run."""
        with self.lock:
            for st in self.states.values():
                if st.pid == pid and st.proc is not None and st.proc.poll() is None:
                    return st.proc.signal(sig, group=group)
        return False

    # ------------------------------------------------------------------ events and exits

    def poll(self) -> None:
        """Drain every events file and record every exit (the monitor calls this)."""
        with self.lock:
            states = list(self.states.values())
        for st in states:
            try:
                self._drain_events(st)
                self._check_exit(st)
            except Exception:  # noqa: BLE001 - never let the monitor die; recorded
                self.timeline.append("info", "harness", "monitor_error", {"process": st.name, "traceback": traceback.format_exc()})

    def drain(self, names: Iterable[str]) -> None:
        """Drain the events files of ``names`` only (the monitor, woken by their growth)."""
        for name in names:
            st = self.states.get(name)
            if st is None:
                continue
            try:
                self._drain_events(st)
            except Exception:  # noqa: BLE001 - never let the monitor die; recorded
                self.timeline.append("info", "harness", "monitor_error", {"process": st.name, "traceback": traceback.format_exc()})

    def local_events_files(self) -> dict[Path, str]:
        """Events file -> process, for the processes whose host's events files grow on this
        machine's file system (``Host.events_local``: written here, or an ssh host's mirrors): the
        monitor watches those for growth; any other is only polled."""
        with self.lock:
            return {st.events_path: st.name for st in self.states.values() if st.events_path is not None and st.host.events_local}

    def _drain_events(self, st: ProcState) -> None:
        if st.events_path is None:
            return
        with self.lock:
            data = st.host.read(st.events_path, st.offset)
            if not data:
                return
            st.offset += len(data)
            lines = (st.partial + data).split(b"\n")
            st.partial = lines.pop()
            for line in lines:
                if line.strip():
                    self._ingest(st, line)

    def _ingest(self, st: ProcState, line: bytes) -> None:
        try:
            record = json.loads(line)
            event = str(record["event"])
            mono = float(record["mono"])
        except (ValueError, KeyError, TypeError):
            self.timeline.append("info", st.name, "bad_event_line", {"line": line[:500].decode(errors="replace")})
            return
        value = {k: v for k, v in record.items() if k not in ("event", "mono", "ts", "proc", "role")}
        pid = record.get("pid")
        if isinstance(pid, int) and pid in st.pids:
            value["incarnation"] = st.pids[pid]
        t, rejected = self._place(st, mono, st.pids.get(pid, st.incarnation) if isinstance(pid, int) else st.incarnation)
        if rejected is not None:
            value["clock_rejected"] = rejected
        self.timeline.append("info", st.name, event, value, t=t)
        port = record.get("port")
        if event == "listening" and isinstance(port, int):
            what = str(record.get("what", ""))
            if not isinstance(pid, int) or pid == st.pid:
                st.ports[what] = port
                st.last_ports[what] = port
                if what == "grpc":
                    st.last_grpc_port = port
            st.all_ports.add(port)

    def _place(self, st: ProcState, mono: float, incarnation: int) -> tuple[float, dict[str, Any] | None]:
        """Where an event stamped ``mono`` by ``incarnation`` of ``st`` goes on the timeline
        (``harness.hosts.clocks``): the offsets the harness gave that incarnation taken off, an ssh
        host's clock mapped onto ours, then bounded by its start and by now."""
        clock = st.clocks.get(incarnation)
        if clock is not None:
            mono -= clock.offsets.monotonic_s
        mono = st.host.local_mono(mono)  # an ssh host's clock, mapped onto ours
        slack = STAMP_SLACK_S + st.host.mono_error_s()
        return place(self.timeline.t_of_mono(mono), started_t=clock.started_t if clock else None,
                     received_t=self.timeline.now(), slack=slack)

    def _check_exit(self, st: ProcState) -> None:
        with self.lock:
            if st.proc is None or st.exit_recorded:
                return
            rc = st.proc.poll()
            if rc is not None:
                self.record_exit(st, rc)

    def record_exit(self, st: ProcState, rc: int | None) -> None:
        with self.lock:
            if st.exit_recorded:
                return
            self._drain_events(st)
            value: dict[str, Any] = {"pid": st.pid, "incarnation": st.incarnation, "rc": rc, "stopped_by_harness": st.stopping}
            if rc is not None and rc < 0:
                with contextlib.suppress(ValueError):
                    value["signal"] = signal.Signals(-rc).name
            st.exit_recorded = True
            st.ports = {}
            entry = self.timeline.append("info", st.name, "process_exit", value)
            st.last_exit = {**value, "t": entry.t}
            found = ucxlog.endpoints(st.log_path, st.log_start)  # what UCX built (UCX_LOG_LEVEL=info)
            if found:
                self.timeline.append("info", st.name, "ucx_endpoints", {"incarnation": st.incarnation, "endpoints": found})

    # ------------------------------------------------------------------ endpoints

    def endpoint(self, name: str, what: str, deadline: float) -> int:
        """The port the current incarnation of ``name`` reported for ``what`` (waits, bounded)."""
        st = self.state(name)
        with self.lock:
            if what in st.ports:
                return st.ports[what]
            if not st.alive:
                raise StepFailed("-", f"{name} is not running, so it has no {what} port")
            start, pid = st.start_index, st.pid

        def seen(e: Entry) -> bool:
            if e.actor != name:
                return False
            if e.f == "process_exit":
                return True
            return e.f == "listening" and e.get("what") == what and e.get("pid") == pid

        entry = self.clock.wait_entry(seen, deadline, start=start)
        if entry is None:
            raise StepFailed("-", f"{name} reported no {what} port in time")
        if entry.f == "process_exit":
            raise StepFailed("-", f"{name} exited (rc {entry.get('rc')}) before reporting its {what} port")
        return int(entry.get("port"))

    def address(self, name: str, what: str, deadline: float) -> str:
        """``host:port`` of ``name``'s ``what`` endpoint (waits for the port, bounded)."""
        port = self.endpoint(name, what, deadline)
        return f"{self.state(name).host.address}:{port}"

    # ------------------------------------------------------------------ leaks

    def leak_scan(self, run_id: str, hosts: Iterable[Host], harness_ports: Iterable[tuple[Host, int]] = ()) -> None:
        """Record what outlived the stop of every process, then kill it (the harness itself
        must never leak), then remove the run's scope. Each host finds the run's processes the one
        way (``procscan.find``: the run's cgroup and ledger of pids, so a wrapper's child, a
        grandchild with a blank environment, counts too). Grandchildren that exit right after
        their parent get a moment."""
        hosts = list(hosts)
        deadline = time.monotonic() + 2.0
        unreachable: dict[str, str] = {}
        while True:
            found = {}
            for host in hosts:
                try:
                    found.update({p.pid: p for p in host.run_processes(run_id)})
                except HarnessError as exc:  # an ssh host that stopped answering: named, not scanned
                    unreachable[host.name] = str(exc)
                    hosts = [h for h in hosts if h is not host]
            leftovers = list(found.values())
            if not leftovers or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        ports: list[int] = []
        checked: list[int] = []
        reused: list[dict[str, object]] = []
        probes = [(st.host, port) for st in self.states.values() for port in sorted(st.all_ports)]
        for host, port in [*probes, *harness_ports]:
            checked.append(port)
            if host.port_open(port):
                others = _held_by_other_runs(host, port, run_id)
                if others:
                    reused.append({"port": port, "by": others})
                else:
                    ports.append(port)
        self.timeline.append(
            "info", "harness", "leak_scan", {"processes": [p.to_json() for p in leftovers], "ports": ports, "checked_ports": checked,
                                             **({"reused_ports": reused} if reused else {}),
                                             **({"unreachable": unreachable} if unreachable else {})}
        )
        if leftovers:
            alive = self._sweep(run_id, hosts, set(found), time.monotonic() + SWEEP_WAIT_S)
            self.timeline.append("info", "harness", "swept", {"pids": [p.pid for p in leftovers], "alive": alive})
        runscope.remove(run_id)  # its cgroups and ledger of pids (a cgroup that still holds a process stays)

    @staticmethod
    def _sweep(run_id: str, hosts: list[Host], pids: set[int], deadline: float) -> list[int]:
        """SIGKILL ``pids``, each on its own host (an ssh host kills there, not here), again
        until every host's scan has lost them or ``deadline`` passes; the ones still there then.
        A killed process is still listed, running, until the kernel has torn it down (a
        clean-clone run's scan found one 'R' just after a sweep that did not wait, on a busy
        machine), so a sweep is done only when its processes are gone."""
        while True:
            if any(host.local_files for host in hosts):  # processes of this machine
                runscope.kill(run_id, wait=0)  # the run's cgroups here at once, forks in flight included
            alive: set[int] = set()
            for host in hosts:
                try:
                    mine = {p.pid for p in host.run_processes(run_id)} & pids
                except HarnessError:
                    continue
                alive |= mine
                if mine:
                    host.kill_processes(sorted(mine))
            if not alive or time.monotonic() > deadline:
                return sorted(alive)
            time.sleep(0.02)


def await_event(
    table: ProcessTable,
    process: str,
    event: str,
    where: Mapping[str, Scalar],
    deadline: float,
    count: int = 1,
    since: str = "incarnation",
) -> Entry | None:
    """The ``count``-th ``event`` from ``process`` matching ``where`` (None at ``deadline``).
    ``since``: ``incarnation`` (the current one's events only), ``step`` (from now) or
    ``run`` (from the start)."""
    st = table.state(process)
    incarnation: int | None
    if since == "incarnation":
        start, incarnation = max(0, st.start_index - 1), st.incarnation
    elif since == "step":
        start, incarnation = len(table.timeline), None
    else:
        start, incarnation = 0, None

    def hit(e: Entry) -> bool:
        if e.actor != process or e.f != event or e.type != "info":
            return False
        if incarnation is not None and e.get("incarnation") not in (incarnation, None):
            return False
        return matches(e, where)

    return table.clock.wait_entry(hit, deadline, start=start, count=count)


def _held_by_other_runs(host: Host, port: int, run_id: str) -> list[dict[str, object]]:
    """The processes of other runs that listen on ``port`` now, when every listener on it is one
    (it was this run's and is free again: a run beside this one, in another matrix lane or test
    worker, took it since), else nothing. Only a host whose processes this one's /proc shows
    (``local_files``: local, network namespaces) can tell; anything else, or a listener of no run,
    stays a leak."""
    if not host.local_files:
        return []
    holders = procscan.listeners(port)
    if not holders:
        return []
    runs = {p.pid: p for p in procscan.find(None)}
    if not all(pid in runs and runs[pid].run_id != run_id for pid in holders):
        return []
    return [{"pid": pid, "run_id": runs[pid].run_id, "proc": runs[pid].proc} for pid in sorted(holders)]
