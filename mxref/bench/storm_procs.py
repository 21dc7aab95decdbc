"""The processes of a storm (``mxref.bench.storm``): line-driven children and the raw fan-out reader.

``LineChild`` is a child process told what to do by lines on its standard input and answering
with JSON lines on its standard output (other lines, e.g. NIXL's logging, are skipped). A thread
reads its output and stamps each JSON line with the bench's clock (``time.monotonic``) as it
arrives, so a storm's times are the bench's, not the readers' word. Every wait is bounded; ``stop``
ends the child (a SIGCONT first, in case it is frozen; SIGTERM, SIGKILL after a grace) and is safe
to repeat. A child stays in the bench's process group (a Ctrl-C at the terminal reaches it too)
and dies with the bench however the bench ends (``die_with_parent``, SIGKILL: it ends a
SIGSTOPped child too, which a SIGTERM would leave stopped for good).

``Freeze`` SIGSTOPs one child at a set time after a storm's go and thaws it when closed; once
closed, its timer can stop nothing more (a late timer finds it closed). ``deferred_signals``
holds SIGINT and SIGTERM back while the bench stops its children, so a second Ctrl-C cannot cut
that short.

``python -m mxref.bench.storm_procs --transport ucx-tcp`` is the raw fan-out reader: one NIXL
agent, one registered buffer, the NIXL API directly (one descriptor, one handle, tight polling),
as ``mxref.bench.raw``'s reader. Its commands:

* ``connect HOST PORT ADDR BYTES``: read from the raw source (``mxref.bench.raw --serve``) whose
  NIXL listener is HOST:PORT and whose buffer is at ADDR; fetch its metadata and prepare the
  handle, answer ``{"ready": ...}``;
* ``read``: post the READ, poll it to DONE, check both ends of the buffer against the source's
  (``numpy.arange``: zeroed before each READ), answer ``{"result": ...}`` in the shape of an
  mxref reader's result (``path``, ``integrity``, ``bytes``, ``seconds``, ``source``), prepare
  the next handle;
* ``quit`` (or end of input): release, exit.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mxref.process import die_with_parent

STOP_GRACE_S = 10.0
CHECK_WORDS = 1024  # uint64 words checked at each end of a raw READ's buffer


class LineChild:
    """A child driven by lines on stdin, answering JSON lines on stdout, stamped on arrival."""

    def __init__(self, name: str, argv: Sequence[str], log: Path, env: dict[str, str] | None = None,
                 cwd: Path | None = None, stdin_quits: bool = True) -> None:
        self.name = name
        self.stdin_quits = stdin_quits  # it exits when its input ends: stop closes that first
        self.says_idle = False  # a looping reader that says "idle" once ready for its next load (its ready line says so)
        self.log = log
        self.lines: queue.Queue[tuple[float, dict[str, Any]]] = queue.Queue()
        with open(log, "wb") as err:  # the bench's process group; SIGKILL when the bench goes, however it goes
            self.popen = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                          env=env, cwd=cwd,
                                          preexec_fn=functools.partial(die_with_parent, signal.SIGKILL, os.getpid()))
        self._reader = threading.Thread(target=self._pump, name=f"out-{name}", daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.popen.stdout is not None
        decoder = json.JSONDecoder()
        for raw in self.popen.stdout:
            stamp = time.monotonic()
            start = raw.find(b'{"')  # another writer's text may share the line (a log line of another thread)
            if start < 0:
                continue
            try:
                record, _ = decoder.raw_decode(raw[start:].decode(errors="replace"))
            except ValueError:
                continue
            if isinstance(record, dict):
                self.lines.put((stamp, record))

    def send(self, line: str) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write(line.encode() + b"\n")
        self.popen.stdin.flush()

    def expect(self, key: str, timeout_s: float) -> tuple[float, dict[str, Any]]:
        """The next JSON line holding ``key`` (others are dropped), with its arrival stamp."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{self.name}: no {key!r} line within {timeout_s:g}s; see {self.log}")
            try:
                stamp, line = self.lines.get(timeout=min(left, 0.5))
            except queue.Empty:
                if self.popen.poll() is not None and self.lines.empty():
                    raise RuntimeError(f"{self.name} exited ({self.popen.returncode}) before a {key!r} line; "
                                       f"see {self.log}") from None
                continue
            if key in line:
                return stamp, line

    def cpu_s(self) -> float:
        """The CPU seconds (user + system, all its threads) the child has used so far, from
        ``/proc/PID/stat`` (the kernel's count); 0.0 once it is gone."""
        try:
            fields = Path(f"/proc/{self.popen.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def send_signal(self, signum: int) -> None:
        """``signum`` to the child while it has not been reaped (never to a reused pid)."""
        with contextlib.suppress(ProcessLookupError):
            self.popen.send_signal(signum)

    def thaw(self) -> None:
        self.send_signal(signal.SIGCONT)

    def stop(self) -> int:
        if self.popen.poll() is None:
            self.thaw()  # a stopped child reads no end of input and acts on no SIGTERM
            try:
                if self.popen.stdin is not None:
                    self.popen.stdin.close()
            except OSError:
                pass
            try:
                self.popen.wait(2.0 if self.stdin_quits else 0.0)
            except subprocess.TimeoutExpired:
                self.send_signal(signal.SIGTERM)
                self.thaw()
                try:
                    self.popen.wait(STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    self.send_signal(signal.SIGKILL)
                    self.popen.wait(STOP_GRACE_S)
        self._reader.join(STOP_GRACE_S)
        if not self._reader.is_alive() and self.popen.stdout is not None:
            self.popen.stdout.close()  # the pump read it to its end
        return int(self.popen.returncode)


class Freeze:
    """``child`` SIGSTOPped ``after_s`` seconds after ``start`` (a timer thread), SIGCONTed by
    ``close``. ``close`` first marks it closed under the lock the timer takes to stop the child,
    so a timer that fires late stops nothing; then it cancels and joins the timer and thaws the
    child (whether or not it was stopped: a SIGCONT to a running process does nothing).
    ``landed`` says whether the freeze happened."""

    def __init__(self, child: LineChild, after_s: float) -> None:
        self.child = child
        self.after_s = after_s
        self.landed = False
        self._closed = False
        self._lock = threading.Lock()
        self._timer = threading.Timer(after_s, self._fire)
        self._timer.daemon = True

    def start(self) -> None:
        self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            if self._closed or self.child.popen.poll() is not None:
                return
            self.child.send_signal(signal.SIGSTOP)
            self.landed = True
        print(f"storm: froze {self.child.name} (pid {self.child.popen.pid}) {self.after_s:.3f}s after the go",
              flush=True)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._timer.cancel()
        if self._timer.ident is not None:  # started
            self._timer.join(STOP_GRACE_S)
        self.child.thaw()
        if self.landed:
            print(f"storm: thawed {self.child.name} (pid {self.child.popen.pid})", flush=True)


@contextlib.contextmanager
def deferred_signals(signums: Sequence[int] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[None]:
    """While entered (the main thread only), ``signums`` are noted, not acted on; on the way out
    the handlers come back and a noted one raises KeyboardInterrupt, once the block is done."""
    noted: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: noted.append(signum)) for s in signums}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if noted:
            raise KeyboardInterrupt(f"signal {noted[0]} while the storm's children were being stopped")


def raw_reader(lines: Any, out: Any, timeout_s: float = 60.0) -> int:
    """The raw fan-out reader's command loop (module docstring)."""
    import numpy as np

    from mxref.process import free_port
    from mxref.transfer.manager import import_nixl

    api = import_nixl()
    agent = api.nixl_agent(f"storm-raw-{os.getpid()}", api.nixl_agent_config(False, True, free_port(), backends=["UCX"]))
    dst: Any = None
    reg: Any = None
    local = remote = handle = None
    peer = where = ""
    nbytes = 0

    def answer(record: dict[str, Any]) -> None:
        out.write(json.dumps(record) + "\n")  # one write: a log line cannot land inside it
        out.flush()

    for line in lines:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        if cmd[0] == "connect":
            host, port, addr, nbytes = cmd[1], int(cmd[2]), int(cmd[3]), int(cmd[4])
            if handle is not None:
                agent.release_xfer_handle(handle)
            if peer:
                agent.remove_remote_agent(peer)
            if dst is None or dst.nbytes != nbytes:
                if reg is not None:
                    agent.deregister_memory(reg)
                dst = np.zeros(nbytes // 8, dtype=np.uint64)  # pages faulted in now, not in the READ
                dst.fill(0)
                reg = agent.register_memory(np.array([(dst.ctypes.data, dst.nbytes, 0)], dtype=np.uint64), "DRAM")
            peer, where = "raw-src", f"{host}:{port}"
            deadline = time.monotonic() + timeout_s
            while not agent.check_remote_metadata(peer):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"raw source {host}:{port}: no metadata within {timeout_s:g}s")
                agent.fetch_remote_metadata(peer, host, port)
                time.sleep(0.02)
            local = agent.get_xfer_descs(np.array([(dst.ctypes.data, dst.nbytes, 0)], dtype=np.uint64), "DRAM")
            remote = agent.get_xfer_descs(np.array([(addr, nbytes, 0)], dtype=np.uint64), "DRAM")
            handle = agent.initialize_xfer("READ", local, remote, peer)
            answer({"ready": {"source": f"{host}:{port}"}})
        elif cmd[0] == "read" and handle is not None:
            dst[:CHECK_WORDS] = 0
            dst[-CHECK_WORDS:] = 0
            t0 = time.perf_counter()
            deadline = time.monotonic() + timeout_s
            state = agent.transfer(handle)
            while state not in ("DONE", "ERR") and time.monotonic() < deadline:
                state = agent.check_xfer_state(handle)
            seconds = time.perf_counter() - t0
            words = nbytes // 8
            ok = (state == "DONE" and np.array_equal(dst[:CHECK_WORDS], np.arange(CHECK_WORDS, dtype=np.uint64))
                  and np.array_equal(dst[-CHECK_WORDS:], np.arange(words - CHECK_WORDS, words, dtype=np.uint64)))
            answer({"result": {"ok": ok, "path": "rdma", "integrity": "verified" if ok else "failed",
                               "bytes": nbytes if ok else 0, "seconds": round(seconds, 6), "source": where,
                               "state": state, "attempts": [{"outcome": "success" if ok else "transfer_fallback",
                                                              "error": None if ok else f"raw READ ended {state}"}]}})
            agent.release_xfer_handle(handle)
            handle = agent.initialize_xfer("READ", local, remote, peer)
        else:
            answer({"error": f"unknown command {line.strip()!r}"})
    if handle is not None:
        agent.release_xfer_handle(handle)
    if reg is not None:
        agent.deregister_memory(reg)
    return 0


@dataclass(frozen=True, kw_only=True)
class RawReaderFlags:
    """The raw fan-out reader's flags, typed (``mxref.options``)."""

    transport: str


def main(argv: list[str] | None = None) -> int:
    from mxref import config
    from mxref.options import parse

    parser = argparse.ArgumentParser(prog="python -m mxref.bench.storm_procs", description="the raw fan-out reader")
    parser.add_argument("--transport", default="ucx-tcp", choices=sorted(config.TRANSPORT_PROFILES))
    transport = parse(parser, argv, RawReaderFlags).transport
    config.apply_transport_profile(transport)
    return raw_reader(sys.stdin, sys.stdout)


if __name__ == "__main__":
    sys.exit(main())
