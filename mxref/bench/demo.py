"""``python -m mxref demo``: a server, a source and a reader on this machine.

Moves a model of a few hundred MiB over UCX-over-TCP with the full reference
flow, prints the reader's result, then a raw two-process NIXL READ of the same
size in the same run (``mxref.bench.raw``) for comparison, and stops everything it
started (SIGTERM, then SIGKILL after a grace period) before returning.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from mxref.metrics import ProcessMetrics
from mxref.options import DemoFlags
from mxref.process import EXIT_LOAD_FAILED, EXIT_OK, Process, die_with_parent

STARTUP_TIMEOUT_S = 60.0
STOP_GRACE_S = 10.0


class Child:
    """One mxref process with its own log and events file."""

    def __init__(self, workdir: Path, name: str, role: str, *flags: str) -> None:
        self.name = name
        self.events_path = workdir / f"{name}.events.jsonl"
        self.log_path = workdir / f"{name}.log"
        argv = [sys.executable, "-m", "mxref", role, "--name", name, "--events", str(self.events_path), *flags]
        with open(self.log_path, "wb") as log:
            self.popen = subprocess.Popen(argv, stdout=subprocess.PIPE if role == "reader" else log, stderr=log,
                                          start_new_session=True, preexec_fn=die_with_parent)

    def events(self) -> list[dict[str, Any]]:
        if not self.events_path.exists():
            return []
        return [json.loads(line) for line in self.events_path.read_text().splitlines() if line.strip()]

    def wait_event(self, name: str, timeout_s: float, **where: Any) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for ev in self.events():
                if ev["event"] == name and all(ev.get(k) == v for k, v in where.items()):
                    return ev
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.popen.returncode}) before {name}; see {self.log_path}")
            time.sleep(0.05)
        raise TimeoutError(f"{self.name}: no {name} {where or ''} within {timeout_s:.0f}s; see {self.log_path}")

    def stop(self) -> int:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(STOP_GRACE_S)
        return int(self.popen.returncode)


def _read_once(workdir: Path, children: list[Child], name: str, addr: str, flags: list[str]) -> dict[str, Any] | None:
    """Run one reader to completion; its result, or None (with a message) when it printed none."""
    reader = Child(workdir, name, "reader", "--server", addr, "--transfer-timeout", "30", *flags)
    children.append(reader)
    out, _ = reader.popen.communicate(timeout=STARTUP_TIMEOUT_S + 60)
    lines = [ln for ln in out.decode().splitlines() if ln.startswith('{"result"')]
    if not lines:
        print(f"demo: {name} printed no result (exit {reader.popen.returncode}); see {reader.log_path}")
        return None
    result: dict[str, Any] = json.loads(lines[-1])["result"]
    return result


def run_demo(args: DemoFlags) -> int:
    from mxref.bench.raw import raw_read

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="mxref-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    model = ["--tensors", str(args.tensors), "--tensor-mib", str(args.tensor_mib),
             "--transport", args.transport, "--accelerator", args.accelerator]
    total = int(args.tensors * args.tensor_mib * (1 << 20))
    children: list[Child] = []
    with Process(args.name, "demo", args.events or str(workdir / "demo.events.jsonl"), None,
                 ProcessMetrics("demo")) as proc:
        try:
            server = Child(workdir, "server", "server", "--heartbeat-timeout", "5", "--reaper-interval", "1")
            children.append(server)
            port = server.wait_event("listening", STARTUP_TIMEOUT_S, what="grpc")["port"]
            addr = f"127.0.0.1:{port}"
            source = Child(workdir, "source", "source", "--server", addr, "--heartbeat-interval", "1", *model)
            children.append(source)
            source.wait_event("status_change", STARTUP_TIMEOUT_S, status="READY")
            result = _read_once(workdir, children, "reader", addr, model)
            if result is None:
                return proc.finish(EXIT_LOAD_FAILED)
            chunked: dict[str, list[float]] = {"single": [], "chunked": []}
            for i in range(args.compare_chunked_runs):  # interleaved, so drift hits both alike
                for mode, extra in (("single", ["--read-chunk-mib", "0"]), ("chunked", ["--read-chunk-mib", str(args.chunk_mib)])):
                    again = _read_once(workdir, children, f"reader-{mode}-{i}", addr, model + extra)
                    if again is not None:
                        chunked[mode].append(again["gbps"])
            rates = [] if args.no_baseline else raw_read(total, repeat=4)
            raw = statistics.median(rates[1:]) if rates else 0.0
            if rates:
                proc.emit("raw_read", bytes=total, seconds=round(total / raw / 1e9, 6), gbps=round(raw, 3))
        finally:
            codes = {c.name: c.stop() for c in reversed(children)}
        mxref_gbps = result["gbps"]
        print(json.dumps({"result": result}))
        print()
        print(f"reader: path={result['path']} source={result['source']} integrity={result['integrity']} "
              f"attempts={len(result['attempts'])}")
        print(f"moved {result['bytes'] / 2**20:.0f} MiB in {result['transfer_seconds']:.3f}s READ "
              f"({mxref_gbps:.2f} GB/s); whole load {result['seconds']:.3f}s")
        if rates:
            # mxref's reader makes one READ on a fresh agent and connection: compare it with the
            # raw baseline's first (cold) READ; the warm median shows what the link does after.
            cold = rates[0]
            print(f"raw two-process NIXL READ of the same size (host memory): cold {cold:.2f} GB/s, "
                  f"warm median {raw:.2f} GB/s ({', '.join(f'{r:.2f}' for r in rates)})")
            print(f"mxref READ / raw cold READ = {mxref_gbps / cold:.2f}; / raw warm = {mxref_gbps / raw:.2f}")
        if args.compare_chunked_runs:
            single, chunk = statistics.median(chunked["single"]), statistics.median(chunked["chunked"])
            print(f"chunked READ ({args.chunk_mib:g} MiB, 2 in flight) vs one handle, {args.compare_chunked_runs} "
                  f"interleaved loads each: {chunk:.2f} vs {single:.2f} GB/s median, ratio {chunk / single:.2f}")
        print(f"processes stopped: {codes}; logs and events in {workdir}")
        ok = result["ok"] and result["path"] == "rdma" and result["integrity"] == "verified"
        return proc.finish(EXIT_OK if ok else EXIT_LOAD_FAILED)
