"""The ``server`` process role played by the real ModelExpress server: its launcher and observer.

``python -m harness.subjects.mx_serverd --name N --events PATH --binary BIN --redis-url URL
--dir DIR [--host H] [--port P] [--heartbeat-timeout-s S ...]`` starts ``modelexpress-server``
as its child (the same session, so a group signal of a fault reaches both; the child also dies
with it) with ``MX_METADATA_BACKEND=redis``, ``REDIS_URL`` and the timers as
``MX_*_SECS``, on ``--port`` (0: a free one, retried when another program takes it first) and a
free metrics port, its cache folder in ``--dir``. It reports the server as mxref's server
reports itself, in the same events file format, so the harness's waits, scrapes and checks
read it unchanged:

- ``started`` (its argv, version, the settings, and in ``timers`` what the scenario asked, what
  was rounded up to whole seconds and what could not be staged), ``store`` once the server says
  it connected, ``listening what=grpc`` once its port accepts connections, ``listening
  what=metrics`` (so the harness scrapes its ``/metrics``), ``exit`` with its code.
- From its log (text: 0.7.0 accepts ``--log-format json`` but its logger ignores the setting;
  ``LogTranslator`` parses tracing's text lines, at debug for ``p2p`` so each status update is
  logged): ``source_published`` per ``PublishMetadata`` line (its stored status read back from
  Redis), ``source_status`` per change of a worker's status (``Updated status ... -> N``),
  ``source_deleted by=reaper`` for each STALE worker whose record is gone after a reaper pass
  that says it garbage-collected some. After each reaper pass every known worker's status is
  read back from Redis and noted: with several servers over one store, a change made through
  another one never shows in this log, so a later line that repeats what this log last said is
  still a change when the store held something else in between.

What it cannot observe, and how it says so: the server logs a status update without saying
who made it. A STALE set when the worker's previous update is older than the heartbeat timeout
is the reaper's (only the reaper sets STALE on a silent worker); any other change is ``by=rpc``.
A record removed by anything but the reaper (a wiped store) is not reported: mxref's server
does not see that either. SIGTERM is passed on as is: ModelExpress 0.7.0 shuts down gracefully
on SIGINT only, so TERM ends it at once, as it would in a pod.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from harness.wrapped import dies_with, forward_signals
from mxref.events import EventLog

__all__ = ["LogLine", "LogTranslator", "StoreProbe", "main", "parse_line", "server_env"]

DEFAULT_HEARTBEAT_TIMEOUT_S = 90.0  # the server's own, when the scenario sets none
READY_TIMEOUT_S = 20.0  # its port accepting connections (it connects to Redis first, bounded by itself)
PORT_TRIES = 5
STATUS_NAMES = {0: "UNKNOWN", 1: "INITIALIZING", 2: "READY", 3: "STALE"}
# tracing's text format: "2026-12-02T17:50:00.123456Z  INFO modelexpress_server::p2p::service: message"
# (spans, when a line has any, come between the level and the target: "Connection{peer=Server}: h2::...")
_LINE = re.compile(r"^(?P<ts>\S+)\s+(?P<level>TRACE|DEBUG|INFO|WARN|ERROR)\s+(?:[^\s:{}]*\{[^{}]*\}:\s*)*"
                   r"(?P<target>\w+(?:::\w+)*):\s(?P<message>.*)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_PUBLISHED = re.compile(r"^PublishMetadata: model='(?P<model>.*)' source_id=(?P<sid>\S+) worker_id=(?P<wid>\S+) "
                        r"worker_rank=(?P<rank>\d+) tensors=(?P<tensors>\d+)$")
_STATUS = re.compile(r"^Updated status for source '(?P<sid>[^']*)' worker '(?P<wid>[^']*)' rank (?P<rank>\d+) -> (?P<status>\d+)$")
_REAPED = re.compile(r"^Reaper: marked (?P<stale>\d+) stale, garbage-collected (?P<gc>\d+)$")
_SCANNED = re.compile(r"^Reaper: no action needed \((?P<workers>\d+) workers scanned\)$")
_CONNECTED = re.compile(r"^P2P state manager connected \(backend: (?P<backend>.*)\)$")
_REAPER_STARTED = re.compile(r"^Reaper started \((?P<settings>.*)\)$")


@dataclass(frozen=True)
class LogLine:
    level: str
    target: str
    message: str


def parse_line(text: str) -> LogLine | None:
    """One line of the server's log, or None when it is not a tracing line (a panic's, a continuation)."""
    match = _LINE.match(_ANSI.sub("", text).rstrip("\r\n"))
    if match is None:
        return None
    return LogLine(match["level"], match["target"], match["message"])


class StoreProbe:
    """Read-only questions to the server's Redis (a failed one answers None: never fatal)."""

    def __init__(self, url: str) -> None:
        # late: redis only for a server on a Redis store
        import redis

        self._client = redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)

    def published_status(self, sid: str, wid: str, rank: int) -> str | None:
        """The status in the record a publish wrote (the publisher's, often INITIALIZING)."""
        return self._status(sid, wid, str(rank))

    def stored_status(self, sid: str, wid: str, rank: int) -> str | None:
        """The status the store holds now: the rank's summary, which heartbeats rewrite."""
        return self._status(sid, wid, f"status:{rank}", str(rank))

    def _status(self, sid: str, wid: str, *fields: str) -> str | None:
        """The status in the first of ``fields`` of the worker's hash that is set."""
        try:
            raw = next((v for v in self._client.hmget(f"mx:source:{sid}:{wid}", list(fields)) if v), None)
            record = json.loads(raw) if raw else None
        except Exception:  # noqa: BLE001 - an observer's question; the answer is "unknown"
            return None
        if not isinstance(record, dict):
            return None
        return STATUS_NAMES.get(int(record.get("status", 0) or 0), "UNKNOWN")

    def exists(self, sid: str, wid: str) -> bool | None:
        try:
            return bool(self._client.exists(f"mx:source:{sid}:{wid}"))
        except Exception:  # noqa: BLE001
            return None


@dataclass
class _Worker:
    status: str
    last_update: float  # monotonic seconds of its last status update (or publish)
    rank: int = 0
    elsewhere: str | None = None  # the store's status after a reaper pass, when it differs from ``status``


@dataclass
class LogTranslator:
    """Server log lines -> mxref server events (pure but for ``probe`` and ``clock``).

    ``emit(event, **fields)`` writes one event; ``heartbeat_timeout_s`` decides who set a
    STALE (module docstring)."""

    emit: Callable[..., Any]
    heartbeat_timeout_s: float
    probe: StoreProbe | None = None
    clock: Callable[[], float] = time.monotonic
    workers: dict[tuple[str, str], _Worker] = field(default_factory=dict)
    connected: bool = False

    def feed(self, text: str) -> None:
        line = parse_line(text)
        if line is None:
            return
        message = line.message
        if (m := _PUBLISHED.match(message)) is not None:
            self._published(m["sid"], m["wid"], int(m["rank"]))
        elif (m := _STATUS.match(message)) is not None:
            self._status(m["sid"], m["wid"], int(m["rank"]), STATUS_NAMES.get(int(m["status"]), "UNKNOWN"))
        elif (m := _REAPED.match(message)) is not None:
            if int(m["gc"]) > 0:
                self._collected()
            self._refresh()
        elif _SCANNED.match(message) is not None:
            self._refresh()
        elif (m := _CONNECTED.match(message)) is not None and not self.connected:
            self.connected = True
            self.emit("store", url=m["backend"], reachable=True)

    def _published(self, sid: str, wid: str, rank: int) -> None:
        status = self.probe.published_status(sid, wid, rank) if self.probe is not None else None
        self.workers[(sid, wid)] = _Worker(status or "UNKNOWN", self.clock(), rank)
        fields: dict[str, Any] = {"mx_source_id": sid, "worker_id": wid, "worker_rank": rank}
        if status is not None:
            fields["status"] = status
        self.emit("source_published", **fields)

    def _status(self, sid: str, wid: str, rank: int, status: str) -> None:
        now = self.clock()
        worker = self.workers.get((sid, wid))
        previous = worker.status if worker is not None else "UNKNOWN"
        if status == previous and worker is not None and worker.elsewhere not in (None, status):
            previous = worker.elsewhere  # changed through another server since this log last said
        silent = worker is not None and now - worker.last_update > self.heartbeat_timeout_s
        self.workers[(sid, wid)] = _Worker(status, now, rank)
        if status == previous:
            return  # a heartbeat: mxref's server reports changes only
        by = "reaper" if status == "STALE" and silent else "rpc"
        self.emit("source_status", mx_source_id=sid, worker_id=wid, status=status, previous=previous, by=by)

    def _refresh(self) -> None:
        """After each reaper pass, note each known worker's status as the store holds it when it
        differs from what this log last said: another server over the same store may have
        changed it (a source heartbeating through a replica this log never shows). A later line
        of this server's that repeats the old status is then a change from the store's. Only
        noted, never emitted, and never taken over a line's own status: the store may already
        hold what a line this log has not yet been read to says."""
        if self.probe is None:
            return
        for worker_key, worker in self.workers.items():
            stored = self.probe.stored_status(*worker_key, worker.rank)
            worker.elsewhere = stored if stored != worker.status else None

    def _collected(self) -> None:
        if self.probe is None:
            return
        for (sid, wid), worker in list(self.workers.items()):
            if worker.status == "STALE" and self.probe.exists(sid, wid) is False:
                del self.workers[(sid, wid)]
                self.emit("source_deleted", mx_source_id=sid, worker_id=wid, by="reaper")


def server_env(base: dict[str, str], redis_url: str, timers: dict[str, int]) -> dict[str, str]:
    """The binary's environment: the Redis backend, the timers, no colours. ``RUST_LOG`` asks for
    info with ``p2p`` at debug, but 0.7.0 ignores it (its logger's ``--log-level`` replaces the
    environment's filter), so ``--log-level debug`` logs every crate at debug (h2 frames too):
    the price of seeing each status update."""
    env = dict(base)
    env.update({
        "MX_METADATA_BACKEND": "redis",
        "REDIS_URL": redis_url,
        "RUST_LOG": "info,modelexpress_server::p2p=debug",
        "NO_COLOR": "1",
    })
    names = {"heartbeat_timeout_s": "MX_HEARTBEAT_TIMEOUT_SECS", "reaper_interval_s": "MX_REAPER_SCAN_INTERVAL_SECS",
             "gc_timeout_s": "MX_GC_TIMEOUT_SECS"}
    for key, value in timers.items():
        env[names[key]] = str(value)
    return env


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _pump(stdout: IO[bytes], translator: LogTranslator) -> threading.Thread:
    """Copy the server's log to ours (the process log) and translate each line, until it ends."""

    def run() -> None:
        for raw in stdout:
            text = raw.decode("utf-8", "replace")
            sys.stdout.write(text)
            sys.stdout.flush()
            try:
                translator.feed(text)
            except Exception as exc:  # noqa: BLE001 - an unreadable line must not stop the log
                print(f"harness.subjects.mx_serverd: could not read {text!r}: {exc}", file=sys.stderr, flush=True)

    thread = threading.Thread(target=run, name="mx-server-log", daemon=True)
    thread.start()
    return thread


def _start(args: argparse.Namespace, env: dict[str, str], metrics_port: int,
           translator: LogTranslator) -> tuple[subprocess.Popen[bytes], int, threading.Thread]:
    """The server on ``--port`` (0: a free one, up to PORT_TRIES), once it accepts connections;
    its log is read from the start (a full pipe would stall it)."""
    tries = PORT_TRIES if args.port == 0 else 1
    last = ""
    for _ in range(tries):
        port = args.port or _free_port(args.host)
        argv = [args.binary, "--host", args.host, "--port", str(port), "--metrics-port", str(metrics_port),
                "--cache-directory", str(Path(args.dir) / "cache"), "--log-level", "debug"]
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, preexec_fn=dies_with(os.getpid()))  # no other thread runs yet
        assert proc.stdout is not None
        pump = _pump(proc.stdout, translator)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            if _accepts(args.host, port):
                return proc, port, pump
            time.sleep(0.05)
        last = f"exited with {proc.poll()}" if proc.poll() is not None else f"not accepting after {READY_TIMEOUT_S:g}s"
        if proc.poll() is None:
            proc.kill()
        proc.wait(5)
        pump.join(timeout=5)
    raise RuntimeError(f"{args.binary} on {args.host}:{args.port or 'a free port'}: {last} ({tries} tries; its log is above)")


def main(argv: list[str] | None = None) -> int:
    """The role's process (module docstring); exits with the server's code (0 for TERM/INT)."""
    parser = argparse.ArgumentParser(prog="python -m harness.subjects.mx_serverd", description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="server")
    parser.add_argument("--events", default=None)
    parser.add_argument("--binary", required=True)
    parser.add_argument("--version", default="")
    parser.add_argument("--host", default="127.0.0.1", help="gRPC and /metrics bind here")
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--dir", required=True, help="the server's cache folder goes here")
    parser.add_argument("--heartbeat-timeout-s", type=int, default=None)
    parser.add_argument("--reaper-interval-s", type=int, default=None)
    parser.add_argument("--gc-timeout-s", type=int, default=None)
    parser.add_argument("--rounded", action="append", default=[], help="a timer rounded up (recorded)")
    parser.add_argument("--not-staged", action="append", default=[], help="an option not staged (recorded)")
    args = parser.parse_args(argv)
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    timers = {k: v for k, v in (("heartbeat_timeout_s", args.heartbeat_timeout_s),
                                ("reaper_interval_s", args.reaper_interval_s), ("gc_timeout_s", args.gc_timeout_s))
              if v is not None}
    env = server_env(dict(os.environ), args.redis_url, timers)
    events = EventLog(args.events, args.name, "server")
    events.emit("started", argv=sys.argv, version=f"modelexpress-server {args.version}",
                env={k: env[k] for k in sorted(env) if k.startswith("MX_") or k in ("REDIS_URL", "RUST_LOG")},
                timers={"settings": timers, "rounded_up": args.rounded, "not_staged": args.not_staged,
                        "defaults": "a timer not set is the server's own (scan 30s, heartbeat timeout 90s, gc 3600s)"})
    try:
        probe: StoreProbe | None = StoreProbe(args.redis_url)
    except Exception:  # noqa: BLE001 - no observer: the events that need it are left out
        probe = None
    translator = LogTranslator(events.emit, float(timers.get("heartbeat_timeout_s", DEFAULT_HEARTBEAT_TIMEOUT_S)), probe)
    metrics_port = _free_port(args.host)
    try:
        proc, port, pump = _start(args, env, metrics_port, translator)
    except (RuntimeError, OSError) as exc:
        print(f"harness.subjects.mx_serverd: {exc}", file=sys.stderr, flush=True)
        events.emit("exit", code=3, error=str(exc))
        return 3

    forward_signals(proc)
    events.emit("listening", what="grpc", port=port, endpoint=f"{args.host}:{port}")
    events.emit("listening", what="metrics", port=metrics_port, endpoint=f"{args.host}:{metrics_port}")
    code = proc.wait()
    pump.join(timeout=5)
    events.emit("exit", code=code)
    events.close()
    return 0 if code in (0, -signal.SIGTERM, -signal.SIGINT) else (code if code > 0 else 128 - code)


if __name__ == "__main__":
    sys.exit(main())
