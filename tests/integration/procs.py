"""Real mxref processes for integration tests: start, watch, signal, scrape, kill.

``Cluster`` starts ``python -m mxref <role>`` children, each with its own events
file and log under one directory, each in its own session (so a signal or the
final kill reaches it and whatever it spawned). Ports are learned from the
``listening`` events; every wait polls the events file with a deadline; teardown
resumes anything stopped and kills everything, so a failed test leaks nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from harness import eventsfile

ROOT = Path(__file__).resolve().parents[2]
Event = eventsfile.Event
POLL_S = 0.005
START_TIMEOUT_S = 30.0
# Variables a child must not inherit from whoever runs the tests: each test sets what it needs.
SCRUBBED_PREFIXES = ("UCX_", "MX_", "MXREF_", "MODEL_EXPRESS_", "NIXL_")


class ClusterError(AssertionError):
    """A process did not do what the test waited for; the message carries its log tail."""


@dataclass
class Proc:
    name: str
    role: str
    argv: list[str]
    events_path: Path
    log_path: Path
    stdout_path: Path
    popen: subprocess.Popen[bytes]
    stopped: bool = False  # SIGSTOPped by the test and not yet resumed
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def events(self, name: str | None = None, where: Callable[[Event], bool] | None = None) -> list[Event]:
        return eventsfile.read(self.events_path, name, where)

    def stdout(self) -> str:
        return self.stdout_path.read_text() if self.stdout_path.exists() else ""

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def result(self) -> dict[str, Any]:
        """The reader's ``{"result": ...}`` line from stdout."""
        for line in reversed(self.stdout().splitlines()):
            if line.startswith('{"result"'):
                result: dict[str, Any] = json.loads(line)["result"]
                return result
        raise ClusterError(f"{self.name} printed no result line\n--- stdout\n{self.stdout()}\n--- log\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])


class Cluster:
    def __init__(self, workdir: Path, env: dict[str, str] | None = None) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        base = {k: v for k, v in os.environ.items() if not k.startswith(SCRUBBED_PREFIXES)}
        base["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), base.get("PYTHONPATH", "")) if p)
        base["PYTHONUNBUFFERED"] = "1"
        base.update(env or {})
        self.env = base
        self.procs: list[Proc] = []
        self.server: Proc | None = None
        self.server_address: str | None = None

    # ------------------------------------------------------------------ start
    def start(self, role: str, name: str, *args: str, env: dict[str, str] | None = None,
              wrap: tuple[str, ...] = ()) -> Proc:
        """``python -m mxref role``, after ``wrap`` (a command that runs it: ``prlimit --nofile=64:64``)."""
        events = self.workdir / f"{name}.events.jsonl"
        log = self.workdir / f"{name}.log"
        out = self.workdir / f"{name}.stdout"
        for path in (events, log, out):
            if path.exists():  # a restarted name gets fresh files
                path.rename(path.with_name(f"{path.name}.{time.monotonic_ns()}"))
        argv = [*wrap, sys.executable, "-m", "mxref", role, "--name", name, "--events", str(events), *args]
        with log.open("wb") as log_f, out.open("wb") as out_f:
            popen = subprocess.Popen(
                argv, cwd=ROOT, env={**self.env, **(env or {})}, stdin=subprocess.DEVNULL,
                stdout=out_f, stderr=log_f, start_new_session=True,
            )
        proc = Proc(name, role, argv, events, log, out, popen)
        self.procs.append(proc)
        return proc

    def start_server(self, *, heartbeat_timeout: float = 2.0, reaper_interval: float = 0.25,
                     gc_timeout: float = 60.0) -> Proc:
        proc = self.start("server", "server", "--heartbeat-timeout", str(heartbeat_timeout),
                          "--reaper-interval", str(reaper_interval), "--gc-timeout", str(gc_timeout))
        port = self.port(proc, "grpc")
        self.server, self.server_address = proc, f"127.0.0.1:{port}"
        return proc

    def start_source(self, name: str, *args: str, model: tuple[str, ...] = (), heartbeat: float = 0.5,
                     wait_ready: bool = True) -> Proc:
        assert self.server_address, "start_server first"
        proc = self.start("source", name, "--server", self.server_address, "--heartbeat-interval", str(heartbeat),
                          *model, *args)
        if wait_ready:
            self.wait_ready(proc)
        return proc

    def wait_ready(self, proc: Proc, timeout: float = START_TIMEOUT_S) -> Proc:
        """Until ``proc`` (a source, or a reader serving after its load) has heartbeated READY."""
        published = self.wait_event(proc, "published", timeout=timeout)
        self.wait_event(proc, "status_change", where=lambda e: e["status"] == "READY", timeout=timeout)
        proc.info.update(worker_id=published["worker_id"], mx_source_id=published["mx_source_id"])
        agent = proc.events("agent_ready")
        if agent:
            proc.info["agent_name"] = agent[0]["agent_name"]
        return proc

    def start_reader(self, name: str, *args: str, model: tuple[str, ...] = ()) -> Proc:
        assert self.server_address, "start_server first"
        return self.start("reader", name, "--server", self.server_address, *model, *args)

    def run_reader(self, name: str, *args: str, model: tuple[str, ...] = (), timeout: float = 60.0) -> Proc:
        proc = self.start_reader(name, *args, model=model)
        self.wait_exit(proc, timeout)
        return proc

    # ------------------------------------------------------------------ watch
    def wait_event(self, proc: Proc, name: str, where: Callable[[Event], bool] | None = None,
                   timeout: float = 10.0) -> Event:
        """The first ``name`` event of ``proc`` matching ``where``; fails after ``timeout`` or when ``proc`` exits without it."""
        deadline = time.monotonic() + timeout
        while True:
            found = proc.events(name, where)
            if found:
                return found[0]
            if proc.returncode is not None:
                found = proc.events(name, where)  # written just before it exited
                if found:
                    return found[0]
                raise ClusterError(f"{proc.name} exited with {proc.returncode} before a {name!r} event\n{proc.tail()}")
            if time.monotonic() >= deadline:
                raise ClusterError(f"no {name!r} event from {proc.name} within {timeout}s\n{proc.tail()}")
            time.sleep(POLL_S)

    def port(self, proc: Proc, what: str, timeout: float = START_TIMEOUT_S) -> int:
        return int(self.wait_event(proc, "listening", where=lambda e: e["what"] == what, timeout=timeout)["port"])

    def wait_exit(self, proc: Proc, timeout: float) -> int:
        try:
            return proc.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ClusterError(f"{proc.name} still running after {timeout}s\n{proc.tail()}") from None

    def scrape(self, proc: Proc, timeout: float = 5.0) -> dict[str, Any]:
        """``{family name: Metric}`` from the process's /metrics, parsed by prometheus_client."""
        port = self.port(proc, "metrics")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as resp:
            text = resp.read().decode()
        return {family.name: family for family in text_string_to_metric_families(text)}

    @staticmethod
    def sample(families: dict[str, Any], name: str, **labels: str) -> float | None:
        """The value of the sample ``name`` (full sample name) whose labels include ``labels``."""
        for family in families.values():
            for s in family.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    return float(s.value)
        return None

    # ---------------------------------------------------------------- signals
    def signal(self, proc: Proc, sig: signal.Signals) -> None:
        if proc.returncode is not None:
            return
        os.kill(proc.pid, sig)
        if sig == signal.SIGSTOP:
            proc.stopped = True
        elif sig in (signal.SIGCONT, signal.SIGKILL):
            proc.stopped = False

    def freeze(self, proc: Proc) -> None:
        self.signal(proc, signal.SIGSTOP)

    def thaw(self, proc: Proc) -> None:
        self.signal(proc, signal.SIGCONT)

    def kill(self, proc: Proc) -> None:
        self.signal(proc, signal.SIGKILL)
        try:
            proc.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    # ---------------------------------------------------------------- teardown
    def close(self) -> None:
        """Resume, then kill every process group we started; reap them all."""
        for proc in self.procs:
            if proc.returncode is None:
                for sig in (signal.SIGCONT, signal.SIGKILL):
                    try:
                        os.killpg(proc.pid, sig)
                    except (ProcessLookupError, PermissionError):
                        pass
        for proc in self.procs:
            try:
                proc.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be ignored
                pass

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def report(self) -> str:
        """Every process's exit code and log tail (for a failing assertion's message)."""
        parts = []
        for proc in self.procs:
            parts.append(f"=== {proc.name} ({proc.role}) rc={proc.returncode}\n{proc.tail(25)}")
        return "\n".join(parts)
