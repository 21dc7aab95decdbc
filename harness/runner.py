"""The runner: the only place with side effects and threads.

``Runner(scenario).run()`` goes through, in order:

1. make the run folder, write ``run.json`` and a ledger entry (for ``mxchaos cleanup``);
2. prepare the disk checkpoint when a reader exists (``mxref prepare``);
3. start the monitor (tails every events file, records process exits), the scraper
   (periodic real HTTP scrapes) and the watchdog (HANG on no progress or on the run
   budget; dumps stacks);
4. run the steps (sequence, ``parallel`` branches in threads); every wait has a deadline
   and wakes on abort;
5. ``finally`` (also on SIGINT/SIGTERM, which raise ``RunInterrupted`` in the main
   thread): heal every active fault (each heal bounded by ``budgets.heal``; one that fails
   or overruns is recorded and the next is healed), scrape once more, stop every process
   (TERM, grace, KILL), scan for leaks, sweep whatever of the run is still alive;
6. record the outcome, freeze the timeline, run the checks, merge the verdict; the
   caller writes the report.

Before any of it, the capabilities the scenario's faults require are probed
(``harness.capabilities``): when one is missing nothing starts and the verdict is ``skip``.

Every child gets ``MXCHAOS_RUN_ID`` (and the harness pid/start time) in its environment
and its own session, its own log, events file and ephemeral ports (it reports them).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime as dt
import json
import os
import secrets
import shutil
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from pydantic import BaseModel

from harness import capabilities
from harness import checks as check_registry
from harness import faults as fault_registry
from harness import netns, procscan
from harness import toxiproxy as toxi
from harness.errors import FaultError, HarnessError, RunInterrupted, StepFailed
from harness.host import Host, Proc, make_host
from harness.ports import PortLease, lease_port
from harness.scenario import (
    PLACEHOLDERS,
    AwaitEvent,
    AwaitExit,
    AwaitMetric,
    AwaitStep,
    CommandProcess,
    FaultStep,
    HealStep,
    MarkStep,
    MxrefProcess,
    ParallelStep,
    ReaderProcess,
    RestartStep,
    Scenario,
    ServerProcess,
    SleepStep,
    SourceProcess,
    StartStep,
    StopStep,
    _PLACEHOLDER_RE,
    describe_step,
)
from harness.scrape import compare, sample_value, scrape
from harness.spec import Scalar, SourceOf
from harness.timeline import Entry, History, Timeline, matches

__all__ = ["OK_VERDICTS", "RunResult", "Runner", "VERDICTS", "judge", "ledger_dir", "new_run_id", "verdict_of"]

# pass | fail | unknown | hang | error, and: xfail / xpass (a known_defect scenario failed /
# passed), skip (a capability its faults require is missing; nothing ran)
VERDICTS = ("pass", "fail", "unknown", "hang", "error", "xfail", "xpass", "skip")
OK_VERDICTS = ("pass", "xfail", "xpass", "skip")  # what does not fail `mxchaos run`
MONITOR_PERIOD = 0.05


def ledger_dir() -> Path:
    """Where live runs are registered (one JSON file each, removed when a run ends)."""
    base = os.environ.get("MXCHAOS_STATE_DIR") or os.path.join(
        os.environ.get("XDG_RUNTIME_DIR") or "/tmp", f"mxchaos-{os.getuid()}"
    )
    return Path(base) / "runs"


def new_run_id(scenario: str) -> str:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
    return f"{scenario}-{stamp}-{secrets.token_hex(3)}"


@dataclass
class RunResult:
    scenario: Scenario
    run_id: str
    run_dir: Path
    status: str  # completed | step_failed | hang | interrupted | error | skipped
    reason: str
    verdict: str  # one of VERDICTS
    history: History
    checks: list[check_registry.NamedResult]
    started_at: str
    seconds: float
    seed: int
    failed_step: str | None = None
    stacks: dict[str, str] = field(default_factory=dict)
    interrupted_by: int | None = None
    missing_capabilities: list[str] = field(default_factory=list)  # verdict skip: what is missing

    @property
    def ok(self) -> bool:
        """Whether this run lets ``mxchaos run`` exit 0 (pass, xfail, xpass, skip)."""
        return self.verdict in OK_VERDICTS

    @property
    def known_defect(self) -> str | None:
        return self.scenario.known_defect

    def failing_checks(self) -> list[check_registry.NamedResult]:
        return [c for c in self.checks if c.valid is not True]


@dataclass
class _ProcState:
    name: str
    spec: Any
    host: Host
    events_path: Path | None
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
    pids: dict[int, int] = field(default_factory=dict)  # pid -> incarnation

    @property
    def role(self) -> str:
        return str(self.spec.role)

    @property
    def alive(self) -> bool:
        return self.proc is not None and not self.exit_recorded


@dataclass(frozen=True)
class _ProxyView:
    """A created proxy (``harness.faults.ProxyView``)."""

    name: str
    proxy: str
    api: str
    listen: str
    upstream: str


@dataclass
class _Toxiproxy:
    """The run's toxiproxy server (when the scenario has ``proxies``) and the proxies made on it."""

    host: Host
    proc: Proc
    lease: PortLease  # held while the server runs: no other harness is handed its API port
    api: toxi.ToxiproxyAPI
    proxies: dict[str, _ProxyView] = field(default_factory=dict)  # scenario proxy name -> created
    exit_recorded: bool = False
    stopping: bool = False


class _Abort(Exception):
    """Internal: a wait woke because the run is being aborted."""


class _HealOverrun(Exception):
    """Internal: a heal did not return within ``budgets.heal``."""


class Runner:
    def __init__(
        self,
        scenario: Scenario,
        *,
        out_dir: str | Path = "runs",
        run_id: str | None = None,
        observers: Sequence[Callable[[Entry], None]] = (),
        install_signal_handlers: bool = True,
    ) -> None:
        self.scenario = scenario
        self.run_id = run_id or new_run_id(scenario.name)
        self.out_dir = Path(out_dir)
        self.observers = list(observers)
        self.install_signal_handlers = install_signal_handlers
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        self.run_dir = (self.out_dir / scenario.name / f"{stamp}-{self.run_id[-6:]}").resolve()
        self.timeline = Timeline()
        self.hosts: dict[str, Host] = {}
        self.procs: dict[str, _ProcState] = {}
        self._lock = threading.RLock()
        self._abort = threading.Event()
        self._stop_threads = threading.Event()
        self._abort_reason: str | None = None
        self._hang = False
        self._stacks: dict[str, str] = {}
        self._active: dict[str, fault_registry.Fault] = {}
        self._timers: list[threading.Timer] = []
        self._fault_counter = 0
        self._quiet_until = 0.0
        self._interrupted: int | None = None
        self._signalled: int | None = None  # set by the signal handler, before it raises RunInterrupted
        self._tearing_down = False
        self._checkpoint: Path | None = None
        self._threads: list[threading.Thread] = []
        self._deadline = 0.0
        self._start_counter = 0
        self._scraping: set[str] = set()
        self._scrape_pool = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="mxchaos-scrape")
        self._heal_failures: list[str] = []  # "name (kind): why", in the order they happened
        self._run_info: dict[str, Any] = {}
        self._toxiproxy: _Toxiproxy | None = None
        self._proxy_lock = threading.Lock()  # one creation per proxy, even from parallel branches
        self._harness_ports: set[int] = set()  # ports of what the harness itself started (leak scan)
        self.network: netns.Network | None = None  # the namespaces of the netns hosts

    # ------------------------------------------------------------------ public

    def run(self) -> RunResult:
        started_wall = dt.datetime.now(dt.UTC).isoformat()
        sc = self.scenario
        lacking, why = capabilities.describe_missing(capabilities.scenario_requirements(sc))
        if lacking:
            return self._skipped(started_wall, lacking, why)
        status, reason, failed_step = "completed", "", None
        for observer in self.observers:
            self.timeline.add_listener(observer)
        self._deadline = self.timeline.t0 + sc.budgets.run
        with self._signals():
            try:
                try:
                    self._setup()
                    self.timeline.append("invoke", "harness", "run", {"run_id": self.run_id, "seed": sc.seed})
                    self._prepare()
                    self._start_toxiproxy()
                    self._start_threads()
                    self._run_steps(sc.steps, "")
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
                pass  # the signal landed in one of the handlers above: it is decided below
            finally:
                self._tearing_down = True  # first, before any call: from here a signal is only recorded
                self._teardown()
        if self._signalled is not None and status != "interrupted":
            # the handler's RunInterrupted was swallowed where it landed (e.g. a timeline listener's
            # ``except Exception``) or landed after the handlers above: the signal decides the outcome
            status, reason, failed_step = "interrupted", f"harness got {signal.Signals(self._signalled).name}", None
            self._interrupted = self._signalled
        if self._hang:
            status, reason = "hang", self._abort_reason or "no progress"
        if self._heal_failures:
            status, reason = self._heal_outcome(status, reason)
        self.timeline.append(
            "info", "harness", "outcome", {"status": status, "reason": reason, "failed_step": failed_step}
        )
        history = self.timeline.snapshot()
        results = self._check(history)
        verdict = self._verdict(status, results, sc.known_defect)
        return RunResult(
            scenario=sc,
            run_id=self.run_id,
            run_dir=self.run_dir,
            status=status,
            reason=reason,
            verdict=verdict,
            history=history,
            checks=results,
            started_at=started_wall,
            seconds=self.timeline.now(),
            seed=sc.seed,
            failed_step=failed_step,
            stacks=dict(self._stacks),
            interrupted_by=self._interrupted,
        )

    def _skipped(self, started_wall: str, lacking: list[str], why: str) -> RunResult:
        """Nothing starts: a fault of the scenario needs what this machine lacks."""
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

    def _heal_outcome(self, status: str, reason: str) -> tuple[str, str]:
        """A fault that could not be healed leaves the system in an unknown state: the run is an
        error (a hang or an interrupt keeps its status; the failed heals join its reason)."""
        failed = "; ".join(self._heal_failures)
        what = f"heal failed: {failed}"
        if status in ("hang", "interrupted"):
            return status, f"{reason}; {what}" if reason else what
        return "error", f"{what}; {reason}" if reason else what

    # ------------------------------------------------------------------ setup

    def _setup(self) -> None:
        sc = self.scenario
        (self.run_dir / "procs").mkdir(parents=True, exist_ok=True)
        info = {
            "run_id": self.run_id,
            "scenario": sc.name,
            "scenario_path": str(sc.path) if sc.path else None,
            "run_dir": str(self.run_dir),
            "harness_pid": os.getpid(),
            "harness_start": procscan.proc_start_time(os.getpid()),
            "started": dt.datetime.now(dt.UTC).isoformat(),
            "t0_monotonic": self.timeline.t0,
        }
        self._run_info = info
        self._write_run_info()  # before the network: a crash while building it is swept by run id
        netns_hosts = sc.netns_hosts()
        if netns_hosts:
            self._create_network(netns_hosts)
        for name, spec in sc.hosts.items():
            if spec.kind == "netns":
                assert self.network is not None
                self.hosts[name] = self.network.hosts[name]
            else:
                self.hosts[name] = make_host(name, spec.kind)
        for name, spec in sc.processes.items():
            has_events = not isinstance(spec, CommandProcess)
            self.procs[name] = _ProcState(
                name=name,
                spec=spec,
                host=self.hosts[sc.host_of(name)],
                events_path=(self.run_dir / "procs" / f"{name}.events.jsonl") if has_events else None,
                log_path=self.run_dir / "procs" / f"{name}.log",
            )

    def _create_network(self, hosts: Sequence[str]) -> None:
        """The bridge, one namespace per netns host and their veths (``harness/netns.py``);
        recorded in ``run.json`` and the ledger (``mxchaos cleanup`` also finds it by name)."""
        self.timeline.append("invoke", "harness", "network", {"hosts": list(hosts)})
        started = time.monotonic()
        try:
            owner = (os.getpid(), procscan.proc_start_time(os.getpid()))
            self.network = netns.Network.create(self.run_id, hosts, owner=owner)
        except HarnessError as exc:
            self.timeline.append("fail", "harness", "network", {"error": str(exc)})
            raise
        value = {**self.network.describe(), "seconds": round(time.monotonic() - started, 3)}
        self.timeline.append("ok", "harness", "network", value)
        self._run_info["network"] = self.network.describe()
        self._write_run_info()

    def _close_network(self) -> None:
        """Teardown, after every process stopped and the leak scan: delete it all; what is
        left (nothing, normally) is recorded for ``nothing_leaked``."""
        if self.network is None or self.network.closed:
            return
        started = time.monotonic()
        value = self.network.close()
        value["seconds"] = round(time.monotonic() - started, 3)
        self.timeline.append("ok" if not value["leftovers"] else "fail", "harness", "network_down", value)

    def _write_run_info(self) -> None:
        """``run.json`` and the ledger entry ``mxchaos cleanup`` reads (rewritten when the run
        gains something to sweep, e.g. its toxiproxy API)."""
        info = self._run_info
        (self.run_dir / "run.json").write_text(json.dumps(info, indent=2))
        with contextlib.suppress(OSError):
            ledger = ledger_dir()
            ledger.mkdir(parents=True, exist_ok=True)
            (ledger / f"{self.run_id}.json").write_text(json.dumps(info))

    def _base_env(self, name: str) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("MXCHAOS_RUN_ID", None)
        env.update(
            {
                "PYTHONUNBUFFERED": "1",
                "PYTHONFAULTHANDLER": "1",
                procscan.ENV_RUN_ID: self.run_id,
                procscan.ENV_PROC: name,
                procscan.ENV_HARNESS_PID: str(os.getpid()),
                procscan.ENV_HARNESS_START: str(procscan.proc_start_time(os.getpid()) or ""),
            }
        )
        return env

    def _fill(self, text: str, proc_dir: Path) -> str:
        values = {
            "python": sys.executable,
            "run_dir": str(self.run_dir),
            "proc_dir": str(proc_dir),
            "scenario_dir": str(self.scenario.directory),
            "seed": str(self.scenario.seed),
        }
        assert set(values) == set(PLACEHOLDERS)
        return _PLACEHOLDER_RE.sub(lambda m: values.get(m.group(1), m.group(0)), text)

    def _launcher(self, spec: MxrefProcess) -> list[str]:
        return [self._fill(part, self.run_dir / "procs") for part in (spec.launcher or self.scenario.launcher)]

    def _prepare(self) -> None:
        sc = self.scenario
        readers = [n for n, p in sc.processes.items() if isinstance(p, ReaderProcess)]
        if not readers:
            return
        if sc.model.file:
            self._checkpoint = (sc.directory / sc.model.file).resolve()
            return
        if all(sc.processes[r].options.checkpoint for r in readers):  # type: ignore[union-attr]
            return
        path = self.run_dir / "checkpoint.safetensors"
        spec = sc.processes[readers[0]]
        assert isinstance(spec, ReaderProcess)
        argv = [
            *self._launcher(spec),
            "prepare",
            "--checkpoint",
            str(path),
            *sc.model.flags(sc.seed, sc.directory),
        ]
        host = self.hosts[sc.host_of(readers[0])]
        self.timeline.append("invoke", "harness", "prepare", {"argv": argv})
        result = host.exec(argv, env=self._base_env("prepare"), cwd=self.run_dir, timeout=sc.budgets.prepare)
        (self.run_dir / "procs" / "prepare.log").write_text(result.stdout + result.stderr)
        value = {"rc": result.rc, "seconds": round(result.seconds, 3), "checkpoint": str(path)}
        if result.rc != 0:
            self.timeline.append("fail", "harness", "prepare", value)
            why = "timed out" if result.timed_out else f"exited {result.rc}"
            raise HarnessError(f"preparing the checkpoint {why}; see procs/prepare.log")
        self.timeline.append("ok", "harness", "prepare", value)
        self._checkpoint = path

    # ------------------------------------------------------------------ toxiproxy

    def _start_toxiproxy(self) -> None:
        """One toxiproxy server for the scenario's ``proxies`` (nothing without them), on
        loopback: API port leased (``harness.ports``), own session and ``MXCHAOS_RUN_ID`` like
        every child, log in ``procs/toxiproxy.log``; waits until its API answers (bounded by
        ``budgets.step``). A server that exits at once (its port taken after all) is retried
        on a new port."""
        sc = self.scenario
        if not sc.proxies:
            return
        binary = capabilities.toxiproxy_server()
        if binary is None:
            raise HarnessError("the scenario has proxies, and no toxiproxy-server is installed (.venv/bin or PATH)")
        host = make_host("harness", "local")
        log_path = self.run_dir / "procs" / "toxiproxy.log"
        env = self._base_env("toxiproxy")
        env.setdefault("LOG_LEVEL", "info")
        deadline = self._step_deadline(None)
        for attempt in range(1, 4):
            lease = lease_port(host.address)
            argv = [binary, "-host", host.address, "-port", str(lease.port)]
            self.timeline.append("invoke", "harness", "toxiproxy", {"argv": argv, "attempt": attempt})
            started = time.monotonic()
            try:
                proc = host.spawn(argv, env=env, cwd=self.run_dir, log_path=log_path)
            except HarnessError as exc:
                lease.release()
                self.timeline.append("fail", "harness", "toxiproxy", {"error": str(exc)})
                raise
            tp = _Toxiproxy(host, proc, lease, toxi.ToxiproxyAPI(f"http://{host.address}:{lease.port}"))
            self._toxiproxy = tp
            version, error = self._await_toxiproxy_api(tp, deadline)
            if version is not None:
                self._harness_ports.add(lease.port)
                value = {"pid": proc.pid, "api": tp.api.url, "version": version,
                         "seconds": round(time.monotonic() - started, 3), "log": "procs/toxiproxy.log"}
                self.timeline.append("ok", "harness", "toxiproxy", value)
                self._run_info["toxiproxy"] = {"api": tp.api.url, "pid": proc.pid}
                self._write_run_info()  # so `mxchaos cleanup` can find its proxies
                return
            tp.stopping = True
            stopped = proc.stop(self.scenario.budgets.stop_grace)
            lease.release()
            self._toxiproxy = None
            self.timeline.append("fail", "harness", "toxiproxy", {"pid": proc.pid, "rc": stopped.rc, "error": error})
            if not stopped.already_exited or time.monotonic() > deadline:
                raise HarnessError(f"toxiproxy-server: {error}; see procs/toxiproxy.log")
        raise HarnessError("toxiproxy-server exited at start 3 times; see procs/toxiproxy.log")

    def _await_toxiproxy_api(self, tp: _Toxiproxy, deadline: float) -> tuple[str | None, str]:
        """(its version, "") once the API answers; (None, why) when it exits or the deadline passes."""
        while True:
            try:
                return tp.api.version(), ""
            except toxi.ToxiproxyError as exc:
                error = str(exc)
            rc = tp.proc.poll()
            if rc is not None:
                return None, f"exited (rc {rc}) before its API answered ({error})"
            if time.monotonic() > deadline:
                return None, f"its API did not answer in time (budgets.step): {error}"
            time.sleep(0.05)

    def _ensure_proxy(self, name: str, deadline: float) -> _ProxyView:
        """The scenario proxy ``name``, created (listen ``127.0.0.1:0``, the chosen port read
        back) once its upstream server has reported its gRPC port; waits for that, bounded. A
        server restarted on another port gets its proxy pointed there."""
        spec = self.scenario.proxies[name]
        port = self._endpoint(spec.upstream, "grpc", deadline)
        upstream = f"{self._state(spec.upstream).host.address}:{port}"
        with self._proxy_lock:
            tp = self._toxiproxy
            if tp is None:
                raise HarnessError(f"proxy {name}: the run's toxiproxy server is not running")
            have = tp.proxies.get(name)
            if have is not None and have.upstream == upstream:
                return have
            proxy = toxi.proxy_name(self.run_id, name)
            base = {"proxy": name, "name": proxy, "upstream": upstream}
            self.timeline.append("invoke", "harness", "proxy", base)
            try:
                if have is None:
                    # netns clients reach the proxy at the bridge's address, not at loopback
                    listen_host = self.network.bridge_address if self.network is not None else tp.host.address
                    info = tp.api.create_proxy(proxy, upstream, listen=f"{listen_host}:0")
                else:
                    info = tp.api.update_proxy(proxy, upstream=upstream)
            except toxi.ToxiproxyError as exc:
                self.timeline.append("fail", "harness", "proxy", {**base, "error": str(exc)})
                raise HarnessError(f"proxy {name}: {exc}") from None
            listen = str(info.get("listen", ""))
            view = _ProxyView(name, proxy, tp.api.url, listen, upstream)
            tp.proxies[name] = view
            with contextlib.suppress(ValueError):
                self._harness_ports.add(int(listen.rpartition(":")[2]))
            self.timeline.append("ok", "harness", "proxy", {**base, "listen": listen, "updated": have is not None})
            return view

    def _stop_toxiproxy(self) -> None:
        """Teardown (after the processes stopped): reset, delete the run's proxies, stop the
        server (TERM, grace, KILL), release its port. Every API call is bounded."""
        tp = self._toxiproxy
        if tp is None:
            return
        value: dict[str, Any] = {"pid": tp.proc.pid, "removed": []}
        if tp.proc.poll() is None:
            api = toxi.ToxiproxyAPI(tp.api.url, timeout=2.0)
            try:
                api.reset()
                for view in tp.proxies.values():
                    if api.delete_proxy(view.proxy):
                        value["removed"].append(view.proxy)
            except toxi.ToxiproxyError as exc:
                value["error"] = str(exc)
        tp.stopping = True
        result = tp.proc.stop(self.scenario.budgets.stop_grace)
        tp.lease.release()
        value.update(rc=result.rc, escalated=result.escalated, already_exited=result.already_exited)
        self.timeline.append("ok", "harness", "toxiproxy_stop", value)

    def _check_toxiproxy(self) -> None:
        """Record the toxiproxy server's death if it dies before teardown (its proxies go with it)."""
        tp = self._toxiproxy
        if tp is None or tp.exit_recorded or tp.stopping:
            return
        rc = tp.proc.poll()
        if rc is not None:
            tp.exit_recorded = True
            self.timeline.append("info", "harness", "toxiproxy_exit", {"pid": tp.proc.pid, "rc": rc})

    # ------------------------------------------------------------------ threads

    def _start_threads(self) -> None:
        for target, name in ((self._monitor, "monitor"), (self._scraper, "scraper"), (self._watchdog, "watchdog")):
            thread = threading.Thread(target=target, name=f"mxchaos-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _monitor(self) -> None:
        while not self._stop_threads.is_set():
            self._poll_processes()
            self._stop_threads.wait(MONITOR_PERIOD)
        self._poll_processes()

    def _poll_processes(self) -> None:
        with self._lock:
            states = list(self.procs.values())
        for st in states:
            try:
                self._drain_events(st)
                self._check_exit(st)
            except Exception:  # noqa: BLE001 - never let the monitor die
                self.timeline.append("info", "harness", "monitor_error", {"process": st.name, "traceback": traceback.format_exc()})
        with contextlib.suppress(Exception):
            self._check_toxiproxy()

    def _drain_events(self, st: _ProcState) -> None:
        if st.events_path is None:
            return
        with self._lock:
            data = st.host.read(st.events_path, st.offset)
            if not data:
                return
            st.offset += len(data)
            buffer = st.partial + data
            lines = buffer.split(b"\n")
            st.partial = lines.pop()
            for line in lines:
                if line.strip():
                    self._ingest(st, line)

    def _ingest(self, st: _ProcState, line: bytes) -> None:
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
        self.timeline.append("info", st.name, event, value, t=self.timeline.t_of_mono(mono))
        if event == "listening" and isinstance(record.get("port"), int):
            what = str(record.get("what", ""))
            if not isinstance(pid, int) or pid == st.pid:
                st.ports[what] = int(record["port"])
                if what == "grpc":
                    st.last_grpc_port = int(record["port"])
            st.all_ports.add(int(record["port"]))

    def _check_exit(self, st: _ProcState) -> None:
        with self._lock:
            if st.proc is None or st.exit_recorded:
                return
            rc = st.proc.poll()
            if rc is None:
                return
            self._record_exit(st, rc)

    def _record_exit(self, st: _ProcState, rc: int | None) -> None:
        with self._lock:
            if st.exit_recorded:
                return
            self._drain_events(st)
            value: dict[str, Any] = {
                "pid": st.pid,
                "incarnation": st.incarnation,
                "rc": rc,
                "stopped_by_harness": st.stopping,
            }
            if rc is not None and rc < 0:
                with contextlib.suppress(ValueError):
                    value["signal"] = signal.Signals(-rc).name
            st.exit_recorded = True
            st.ports = {}
            self.timeline.append("info", st.name, "process_exit", value)

    def _scraper(self) -> None:
        spec = self.scenario.scrape
        if not spec.enabled:
            return
        while not self._stop_threads.wait(spec.interval):
            self._scrape_all(wait=False)

    def _scrape_all(self, *, wait: bool) -> None:
        """Scrape every live process concurrently, so one frozen process (a paused source
        accepts the connection but never answers) does not delay the others."""
        if self._tearing_down and not wait:
            return  # teardown took its final scrape; the processes are going away now
        with self._lock:
            targets = [(st, st.ports.get("metrics")) for st in self.procs.values() if st.alive]
        futures = []
        for st, port in targets:
            if not port or st.name in self._scraping:
                continue
            self._scraping.add(st.name)
            futures.append(self._scrape_pool.submit(self._scrape_tracked, st, port))
        if wait and futures:
            concurrent.futures.wait(futures, timeout=self.scenario.scrape.timeout + 1.0)

    def _scrape_tracked(self, st: _ProcState, port: int) -> None:
        try:
            self._scrape_one(st, port)
        finally:
            self._scraping.discard(st.name)

    def _scrape_one(self, st: _ProcState, port: int) -> Entry:
        url = f"http://{st.host.address}:{port}/metrics"
        started = time.monotonic()
        try:
            samples = scrape(url, self.scenario.scrape.timeout)
            value: dict[str, Any] = {"ok": True, "port": port, "samples": samples}
        except (OSError, ValueError) as exc:
            value = {"ok": False, "port": port, "error": f"{type(exc).__name__}: {exc}"}
        value["seconds"] = round(time.monotonic() - started, 4)
        return self.timeline.append("info", st.name, "scrape", value)

    def _watchdog(self) -> None:
        budgets = self.scenario.budgets
        while not self._stop_threads.wait(0.2):
            now = time.monotonic()
            idle_since = max(self.timeline.last_progress, self._quiet_until)
            if now > self._deadline:
                self._declare_hang(f"the run exceeded its budget (budgets.run {budgets.run:g}s)")
                return
            if now - idle_since > budgets.progress:
                self._declare_hang(f"no progress for {budgets.progress:g}s (budgets.progress)")
                return

    def _declare_hang(self, reason: str) -> None:
        if self._abort.is_set():
            return
        self._hang = True
        self._abort_reason = reason
        stacks = self._dump_stacks("hang")
        self.timeline.append("info", "harness", "hang", {"reason": reason, "stacks": stacks})
        self._abort.set()

    def _dump_stacks(self, tag: str) -> dict[str, str]:
        """py-spy dump of every live process of the run plus the harness's own threads."""
        folder = self.run_dir / "stacks"
        folder.mkdir(exist_ok=True)
        written: dict[str, str] = {}
        harness_file = folder / f"{tag}-harness.txt"
        harness_file.write_text(_thread_stacks())
        written["harness"] = str(harness_file.relative_to(self.run_dir))
        pyspy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        with self._lock:
            live = [(st.name, st.pid, st.host) for st in self.procs.values() if st.alive and st.pid]
        for name, pid, host in live:
            out = folder / f"{tag}-{name}.txt"
            if os.path.exists(pyspy):
                result = host.exec(
                    [pyspy, "dump", "--pid", str(pid), "--nonblocking"],
                    env=dict(os.environ),
                    cwd=self.run_dir,
                    timeout=15,
                )
                text = result.stdout + (f"\n[py-spy rc={result.rc}]\n{result.stderr}" if result.rc else "")
            else:
                text = "py-spy is not installed; no stack for this process\n"
            out.write_text(f"# {name} pid {pid}\n{text}")
            written[name] = str(out.relative_to(self.run_dir))
        self._stacks.update(written)
        return written

    # ------------------------------------------------------------------ signals

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        if not self.install_signal_handlers or threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(signum: int, frame: FrameType | None) -> None:
            if self._tearing_down:
                self.timeline.append("info", "harness", "signal_ignored", {"signum": signum, "during": "teardown"})
                return
            self._signalled = self._signalled or signum
            self._abort.set()
            raise RunInterrupted(signum)

        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)

    # ------------------------------------------------------------------ waits

    def _step_deadline(self, within: float | None) -> float:
        budget = within if within is not None else self.scenario.budgets.step
        return min(time.monotonic() + budget, self._deadline)

    def _aborted(self) -> Exception:
        """What a wait woken by the abort raises: the run's signal when it got one (the
        handler's own raise may have landed in, and been swallowed by, e.g. a timeline
        listener's ``except Exception``), else ``_Abort``."""
        return RunInterrupted(self._signalled) if self._signalled is not None else _Abort()

    def _wait(self, predicate: Callable[[Entry], bool], deadline: float, start: int = 0, count: int = 1) -> Entry | None:
        entry = self.timeline.wait_for(predicate, deadline, start=start, abort=self._abort, count=count)
        if entry is None and self._abort.is_set():
            raise self._aborted()
        return entry

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        self._quiet_until = max(self._quiet_until, end)
        if self._abort.wait(max(0.0, min(end, self._deadline + 1) - time.monotonic())):
            raise self._aborted()

    # ------------------------------------------------------------------ steps

    def _run_steps(self, steps: Sequence[BaseModel], prefix: str) -> None:
        for i, step in enumerate(steps):
            sid = f"{prefix}{i + 1}"
            if self._signalled is not None:
                raise RunInterrupted(self._signalled)
            if self._abort.is_set():
                raise StepFailed(sid, self._abort_reason or "aborted")
            text = describe_step(step)
            self.timeline.append("invoke", "harness", "step", {"step": sid, "text": text})
            try:
                value = self._step(sid, step) or {}
            except _Abort:
                reason = self._abort_reason or "aborted"
                self.timeline.append("info", "harness", "step", {"step": sid, "text": text, "indeterminate": True, "error": reason})
                raise StepFailed(sid, reason) from None
            except RunInterrupted:
                self.timeline.append("info", "harness", "step", {"step": sid, "text": text, "indeterminate": True, "error": "interrupted"})
                raise
            except StepFailed as exc:
                self.timeline.append("fail", "harness", "step", {"step": sid, "text": text, "error": exc.reason})
                if exc.step == "-":
                    raise StepFailed(sid, exc.reason) from None
                raise
            except (FaultError, HarnessError) as exc:
                self.timeline.append("fail", "harness", "step", {"step": sid, "text": text, "error": str(exc)})
                raise StepFailed(sid, str(exc)) from None
            self.timeline.append("ok", "harness", "step", {"step": sid, "text": text, **value})

    def _step(self, sid: str, step: BaseModel) -> dict[str, Any] | None:
        budgets = self.scenario.budgets
        if isinstance(step, StartStep):
            for name in step.start:
                self.start_process(name, self._step_deadline(None))
            return None
        if isinstance(step, StopStep):
            for name in step.stop.process:
                self.stop_process(name, step.stop.grace or budgets.stop_grace)
            return None
        if isinstance(step, RestartStep):
            for name in step.restart.process:
                self.stop_process(name, step.restart.grace or budgets.stop_grace)
                self.start_process(name, self._step_deadline(None))
            return None
        if isinstance(step, SleepStep):
            self._sleep(step.sleep)
            return None
        if isinstance(step, MarkStep):
            self.timeline.append("info", "harness", "mark", {"mark": step.mark, "step": sid})
            return None
        if isinstance(step, FaultStep):
            self._inject(step)
            return None
        if isinstance(step, HealStep):
            names = list(self._active) if "all" in step.heal else list(step.heal)
            for name in names:
                self._heal(name)
            return None
        if isinstance(step, AwaitStep):
            return self._await(sid, step.await_)
        if isinstance(step, ParallelStep):
            self._parallel(sid, step)
            return None
        raise HarnessError(f"step {sid}: {type(step).__name__} is not implemented")

    def _parallel(self, sid: str, step: ParallelStep) -> None:
        errors: list[BaseException] = []

        def branch(steps: Sequence[BaseModel], prefix: str) -> None:
            try:
                self._run_steps(steps, prefix)
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread
                errors.append(exc)
                self._abort_reason = self._abort_reason or f"parallel branch {prefix.rstrip('.')} failed"
                self._abort.set()

        threads = [
            threading.Thread(target=branch, args=(b, f"{sid}.{i + 1}."), name=f"mxchaos-branch-{sid}.{i + 1}", daemon=True)
            for i, b in enumerate(step.parallel)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            # branches end at their own deadlines; the bound guards against a harness bug
            thread.join(timeout=max(1.0, self._deadline - time.monotonic() + 30))
        if any(t.is_alive() for t in threads):
            raise StepFailed(sid, "a parallel branch did not finish by the run's deadline")
        failures = [e for e in errors if isinstance(e, StepFailed)]
        for exc in errors:
            if isinstance(exc, RunInterrupted):
                raise exc
        if failures:  # the first to fail is the cause; the others were woken by the abort
            raise StepFailed(failures[0].step, failures[0].reason)
        if errors:
            raise errors[0]

    # ------------------------------------------------------------------ processes

    def _state(self, name: str) -> _ProcState:
        try:
            return self.procs[name]
        except KeyError:
            raise HarnessError(f"no process named {name!r}") from None

    def _endpoint(self, server: str, what: str, deadline: float) -> int:
        """The port ``server``'s current incarnation reported for ``what`` (waits, bounded)."""
        st = self._state(server)
        with self._lock:
            if what in st.ports:
                return st.ports[what]
            if not st.alive:
                raise StepFailed("-", f"{server} is not running, so it has no {what} port")
            start, pid = st.start_index, st.pid

        def seen(e: Entry) -> bool:
            if e.actor != server:
                return False
            if e.f == "process_exit":
                return True
            return e.f == "listening" and e.get("what") == what and e.get("pid") == pid

        entry = self._wait(seen, deadline, start=start)
        if entry is None:
            raise StepFailed("-", f"{server} reported no {what} port in time")
        if entry.f == "process_exit":
            raise StepFailed("-", f"{server} exited (rc {entry.get('rc')}) before reporting its {what} port")
        return int(entry.get("port"))

    def _argv(self, st: _ProcState, deadline: float) -> list[str]:
        sc = self.scenario
        spec = st.spec
        if isinstance(spec, CommandProcess):
            return [self._fill(part, st.log_path.parent) for part in spec.argv]
        assert isinstance(spec, MxrefProcess) and st.events_path is not None
        argv = [
            *self._launcher(spec),
            spec.role,
            "--name",
            st.name,
            "--events",
            str(st.events_path),
            "--metrics-port",
            "0",
        ]
        in_netns = isinstance(st.host, netns.NetnsHost)
        if isinstance(spec, ServerProcess):
            options = spec.options
            if options.port == 0 and st.last_grpc_port:
                options = options.model_copy(update={"port": st.last_grpc_port})  # a restart keeps its address
            if in_netns and options.host is None:  # bind (and serve /metrics on) the namespace's address
                options = options.model_copy(update={"host": st.host.address})
            argv += options.argv()
            if in_netns:
                argv += ["--metrics-host", st.host.address]
        else:
            assert isinstance(spec, SourceProcess | ReaderProcess)
            server = sc.server_of(st.name)
            assert server is not None
            if spec.server_via is not None:  # through the run's proxy (created at the server's start)
                argv += ["--server", self._ensure_proxy(spec.server_via, deadline).listen]
            else:
                port = self._endpoint(server, "grpc", deadline)
                argv += ["--server", f"{self._state(server).host.address}:{port}"]
            argv += sc.model.flags(sc.seed, sc.directory)
            argv += ["--transport", sc.transport_of(st.name)]
            if in_netns:  # reachable from the other namespaces and from the harness (scrapes)
                argv += ["--metrics-host", st.host.address]
                if spec.options.advertise_host is None:
                    argv += ["--advertise-host", st.host.address]
            if isinstance(spec, ReaderProcess):
                options = spec.options
                updates: dict[str, Any] = {}
                if options.checkpoint is None and self._checkpoint is not None:
                    updates["checkpoint"] = str(self._checkpoint)
                elif options.checkpoint is not None:
                    updates["checkpoint"] = str((sc.directory / options.checkpoint).resolve())
                if options.selector_seed is None:
                    updates["selector_seed"] = sc.seed
                argv += options.model_copy(update=updates).argv()
                argv += ["--result", str(st.log_path.with_suffix(f".result-{st.incarnation + 1}.json"))]
            else:
                argv += spec.options.argv()
        argv += [self._fill(part, st.log_path.parent) for part in spec.extra_args]
        return argv

    def start_process(self, name: str, deadline: float) -> dict[str, Any]:
        st = self._state(name)
        with self._lock:
            if st.alive:
                raise StepFailed("-", f"{name} is already running (pid {st.pid})")
        argv = self._argv(st, deadline)
        env = self._base_env(name)
        for key, value in {**self.scenario.env, **st.spec.env}.items():
            env[key] = self._fill(value, st.log_path.parent)
        with self._lock:
            incarnation = st.incarnation + 1
            self.timeline.append("invoke", name, "start", {"incarnation": incarnation})
            st.start_index = len(self.timeline)
            proc = st.host.spawn(argv, env=env, cwd=self.run_dir, log_path=st.log_path)
            st.ports = {}
            self._start_counter += 1
            st.started_order = self._start_counter
            st.proc, st.pid, st.incarnation = proc, proc.pid, incarnation
            st.pids[proc.pid] = incarnation
            st.exit_recorded, st.stopping = False, False
            value = {"incarnation": incarnation, "pid": proc.pid, "argv": argv, "host": st.host.name}
            self.timeline.append("ok", name, "start", value)
        for proxy, spec in self.scenario.proxies.items():
            if spec.upstream == name:  # its upstream is known once it listens: create (or re-point) it now
                self._ensure_proxy(proxy, deadline)
        return value

    def stop_process(self, name: str, grace: float, reason: str = "step") -> dict[str, Any]:
        st = self._state(name)
        with self._lock:
            if not st.alive or st.proc is None:
                value = {"already_exited": True, "reason": reason}
                self.timeline.append("info", name, "stop", value)
                return value
            st.stopping = True
            proc, pid = st.proc, st.pid
            self.timeline.append("invoke", name, "stop", {"pid": pid, "grace": grace, "reason": reason})
        result = proc.stop(grace)
        self._record_exit(st, result.rc)
        value = {"pid": pid, "rc": result.rc, "escalated": result.escalated, "seconds": round(result.seconds, 3)}
        self.timeline.append("ok", name, "stop", value)
        return value

    # ------------------------------------------------------------------ awaits

    def _await(self, sid: str, arg: BaseModel) -> dict[str, Any]:
        if isinstance(arg, AwaitEvent):
            entry = self._await_event(arg.process, arg.event, arg.where, arg.within, arg.count, arg.since)
            if entry is None:
                return self._await_timeout(sid, arg.on_timeout, f"{arg.process} did not emit {arg.event} in time", arg.process)
            return {"matched_t": round(entry.t, 6)}
        if isinstance(arg, AwaitExit):
            st = self._state(arg.process)
            start = st.start_index

            def exited(e: Entry) -> bool:
                return e.actor == arg.process and e.f == "process_exit" and e.get("incarnation") == st.incarnation

            if st.proc is None:
                raise StepFailed(sid, f"{arg.process} was never started")
            entry = self._wait(exited, self._step_deadline(arg.within), start=max(0, start - 1))
            if entry is None:
                return self._await_timeout(sid, arg.on_timeout, f"{arg.process} did not exit in time", arg.process)
            rc = entry.get("rc")
            if arg.code is not None and "any" not in arg.code and rc not in arg.code:
                raise StepFailed(sid, f"{arg.process} exited {rc}, expected {' or '.join(map(str, arg.code))}")
            return {"rc": rc}
        assert isinstance(arg, AwaitMetric)
        cond = arg.metric
        st = self._state(cond.process)
        deadline = self._step_deadline(arg.within)
        last: float | None = None
        while True:
            port = st.ports.get("metrics") if st.alive else None
            if port:
                entry = self._scrape_one(st, port)
                if entry.get("ok"):
                    value = sample_value(entry.get("samples", ()), cond.metric, cond.labels)
                    last = cond.default if value is None else value
                    if last is not None and compare(cond.op, last, cond.value):
                        return {"value": last, "matched_t": round(entry.t, 6)}
            if time.monotonic() + arg.every > deadline:
                shown = "absent" if last is None else f"{last:g}"
                return self._await_timeout(
                    sid, arg.on_timeout, f"{cond.process}: {cond.metric} {cond.op} {cond.value:g} not met in time (last {shown})", cond.process
                )
            if self._abort.wait(arg.every):
                raise self._aborted()

    def _await_event(
        self,
        process: str,
        event: str,
        where: Mapping[str, Scalar],
        within: float | None,
        count: int = 1,
        since: str = "incarnation",
    ) -> Entry | None:
        st = self._state(process)
        if since == "incarnation":
            start = max(0, st.start_index - 1)
            incarnation = st.incarnation
        elif since == "step":
            start, incarnation = len(self.timeline), None
        else:
            start, incarnation = 0, None

        def hit(e: Entry) -> bool:
            if e.actor != process or e.f != event or e.type != "info":
                return False
            if incarnation is not None and e.get("incarnation") not in (incarnation, None):
                return False
            return matches(e, where)

        return self._wait(hit, self._step_deadline(within), start=start, count=count)

    def _await_timeout(self, sid: str, on_timeout: str, message: str, process: str) -> dict[str, Any]:
        stacks = self._dump_stacks(f"step{sid}")
        if on_timeout == "continue":
            self.timeline.append("info", "harness", "await_timeout", {"step": sid, "error": message, "stacks": stacks})
            return {"timed_out": True}
        raise StepFailed(sid, message)

    # ------------------------------------------------------------------ faults

    def _inject(self, step: FaultStep) -> None:
        spec = step.fault
        self._fault_counter += 1
        name = spec.name or f"{spec.kind}-{self._fault_counter}"
        fault = fault_registry.make_fault(spec, name)
        base = {"fault": name, "kind": spec.kind, "target": getattr(spec, "target", None)}
        if type(fault).healable:
            self._active[name] = fault
        self.timeline.append("invoke", "nemesis", "inject", {**base, "spec": spec.model_dump(mode="json")})
        try:
            value = fault.inject(_FaultCtx(self))
        except (_Abort, RunInterrupted) as exc:
            reason = "interrupted" if isinstance(exc, RunInterrupted) else "aborted"
            self.timeline.append("info", "nemesis", "inject", {**base, "indeterminate": True, "error": reason})
            raise
        except FaultError as exc:
            self.timeline.append("fail", "nemesis", "inject", {**base, "error": str(exc)})
            raise
        except StepFailed as exc:
            self.timeline.append("fail", "nemesis", "inject", {**base, "error": exc.reason})
            raise
        except Exception as exc:  # noqa: BLE001 - unknown outcome: indeterminate, heal anyway
            self.timeline.append("info", "nemesis", "inject", {**base, "indeterminate": True, "error": f"{type(exc).__name__}: {exc}"})
            raise FaultError(f"fault {name} ({spec.kind}) raised {type(exc).__name__}: {exc}") from exc
        self.timeline.append("ok", "nemesis", "inject", {**base, "healable": type(fault).healable, **(value or {})})
        if spec.duration and type(fault).healable:
            timer = threading.Timer(spec.duration, self._auto_heal, args=(name,))
            timer.daemon = True
            self._timers.append(timer)
            timer.start()

    def _auto_heal(self, name: str) -> None:
        if self._tearing_down:
            return
        try:
            self._heal(name, reason="duration")
        except Exception:  # noqa: BLE001 - recorded inside _heal; teardown heals again
            pass

    def _heal(self, name: str, reason: str = "step") -> None:
        with self._lock:
            fault = self._active.get(name)
        if fault is None:
            self.timeline.append("info", "nemesis", "heal", {"fault": name, "reason": reason, "noop": True})
            return
        base = {"fault": name, "kind": fault.kind, "reason": reason}
        budget = self.scenario.budgets.heal
        self.timeline.append("invoke", "nemesis", "heal", base)
        try:
            value = self._bounded_heal(fault, budget) or {}
        except RunInterrupted:
            self.timeline.append("info", "nemesis", "heal", {**base, "indeterminate": True, "error": "interrupted"})
            raise
        except _HealOverrun:
            # the heal is still running in its thread: never heal this fault again concurrently
            error = f"did not return within {budget:g}s (budgets.heal)"
            with self._lock:
                self._active.pop(name, None)
            self.timeline.append("fail", "nemesis", "heal", {**base, "error": error, "timed_out": True})
            self._heal_failures.append(f"{name} ({fault.kind}) {error}")
            raise FaultError(f"healing {name} {error}") from None
        except Exception as exc:  # noqa: BLE001 - keep healing the others
            error = f"{type(exc).__name__}: {exc}"
            self.timeline.append("fail", "nemesis", "heal", {**base, "error": error})
            self._heal_failures.append(f"{name} ({fault.kind}) raised {error}")
            raise FaultError(f"healing {name} failed: {exc}") from exc
        with self._lock:
            self._active.pop(name, None)
        self.timeline.append("ok", "nemesis", "heal", {**base, **value})

    def _bounded_heal(self, fault: fault_registry.Fault, budget: float) -> dict[str, Any] | None:
        """``fault.heal`` in its own thread, waited for at most ``budget`` seconds (a heal that
        blocks, e.g. on an unreachable host, must not hold up the rest of the teardown)."""
        outcome: dict[str, Any] = {}
        done = threading.Event()

        def heal() -> None:
            try:
                outcome["value"] = fault.heal(_FaultCtx(self, healing=True))
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                outcome["error"] = exc
            finally:
                done.set()

        thread = threading.Thread(target=heal, name=f"mxchaos-heal-{fault.name}", daemon=True)
        thread.start()
        if not done.wait(budget):
            raise _HealOverrun()
        if "error" in outcome:
            raise outcome["error"]
        return outcome.get("value")

    # ------------------------------------------------------------------ teardown

    def _teardown(self) -> None:
        self._tearing_down = True
        self._abort.set()
        for timer in self._timers:
            timer.cancel()
        for name in reversed(list(self._active)):
            with contextlib.suppress(Exception):
                self._heal(name, reason="teardown")
        if self._threads:  # final scrape while everything is still up
            with contextlib.suppress(Exception):
                self._scrape_all(wait=True)
        grace = self.scenario.budgets.stop_grace
        live = sorted((st for st in self.procs.values() if st.alive), key=lambda s: s.started_order)
        for st in reversed(live):
            with contextlib.suppress(Exception):
                self.stop_process(st.name, grace, reason="teardown")
        with contextlib.suppress(Exception):
            self._stop_toxiproxy()  # after its clients: their last STALE still reaches the server
        self._stop_threads.set()
        for thread in self._threads:
            thread.join(timeout=10)
        self._scrape_pool.shutdown(wait=True, cancel_futures=True)
        self._poll_processes()
        self._leak_scan()
        for host in self.hosts.values():
            with contextlib.suppress(Exception):
                host.close()
        try:
            self._close_network()
        except Exception as exc:  # noqa: BLE001 - recorded; cleanup sweeps it by run id
            self.timeline.append("fail", "harness", "network_down", {"error": f"{type(exc).__name__}: {exc}"})
        status = "hang" if self._hang else "done"
        self.timeline.append("ok" if not self._hang else "info", "harness", "run", {"status": status})
        with contextlib.suppress(OSError):
            (ledger_dir() / f"{self.run_id}.json").unlink()

    def _leak_scan(self) -> None:
        """Record what outlived the stop of every process, then kill it (the harness itself
        must never leak). Grandchildren that exit right after their parent get a moment."""
        deadline = time.monotonic() + 2.0
        leftovers: list[procscan.RunProcess] = []
        while True:
            found = {p.pid: p for host in self.hosts.values() for p in host.run_processes(self.run_id)}
            leftovers = list(found.values())
            if not leftovers or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        ports: list[int] = []
        checked: list[int] = []
        for st in self.procs.values():
            for port in sorted(st.all_ports):
                checked.append(port)
                if st.host.port_open(port):
                    ports.append(port)
        if self._toxiproxy is not None:
            for port in sorted(self._harness_ports):
                checked.append(port)
                if self._toxiproxy.host.port_open(port):
                    ports.append(port)
        self.timeline.append(
            "info",
            "harness",
            "leak_scan",
            {"processes": [p.to_json() for p in leftovers], "ports": ports, "checked_ports": checked},
        )
        if leftovers:
            for p in leftovers:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(p.pid, signal.SIGKILL)
            self.timeline.append("info", "harness", "swept", {"pids": [p.pid for p in leftovers]})

    # ------------------------------------------------------------------ judging

    def _check(self, history: History) -> list[check_registry.NamedResult]:
        return judge(self.scenario, history)

    @staticmethod
    def _verdict(status: str, results: Sequence[check_registry.NamedResult], known_defect: str | None = None) -> str:
        return verdict_of(status, results, known_defect)


def judge(scenario: Scenario, history: History) -> list[check_registry.NamedResult]:
    """Run the scenario's checks over a history (pure; ``mxchaos check`` re-judges with it)."""
    facts = check_registry.RunFacts(roles=scenario.roles())
    return [
        check_registry.evaluate(i, kind, params, history, facts)
        for i, (kind, params) in enumerate(scenario.check_entries())
    ]


def verdict_of(status: str, results: Sequence[check_registry.NamedResult], known_defect: str | None = None) -> str:
    """The run's verdict: ``skip`` (nothing ran), ``hang``, ``error`` (a harness error, an
    interrupt, a failed heal), ``fail`` (a step failed or a check is false), ``unknown``
    (a check is unknown), else ``pass``. For a scenario with a ``known_defect``, steps that
    all completed with a false check are ``xfail`` (the defect reproduced) and a pass is
    ``xpass`` (it did not: fixed?); a failed step stays ``fail``: the scenario did not get
    to where it judges the defect (a process that did not start is not the defect)."""
    if status == "skipped":
        return "skip"
    if status == "hang":
        return "hang"
    if status in ("error", "interrupted"):
        return "error"
    merged = check_registry.merge_valid(r.valid for r in results)
    if status == "step_failed":
        return "fail"
    if merged is False:
        return "xfail" if known_defect else "fail"
    if merged == "unknown":
        return "unknown"
    return "xpass" if known_defect else "pass"


class _FaultCtx:
    """``FaultContext`` over a runner: what a fault may do, nothing more."""

    def __init__(self, runner: Runner, *, healing: bool = False) -> None:
        self._runner = runner
        self._healing = healing
        self.run_id = runner.run_id

    def proc(self, name: str) -> _ProcView:
        st = self._runner._state(name)
        return _ProcView(st.name, st.role, st.pid if st.alive else None, st.incarnation, st.alive, st.host.name)

    def locate(self, target: str | SourceOf) -> _HostView:
        runner = self._runner
        if isinstance(target, str) and target in runner.hosts:
            name = target
        else:
            name = runner._state(self.resolve(target)).host.name
        host = runner.hosts[name]
        if isinstance(host, netns.NetnsHost):
            return _HostView(name, host.kind, host.address, host.netns, host.link, host.inner_link)
        return _HostView(name, getattr(host, "kind", "local"), host.address, None, None, None)

    def resolve(self, target: str | SourceOf) -> str:
        if isinstance(target, str):
            return target
        reader = target.source_of
        timeline = self._runner.timeline
        attempt = None
        for e in timeline.entries():
            if e.actor == reader and e.type == "info" and e.f == "attempt_start":
                attempt = e
        if attempt is None:
            raise FaultError(f"source_of {reader}: {reader} has not started an attempt yet")
        worker_id = attempt.get("worker_id")
        for e in reversed(timeline.entries()):
            if e.type == "info" and e.f == "published" and e.get("worker_id") == worker_id:
                return str(e.actor)
        raise FaultError(f"source_of {reader}: no process of this run published worker {worker_id!r}")

    def send_signal(self, name: str, sig: int, *, group: bool = True) -> int:
        st = self._runner._state(name)
        with self._runner._lock:
            if not st.alive or st.proc is None or st.pid is None:
                raise FaultError(f"{name} is not running")
            if not st.proc.signal(sig, group=group):
                raise FaultError(f"{name} (pid {st.pid}) is gone")
            return st.pid

    def signal_pid(self, pid: int, sig: int, *, group: bool = True) -> bool:
        with self._runner._lock:
            for st in self._runner.procs.values():
                if st.pid == pid and st.proc is not None and st.proc.poll() is None:
                    return st.proc.signal(sig, group=group)
        return False

    def stop(self, name: str, grace: float) -> dict[str, Any]:
        return self._runner.stop_process(name, grace, reason="fault")

    def start(self, name: str) -> dict[str, Any]:
        return self._runner.start_process(name, self._runner._step_deadline(None))

    def wait_event(self, name: str, event: str, where: Mapping[str, Scalar], within: float) -> dict[str, Any]:
        entry = self._runner._await_event(name, event, where, within)
        if entry is None:
            raise FaultError(f"{name} did not emit {event} within {within:g}s")
        return {"t": entry.t, **entry.value}

    def sleep(self, seconds: float) -> None:
        self._runner._sleep(seconds)

    def proxy(self, name: str) -> _ProxyView:
        runner = self._runner
        if name not in runner.scenario.proxies:
            raise FaultError(f"the scenario has no proxy named {name!r}")
        tp = runner._toxiproxy
        view = tp.proxies.get(name) if tp is not None else None
        if view is not None:
            return view
        if self._healing:
            raise FaultError(f"proxy {name} was never created")
        try:
            return runner._ensure_proxy(name, runner._step_deadline(None))
        except StepFailed as exc:
            raise FaultError(f"proxy {name}: {exc.reason}") from None
        except HarnessError as exc:
            raise FaultError(str(exc)) from None


@dataclass(frozen=True)
class _ProcView:
    name: str
    role: str
    pid: int | None
    incarnation: int
    alive: bool
    host: str


@dataclass(frozen=True)
class _HostView:
    name: str
    kind: str
    address: str
    netns: str | None
    link: str | None
    inner_link: str | None


def _thread_stacks() -> str:
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        out.append(f"Thread {names.get(ident, '?')} ({ident}):\n" + "".join(traceback.format_stack(frame)))
    return "\n".join(out)


def result_to_json(result: RunResult) -> dict[str, Any]:
    return {
        "scenario": result.scenario.name,
        "run_id": result.run_id,
        "run_dir": str(result.run_dir),
        "seed": result.seed,
        "verdict": result.verdict,
        "status": result.status,
        "reason": result.reason,
        "failed_step": result.failed_step,
        "started_at": result.started_at,
        "seconds": round(result.seconds, 3),
        "known_defect": result.scenario.known_defect,
        "missing_capabilities": result.missing_capabilities,
        "checks": [r.to_json() for r in result.checks],
        "stacks": result.stacks,
        "interrupted_by": result.interrupted_by,
    }

