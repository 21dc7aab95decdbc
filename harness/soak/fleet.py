"""The soak's long-lived mxref processes: one metadata server, sources, and readers that load
again on request (``mxref reader --load-loop``), each with its own log and events file.

Every process is started in a session of its own with ``die_with_parent`` (it gets SIGTERM when
the harness dies, however it dies) and is stopped by ``Fleet.stop`` (SIGTERM to its group, SIGKILL
after ``STOP_GRACE_S``). With a ``run_id`` (the soak's), each also joins that run's scope as a run's
processes do (``harness.machine.runscope``: its cgroup between fork and exec, its ledger of pids
naming the soak as the harness, ``MXCHAOS_RUN_ID`` in its environment), so ``mxchaos cleanup`` finds
and kills what a SIGKILLed soak left, a process that ignores or never acts on the SIGTERM included. Every wait is bounded: a start by ``START_TIMEOUT_S``, a load by
``LOAD_TIMEOUT_S``.
"""

from __future__ import annotations

import json
import os
import queue
import resource
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from harness import eventsfile
from harness.machine import procscan, runscope
from mxref.process import die_with_parent

__all__ = ["Fleet", "FleetError", "FleetSpec", "MxProcess"]

START_TIMEOUT_S = 60.0
LOAD_TIMEOUT_S = 120.0
STOP_GRACE_S = 10.0


class FleetError(RuntimeError):
    """A process of the fleet did not start, died, or did not answer in time."""


@dataclass(frozen=True)
class FleetSpec:
    sources: int = 2
    readers: int = 2
    tensors: int = 4
    tensor_mib: float = 0.25
    transport: str = "ucx-tcp"
    source_mode: str = "p2p"  # p2p: readers fetch a source's NIXL metadata from its listener; central: from the server
    leak: str | None = None  # a planted per-load leak of every reader (--debug-leak)
    leak_readers: int | None = None  # how many readers carry it (None: all)
    source_fd_limit: int | None = None  # the sources' RLIMIT_NOFILE (None: inherited): a leak of descriptors kills sooner

    def model_args(self) -> list[str]:
        return ["--tensors", str(self.tensors), "--tensor-mib", f"{self.tensor_mib:g}", "--transport", self.transport]


@dataclass
class MxProcess:
    """One ``python -m mxref ROLE`` process."""

    name: str
    role: str
    popen: subprocess.Popen[bytes]
    events_path: Path
    log_path: Path
    metrics_url: str | None = None
    loads: int = 0  # verified loads it reported (readers)
    failed: int = 0  # loads it reported failed (readers)
    _lines: queue.Queue[str | None] = field(default_factory=queue.Queue)
    _pump: threading.Thread | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def events(self) -> list[dict[str, Any]]:
        try:
            return eventsfile.read(self.events_path)
        except eventsfile.EventsFileError as exc:
            raise FleetError(f"{self.name}: {exc}") from exc

    def wait_event(self, name: str, timeout_s: float, **where: Any) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for ev in self.events():
                if ev.get("event") == name and all(ev.get(k) == v for k, v in where.items()):
                    return ev
            if self.popen.poll() is not None:
                raise FleetError(f"{self.name} exited ({self.popen.returncode}) before {name}; see {self.log_path}")
            time.sleep(0.05)
        raise FleetError(f"{self.name}: no {name} {where or ''} within {timeout_s:g}s; see {self.log_path}")

    def pump_stdout(self) -> None:
        """Read the process's standard output, line by line, into its queue (a thread of its own)."""
        assert self.popen.stdout is not None
        stream = self.popen.stdout

        def pump() -> None:
            for raw in stream:
                self._lines.put(raw.decode(errors="replace"))
            self._lines.put(None)

        self._pump = threading.Thread(target=pump, name=f"soak-{self.name}-stdout", daemon=True)
        self._pump.start()

    def next_json(self, key: str, timeout_s: float) -> dict[str, Any]:
        """The next standard-output line that is a JSON object holding ``key``."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise FleetError(f"{self.name}: no {key!r} line within {timeout_s:g}s; see {self.log_path}")
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise FleetError(f"{self.name} exited ({self.popen.wait(5)}) before its {key!r} line; see {self.log_path}")
            try:
                doc = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(doc, dict) and key in doc:
                return doc

    def load(self, timeout_s: float = LOAD_TIMEOUT_S) -> dict[str, Any]:
        """One load of a looping reader: its result (``ok`` only when over NIXL, verified)."""
        stdin: IO[bytes] | None = self.popen.stdin
        if stdin is None:
            raise FleetError(f"{self.name} is not a looping reader")
        try:
            stdin.write(b"load\n")
            stdin.flush()
        except (BrokenPipeError, ValueError) as exc:
            raise FleetError(f"{self.name} is gone ({exc}); see {self.log_path}") from exc
        result: dict[str, Any] = self.next_json("result", timeout_s)["result"]
        # the load given back and the next target made (mxref.roles.load_loop): a sample from now on
        # never catches the reader half way through either
        self.next_json("idle", timeout_s)
        if result.get("ok") and result.get("path") == "rdma" and result.get("integrity") == "verified":
            self.loads += 1
        else:
            self.failed += 1
        return result

    def stop(self) -> int | None:
        if self.popen.stdin is not None:
            try:
                self.popen.stdin.close()  # a looping reader leaves at the end of its input
                self.popen.wait(STOP_GRACE_S)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGTERM)
                self.popen.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(STOP_GRACE_S)
            except ProcessLookupError:
                pass
        if self._pump is not None:
            self._pump.join(STOP_GRACE_S)  # the process is gone: its output ends
        if self.popen.stdout is not None and (self._pump is None or not self._pump.is_alive()):
            self.popen.stdout.close()
        return self.popen.poll()


class Fleet:
    """Start the server, the sources (READY) and the looping readers (ready) in ``workdir``."""

    def __init__(self, spec: FleetSpec, workdir: Path, run_id: str | None = None) -> None:
        self.spec = spec
        self.workdir = workdir
        self.run_id = run_id
        self.processes: list[MxProcess] = []
        me = os.getpid()
        self.harness = (me, procscan.proc_start_time(me))

    def _env(self, name: str) -> dict[str, str] | None:
        """The environment of a process of the run (None: inherited, no run)."""
        if self.run_id is None:
            return None
        hp, hs = self.harness
        return {**os.environ, procscan.ENV_RUN_ID: self.run_id, procscan.ENV_PROC: name,
                procscan.ENV_HARNESS_PID: str(hp), procscan.ENV_HARNESS_START: str(hs if hs is not None else "")}

    @property
    def readers(self) -> list[MxProcess]:
        return [p for p in self.processes if p.role == "reader"]

    def _start(self, name: str, role: str, *flags: str, loop: bool = False, fd_limit: int | None = None) -> MxProcess:
        events = self.workdir / f"{name}.events.jsonl"
        log_path = self.workdir / f"{name}.log"
        argv = [sys.executable, "-m", "mxref", role, "--name", name, "--events", str(events), "--metrics-port", "0",
                *flags]
        with open(log_path, "wb") as log, runscope.joining(self.run_id) as join:
            def preexec() -> None:
                if join is not None:
                    join()  # into the run's cgroup first: whatever it forks later is in it too
                die_with_parent()
                if fd_limit is not None:
                    resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit))

            popen = subprocess.Popen(argv, stdin=subprocess.PIPE if loop else subprocess.DEVNULL,
                                     stdout=subprocess.PIPE if loop else log, stderr=log, env=self._env(name),
                                     start_new_session=True, preexec_fn=preexec)
        if self.run_id is not None:
            runscope.record(self.run_id, popen.pid, self.harness)
        proc = MxProcess(name, role, popen, events, log_path)
        self.processes.append(proc)
        return proc

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        spec = self.spec
        server = self._start("server", "server", "--heartbeat-timeout", "60")
        port = server.wait_event("listening", START_TIMEOUT_S, what="grpc")["port"]
        addr = f"127.0.0.1:{port}"
        sources = [self._start(f"source-{i + 1}", "source", "--server", addr, "--heartbeat-interval", "5",
                               "--mode", spec.source_mode, *spec.model_args(), fd_limit=spec.source_fd_limit)
                   for i in range(spec.sources)]
        for source in sources:
            source.wait_event("status_change", START_TIMEOUT_S, status="READY")
        leaky = spec.readers if spec.leak_readers is None else spec.leak_readers
        for i in range(spec.readers):
            leak = ["--debug-leak", spec.leak] if spec.leak and i < leaky else []
            reader = self._start(f"reader-{i + 1}", "reader", "--server", addr, "--load-loop",
                                 "--transfer-timeout", "30", *spec.model_args(), *leak, loop=True)
            reader.pump_stdout()
        for reader in self.readers:
            reader.next_json("ready", START_TIMEOUT_S)
        for proc in self.processes:
            port = proc.wait_event("listening", START_TIMEOUT_S, what="metrics")["port"]
            proc.metrics_url = f"http://127.0.0.1:{port}/metrics"

    def stop(self) -> dict[str, int | None]:
        """Stop every process, readers first; each one's exit code."""
        codes: dict[str, int | None] = {}
        for proc in reversed(self.processes):
            codes[proc.name] = proc.stop()
        return codes
