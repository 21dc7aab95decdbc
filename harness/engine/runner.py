"""The runner: a run's phases in order and its signals; the steps go to ``harness.engine.steps``.

``Runner(scenario).run()`` goes through, in order:

1. **skip** when a capability the scenario needs is missing (``harness.scenario.capabilities``);
2. **setup**: the run folder, ``scenario.json``, ``timeline.jsonl`` (written as entries come),
   ``run.json`` and the ledger entry (``harness.machine.ledger``), the network of netns hosts
   (``harness.hosts.netns``), the run's throwaway CA, certificate and token when the scenario asks for
   ``security`` (``mxref.pki``), the hosts and the process table (``harness.engine.processes``);
3. **prepare** the readers' disk checkpoint (``harness.engine.checkpoint``, cached between runs);
4. **proxies**: the run's toxiproxy server when the scenario has proxies (``harness.engine.proxies``);
5. **watch**: monitor, scraper and watchdog threads (``harness.engine.watch``), the listing observer;
6. **steps**, interpreted by ``harness.engine.steps`` (sequence; ``parallel`` branches in threads); every wait is
   bounded by ``harness.engine.waits.RunClock`` and wakes on abort; faults go through the nemesis
   (``harness.engine.nemesis``); command lines come from ``harness.engine.launch``;
7. **teardown**, in ``finally`` (also on SIGINT/SIGTERM, which raise ``RunInterrupted`` in the
   main thread): heal every active fault, scrape once more, stop every process (TERM, grace,
   KILL), stop the proxies, scan for leaks, delete the network, drop the ledger entry;
8. **judge**: record the outcome, freeze the timeline, run the checks, merge the verdict
   (``harness.judge.verdict``); the caller writes the report.

Each phase gets what it needs passed in explicitly; only this module knows their order.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from pydantic import BaseModel

from harness.engine import checkpoint, launch
from harness.engine.nemesis import Nemesis, RunFaultContext
from harness.engine.observer import ListingObserver, start_observer, stop_observer
from harness.engine.processes import ProcessTable
from harness.engine.proxies import ProxyView, RunProxies
from harness.engine.steps import StepInterpreter
from harness.engine.waits import RunClock
from harness.engine.watch import Scraper, Stacks, Watchers
from harness.errors import HarnessError, RunInterrupted, StepFailed
from harness.hosts import clocks, netns, ssh
from harness.hosts.base import Host, make_host
from harness.hosts.inventory import Inventory
from harness.judge import content
from harness.judge.exercised import not_exercised
from harness.judge.verdict import RunResult, judge, verdict_of
from harness.machine import ledger, procscan, statedir
from harness.record.load import load_sample
from harness.record.saved import RunInfo
from harness.record.timeline import Entry, Timeline
from harness.reports.console import interrupt_line, tell
from harness.reports.report import write_scenario_files
from harness.scenario import (
    ReaderProcess,
    Scenario,
    ServerProcess,
    SourceProcess,
    capabilities,
)
from mxref import pki
from mxref.signals import Relay

__all__ = ["Runner"]

StepValue = dict[str, Any] | None


class Runner:
    def __init__(
        self,
        scenario: Scenario,
        *,
        out_dir: str | Path = "runs",
        run_id: str | None = None,
        observers: Sequence[Callable[[Entry], None]] = (),
        install_signal_handlers: bool = True,
        inventory: Inventory | None = None,
    ) -> None:
        self.scenario = scenario
        self.inventory = inventory  # its machines host the scenario's hosts, over ssh (harness.hosts.ssh)
        self.run_id = run_id or ledger.new_run_id(scenario.name)
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        self.run_dir = (Path(out_dir) / scenario.name / f"{stamp}-{self.run_id[-6:]}").resolve()
        self.install_signal_handlers = install_signal_handlers
        self.timeline = Timeline()
        for observer in observers:
            self.timeline.add_listener(observer)
        self.clock = RunClock(self.timeline, run_budget=scenario.budgets.run, step_budget=scenario.budgets.step)
        self.who = launch.HarnessIdentity(self.run_id, os.getpid(), procscan.proc_start_time(os.getpid()))
        self.hosts: dict[str, Host] = {}
        self.network: netns.Network | None = None  # the namespaces of the netns hosts
        self.table = ProcessTable(self.timeline, self.clock, ())
        self.proxies = RunProxies(self.run_id, self.run_dir, self.timeline)
        self.stacks = Stacks(self.run_dir, self.table)
        self.scraper = Scraper(scenario.scrape, self.table, self.timeline)
        self.watchers = Watchers(
            timeline=self.timeline, clock=self.clock, table=self.table, proxies=self.proxies,
            scraper=self.scraper, budgets=scenario.budgets, on_hang=self._declare_hang,
        )
        self.nemesis = Nemesis(scenario, self.timeline, self._fault_context())
        self._checkpoint: Path | None = None
        self._observer: ListingObserver | None = None  # the client's view, when a check asks for it
        self._credentials: pki.RunCredentials | None = None
        self._run_info: dict[str, Any] = {}
        self._hang = False
        self._lost: str | None = None  # why a host stopped answering (ssh, or srun's own failure): the run is an error
        self._tearing_down = False
        self._forced = False  # a second Ctrl-C in the teardown: stops without grace (faults still heal)
        self._interrupted: int | None = None
        self._defer_depth = 0  # > 0: inside _signals_deferred (main thread)
        self.steps = StepInterpreter(
            scenario, timeline=self.timeline, clock=self.clock, table=self.table, nemesis=self.nemesis,
            scraper=self.scraper, stacks=self.stacks, start=self.start_process, deferred=self._signals_deferred,
        )

    @property
    def handled_steps(self) -> frozenset[type[BaseModel]]:
        """The step models the interpreter has a handler for (``harness.engine.steps``)."""
        return self.steps.handled

    # ------------------------------------------------------------------ phases

    def run(self) -> RunResult:
        started_wall = dt.datetime.now(dt.UTC).isoformat()
        sc = self.scenario
        not_playable = sc.not_playable()  # staged with mxref's own means: another subject cannot play it
        if not_playable:
            return self._skipped(started_wall, [], not_playable)
        if self.inventory is None:
            lacking, why = capabilities.describe_missing(capabilities.scenario_requirements(sc))
        else:
            lacking, why = capabilities.missing_on_ssh(sc, self.inventory, self.run_id, self.run_dir)
        if lacking:
            return self._skipped(started_wall, lacking, why)
        status, reason, failed_step = "completed", "", None
        with self._signals():
            try:
                try:
                    self._setup()
                    self.timeline.append("invoke", "harness", "run", {"run_id": self.run_id, "seed": sc.seed, "load": load_sample()})
                    self._checkpoint = checkpoint.prepare(
                        sc, host=self._prepare_host(), run_dir=self.run_dir, env=launch.base_env(os.environ, self.who, "prepare"),
                        timeline=self.timeline,
                    )
                    for name in sc.processes:  # folders a fault acts on exist before any step (disk)
                        content.reader_checkpoint(sc, name, self._checkpoint, self.run_dir, self.timeline)
                    self._start_proxies()
                    self.watchers.start()
                    self._observer = start_observer(sc, self.table, self.timeline, self._credentials)
                    self.steps.run(sc.steps, "")
                except StepFailed as exc:
                    status, reason, failed_step = "step_failed", exc.reason, exc.step
                except RunInterrupted as exc:
                    status, reason = "interrupted", f"harness got {signal.Signals(exc.signum).name}"
                    self._interrupted = exc.signum
                except HarnessError as exc:
                    status, reason = "error", str(exc)
                except Exception as exc:  # noqa: BLE001 - a harness bug still heals and reports
                    status, reason = "error", f"{type(exc).__name__}: {exc}"
                    self.timeline.append("info", "harness", "error", {"traceback": traceback.format_exc()})
            except RunInterrupted:
                pass  # raised inside one of the handlers above: decided below
            finally:
                self._tearing_down = True  # first: a signal from here on is ignored, not raised
                self._teardown()
        signum = self.clock.signalled
        if signum is not None and status != "interrupted":  # its exception was swallowed on the way
            status, reason, failed_step = "interrupted", f"harness got {signal.Signals(signum).name}", None
            self._interrupted = signum
        if self._hang:
            status, reason = "hang", self.clock.reason or "no progress"
        if self._lost is not None and status in ("step_failed", "error"):  # the environment's doing, not the subject's
            status, reason, failed_step = "error", self._lost if reason in (None, "", self._lost) else f"{self._lost}; {reason}", None
        if self.nemesis.heal_failures:
            status, reason = _heal_outcome(status, reason, self.nemesis.heal_failures)
        self.timeline.append("info", "harness", "outcome", {"status": status, "reason": reason, "failed_step": failed_step})
        self.timeline.close_sink()
        history = self.timeline.snapshot()
        results = judge(sc, history)
        unexercised = not_exercised(history)
        return RunResult(
            scenario=sc,
            run_id=self.run_id,
            run_dir=self.run_dir,
            status=status,
            reason=reason,
            verdict=verdict_of(status, results, sc.known_defect, unexercised),
            history=history,
            checks=results,
            started_at=started_wall,
            seconds=self.timeline.now(),
            seed=sc.seed,
            failed_step=failed_step,
            stacks=dict(self.stacks.written),
            interrupted_by=self._interrupted,
            not_exercised=unexercised,
        )

    def _skipped(self, started_wall: str, lacking: list[str], why: str) -> RunResult:
        """Nothing starts: a fault of the scenario needs what this machine lacks, or its subject cannot play it."""
        self.timeline.append("info", "harness", "skip", {"missing": lacking, "reason": why})
        self.timeline.append("info", "harness", "outcome", {"status": "skipped", "reason": why, "failed_step": None})
        return RunResult(
            scenario=self.scenario,
            run_id=self.run_id,
            run_dir=self.run_dir,
            status="skipped",
            reason=why,
            verdict="skip",
            history=self.timeline.snapshot(),
            checks=[],
            started_at=started_wall,
            seconds=self.timeline.now(),
            seed=self.scenario.seed,
            missing_capabilities=lacking,
        )

    def _setup(self) -> None:
        sc = self.scenario
        (self.run_dir / "procs").mkdir(parents=True, exist_ok=True)
        # what a crash of the harness must not lose, from now on: every entry as it is recorded,
        # and the scenario `mxchaos check` re-judges with (written again with the report)
        self.timeline.open_sink(self.run_dir / "timeline.jsonl")
        try:
            write_scenario_files(self.run_dir, sc)
        except Exception as exc:  # noqa: BLE001 - only a crashed run misses them; never fails a run
            self.timeline.append("info", "harness", "scenario_files", {"error": f"{type(exc).__name__}: {exc}"})
        self._run_info = {
            "run_id": self.run_id,
            "scenario": sc.name,
            "scenario_path": str(sc.path) if sc.path else None,
            "run_dir": str(self.run_dir),
            "run_dir_id": statedir.dir_identity(self.run_dir),  # cleanup writes there only if it is still this folder
            "harness_pid": self.who.pid,
            "harness_start": self.who.start,
            "ssh": self.inventory is not None,  # its faults may reach inventory machines (harness.hosts.ssh_sweep)
            "started": dt.datetime.now(dt.UTC).isoformat(),
            "t0_monotonic": self.timeline.t0,
        }
        self._write_run_info()  # before the network: a crash while building it is swept by run id
        netns_hosts = sc.netns_hosts() if self.inventory is None else []
        if self.inventory is not None:
            self._open_ssh_hosts(self.inventory)
        if netns_hosts:
            self._create_network(netns_hosts)
        if sc.security.tls:
            self._make_credentials()
        for name, spec in sc.hosts.items():
            if name in self.hosts:  # an ssh host, opened above
                continue
            if spec.kind == "netns":
                assert self.network is not None
                self.hosts[name] = self.network.hosts[name]
            else:
                self.hosts[name] = make_host(name, spec.kind)
        table = ProcessTable.for_scenario(sc, self.hosts, self.run_dir / "procs", self.timeline, self.clock)
        self.table.states.update(table.states)

    def _write_run_info(self) -> None:
        """``run.json`` and the ledger entry ``mxchaos cleanup`` reads (rewritten when the run
        gains something to sweep: its network, its toxiproxy API)."""
        RunInfo.parse(self._run_info, self.run_dir).write(RunInfo.in_folder(self.run_dir))
        ledger.write_entry(self.run_id, self._run_info)

    def _create_network(self, hosts: Sequence[str]) -> None:
        """The bridge, one namespace per netns host and their veths (``harness.hosts.netns``);
        recorded in ``run.json`` and the ledger (``mxchaos cleanup`` also finds it by name)."""
        self.timeline.append("invoke", "harness", "network", {"hosts": list(hosts)})
        started = time.monotonic()
        try:
            self.network = netns.Network.create(self.run_id, hosts, owner=(self.who.pid, self.who.start))
        except HarnessError as exc:
            self.timeline.append("fail", "harness", "network", {"error": str(exc)})
            raise
        value = {**self.network.describe(), "seconds": round(time.monotonic() - started, 3)}
        self.timeline.append("ok", "harness", "network", value)
        self._run_info["network"] = self.network.describe()
        self._write_run_info()

    def _open_ssh_hosts(self, inventory: Inventory) -> None:
        """The scenario's hosts on the inventory's machines (``harness.hosts.ssh``): connected, their
        per-run folders made, their clocks probed; recorded in ``run.json``."""
        self.timeline.append("invoke", "harness", "ssh_hosts", {"inventory": str(inventory.path or "")})
        try:
            opened = ssh.open_hosts(list(self.scenario.hosts), inventory, self.run_id, self.run_dir, scenario=self.scenario.name)
        except HarnessError as exc:
            self.timeline.append("fail", "harness", "ssh_hosts", {"error": str(exc)})
            raise
        self.hosts.update(opened)
        for host in opened.values():
            host.on_lost = self._host_lost
        described = {name: host.describe() for name, host in opened.items()}
        self.timeline.append("ok", "harness", "ssh_hosts", {"hosts": described})
        self._run_info["hosts"] = described
        self._write_run_info()

    def _host_lost(self, reason: str) -> None:
        """An ssh host stopped answering (or srun failed on it): recorded, and the run ends (its waits wake at
        once) as an error, the environment's, not a failure of the subject's."""
        self._lost = self._lost or reason
        self.timeline.append("fail", "harness", "host_lost", {"reason": reason})
        self.clock.abort(reason)

    def _make_credentials(self) -> None:
        """The run's CA, server certificate (SAN: loopback, every netns host, the bridge) and
        token, under ``<run_dir>/pki`` (``mxref.pki``)."""
        sc = self.scenario
        addresses: list[str] = []
        if self.inventory is not None:
            addresses = sorted({host.address for host in self.hosts.values()})
        if self.network is not None:
            addresses = [host.address for host in self.network.hosts.values()]
            if self.network.bridge_address:
                addresses.append(self.network.bridge_address)
        self._credentials = pki.generate(self.run_dir, tls=sc.security.tls, token=sc.security.token, addresses=addresses)
        value = {"dir": str(self._credentials.directory), "tls": sc.security.tls, "token": sc.security.token,
                 "addresses": addresses}
        self.timeline.append("ok", "harness", "credentials", value)

    def _close_network(self) -> None:
        """After every process stopped and the leak scan: delete it all; what is left
        (nothing, normally) is recorded for ``nothing_leaked``."""
        if self.network is None or self.network.closed:
            return
        started = time.monotonic()
        value = self.network.close()
        value["seconds"] = round(time.monotonic() - started, 3)
        self.timeline.append("ok" if not value["leftovers"] else "fail", "harness", "network_down", value)

    def _prepare_host(self) -> Host:
        need = checkpoint.needed(self.scenario)
        host = self.hosts[self.scenario.host_of(need.reader)] if need.reader else None
        # prepared here when the reader's host writes elsewhere (ssh): the host gets a copy at start
        return host if host is not None and host.local_files else make_host("harness", "local")

    def _start_proxies(self) -> None:
        if not self.scenario.proxies:
            return
        env = launch.base_env(os.environ, self.who, "toxiproxy")
        self._run_info["toxiproxy"] = self.proxies.start(env, self.clock.step_deadline(), self.scenario.budgets.stop_grace)
        self._write_run_info()  # so `mxchaos cleanup` can find its proxies

    def _teardown(self) -> None:
        self._tearing_down = True
        self.timeline.append("info", "harness", "teardown", {"load": load_sample()})  # from here on, nothing is the scenario's
        self.clock.abort()
        self.nemesis.heal_all()
        if self.watchers.started:  # final scrape while everything is still up
            self.scraper.closing = True
            with contextlib.suppress(Exception):
                self.scraper.scrape_all(wait=True)
        for st in reversed(self.table.live()):
            with contextlib.suppress(Exception):
                self.table.stop(st.name, self._stop_grace(), reason="teardown")
        with contextlib.suppress(Exception):
            self.proxies.stop(self._stop_grace())  # after its clients: their last STALE still reaches the server
        self.watchers.stop()
        stop_observer(self._observer)
        self.watchers.poll()
        self.table.leak_scan(self.run_id, self.hosts.values(), self.proxies.leak_probes())
        for host in self.hosts.values():
            with contextlib.suppress(Exception):
                host.close()
        if self.inventory is not None and self.hosts:  # with the clock probed at the end too
            self._run_info["hosts"] = {n: h.describe() for n, h in self.hosts.items() if isinstance(h, ssh.SshHost)}
            self.timeline.append("info", "harness", "ssh_clocks", {"hosts": self._run_info["hosts"]})
            with contextlib.suppress(OSError):
                self._write_run_info()
        try:
            self._close_network()
        except Exception as exc:  # noqa: BLE001 - recorded; cleanup sweeps it by run id
            self.timeline.append("fail", "harness", "network_down", {"error": f"{type(exc).__name__}: {exc}"})
        status = "hang" if self._hang else "done"
        self.timeline.append("ok" if not self._hang else "info", "harness", "run", {"status": status})
        ledger.remove_entry(self.run_id)

    def _declare_hang(self, reason: str) -> None:
        if not self.clock.abort(reason):
            return
        self._hang = True
        stacks = self.stacks.dump("hang")
        self.timeline.append("info", "harness", "hang", {"reason": reason, "stacks": stacks})

    @contextlib.contextmanager
    def _signals_deferred(self) -> Iterator[None]:
        """A section of the main thread that SIGINT/SIGTERM do not cut in two: the signal aborts
        the run's waits at once (so the section ends soon) and is raised when the section ends.
        Other threads are never interrupted by a signal, so for them this is a no-op."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        self._defer_depth += 1
        try:
            yield
        finally:
            self._defer_depth -= 1
            if not self._defer_depth and self.clock.signalled is not None:
                raise RunInterrupted(self.clock.signalled)

    def _stop_grace(self) -> float:
        """A stop's grace in the teardown: none once a second Ctrl-C forced it."""
        return 0.0 if self._forced else self.scenario.budgets.stop_grace

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        """SIGINT/SIGTERM of the harness while the run lasts. The handler takes no lock (it may
        have interrupted the holder of any lock, ``mxref.signals``): it records the signal, reads
        what there is to heal and stop, and cuts the main thread short; a ``Relay`` thread wakes
        the waits, says it at once, and, for a second Ctrl-C in the teardown, kills."""
        if not self.install_signal_handlers or threading.current_thread() is not threading.main_thread():
            yield
            return
        relay = Relay("mxchaos-signals").start()

        def handler(signum: int, frame: FrameType | None) -> None:
            if self._tearing_down:
                force = signum == signal.SIGINT and not self._forced  # a second Ctrl-C: no more grace
                if force:
                    self._forced = True
                relay.put(lambda: self._signal_in_teardown(signum, force))
                return
            self.clock.note_signal(signum)  # first: the run ends as interrupted, whatever swallows the raise
            procs = [st.name for st in list(self.table.states.values()) if st.alive]
            line = interrupt_line(signum, self.nemesis.active_unlocked(), procs)  # as it stands now
            relay.put(lambda: self._wake_and_tell(signum, line))
            if self._defer_depth:
                return
            raise RunInterrupted(signum)

        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)
            relay.close()

    def _wake_and_tell(self, signum: int, line: str) -> None:
        """The relay's half of an interrupt: every wait wakes (also in a deferred section), and
        the person at the terminal hears what will be healed and stopped."""
        self.clock.interrupt(signum)
        tell(line)

    def _signal_in_teardown(self, signum: int, force: bool) -> None:
        """A signal in the teardown is recorded, not raised; a second Ctrl-C (``force``) kills the
        processes still running now, without their grace (every fault is still healed)."""
        self.timeline.append("info", "harness", "signal_ignored", {"signum": signum, "during": "teardown"})
        if not force:
            return
        tell("forcing: the processes still running are killed now, without their grace; "
             "every fault is still healed (one more Ctrl-C changes nothing)")
        for st in list(self.table.states.values()):
            if st.alive and st.proc is not None:
                with contextlib.suppress(Exception):
                    st.proc.signal(signal.SIGKILL)

    # ------------------------------------------------------------------ processes

    def _fault_context(self) -> RunFaultContext:
        return RunFaultContext(
            run_id=self.run_id, run_dir=self.run_dir, table=self.table, hosts=self.hosts, clock=self.clock,
            proxies=self.proxies, start=lambda name, offsets: self.start_process(name, self.clock.step_deadline(), offsets),
            ensure_proxy=lambda name: self._proxy(name, self.clock.step_deadline()),
            proxy_names=frozenset(self.scenario.proxies), credentials=lambda: self._credentials,
        )

    def start_process(self, name: str, deadline: float, offsets: clocks.ClockOffsets = clocks.HOST_CLOCKS) -> dict[str, Any]:
        """Start the next incarnation of ``name`` (a source/reader first waits for its server's address,
        bounded; ``offsets``: a clock fault's); then create or re-point the proxies in front of it."""
        sc = self.scenario
        st = self.table.state(name)
        if st.alive:
            raise StepFailed("-", f"{name} is already running (pid {st.pid})")
        where = launch.Placement(
            run_dir=self.run_dir,
            events_path=st.events_path,
            log_path=st.log_path,
            host_address=st.host.address,
            in_netns=st.host.own_address,
            incarnation=st.incarnation + 1,
            server_address=self._server_address(name, deadline),
            checkpoint=content.reader_checkpoint(sc, name, self._checkpoint, self.run_dir, self.timeline),
            last_grpc_port=st.last_grpc_port,
            credentials=self._credentials,
            store_address=self._store_address(name, deadline),
            last_port=st.last_ports.get("redis"),
            transport=st.host.transport,  # an ssh host's hardware profile (inventory)
            accelerator=st.host.accelerator,
        )
        argv = launch.process_argv(sc, name, where)
        env = launch.process_env(sc, name, launch.base_env(os.environ, self.who, name), where)
        value = self.table.spawn(name, argv, env, self.run_dir, offsets)
        for proxy, spec in sc.proxies.items():
            if spec.upstream == name:  # its upstream is known once it listens: create (or re-point) it now
                self._proxy(proxy, deadline)
        return value

    def _server_address(self, name: str, deadline: float) -> str | None:
        """Where a source or reader reaches its server: the server itself, or its proxy."""
        spec = self.scenario.processes[name]
        server = self.scenario.server_of(name)
        if not isinstance(spec, SourceProcess | ReaderProcess) or server is None:
            return None
        if isinstance(spec, SourceProcess | ReaderProcess) and spec.server_via is not None:
            return self._proxy(spec.server_via, deadline).listen
        return self.table.address(server, "grpc", deadline)

    def _store_address(self, name: str, deadline: float) -> str | None:
        """Where a server reaches its redis process (``store``): started first when no step has
        started it yet; when it has ended (killed), its last address (the server then runs on
        an unreachable store, as a real one would)."""
        spec = self.scenario.processes[name]
        if not isinstance(spec, ServerProcess) or spec.store is None:
            return None
        store = self.table.refresh(spec.store)
        if not store.alive and store.incarnation == 0:
            self.start_process(spec.store, deadline)
        if spec.store_via is not None:  # once created, the proxy keeps its address while its redis is down
            view = self.proxies.view(spec.store_via)
            return view.listen if view is not None else self._proxy(spec.store_via, deadline).listen
        if store.alive:
            return self.table.address(spec.store, "redis", deadline)
        port = store.last_ports.get("redis")
        if port is None:
            raise StepFailed("-", f"{name}: its store {spec.store} is not running and never reported its port")
        return f"{store.host.address}:{port}"

    def _proxy(self, name: str, deadline: float) -> ProxyView:
        """The scenario proxy ``name``, once its upstream (a server's gRPC port, a redis process's
        port) has been reported."""
        upstream_name = self.scenario.proxies[name].upstream
        what = "redis" if self.scenario.processes[upstream_name].role == "redis" else "grpc"
        upstream = self.table.address(upstream_name, what, deadline)
        # netns clients reach the proxy at the bridge's address, not at loopback
        listen = self.network.bridge_address if self.network is not None else None
        return self.proxies.ensure(name, upstream, listen)


def _heal_outcome(status: str, reason: str, failures: Sequence[str]) -> tuple[str, str]:
    """A fault that could not be healed leaves the system in an unknown state: the run is an
    error (a hang or an interrupt keeps its status; the failed heals join its reason)."""
    what = f"heal failed: {'; '.join(failures)}"
    if status in ("hang", "interrupted"):
        return status, f"{reason}; {what}" if reason else what
    return "error", f"{what}; {reason}" if reason else what
