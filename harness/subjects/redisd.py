"""A real ``redis-server`` for a run or a test: the ``redis`` process role and its launcher.

``python -m harness.subjects.redisd --name N --events PATH [--port P] [--bind HOST] --dir DIR`` starts
``redis-server`` (the Debian package; no persistence, no protected mode, logging to stdout) as
its child on ``--port`` (0: a free port it finds, retrying when another program takes it
first), waits until it answers PING (bounded), and reports it as an mxref process would: a
``started`` event, then ``listening what=redis port=P``, then ``exit``. SIGTERM/SIGINT are
passed on to redis-server; a group signal (the ``pause``/``kill`` faults) reaches both. A
restart of the role passes its previous port again (``launch``), so the server's
``--store redis://...`` stays right. redis-server gets the wrapper's environment, run tag
included (it overwrites it with its process title, so the run's scope, ``harness.machine.runscope``, is
what finds it), and dies with the wrapper: a parent-death SIGKILL, so a SIGKILLed wrapper leaves
no redis-server behind.

``RedisServer`` is the same for tests: a context manager that starts one on a free port in a
temporary folder and always stops it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

from harness.wrapped import dies_with, forward_signals
from mxref.events import EventLog

__all__ = ["READY_TIMEOUT_S", "RedisServer", "redis_available", "redis_server_argv"]

READY_TIMEOUT_S = 10.0
STOP_GRACE_S = 5.0
BINARY = "redis-server"


def redis_available() -> str | None:
    """The path of ``redis-server``, or None when it is not installed."""
    return shutil.which(BINARY)


def redis_server_argv(port: int, bind: str, directory: Path) -> list[str]:
    """redis-server as a store nobody persists: no RDB, no AOF, in the foreground, log to stdout."""
    return [
        BINARY, "--port", str(port), "--bind", bind, "--dir", str(directory),
        "--save", "", "--appendonly", "no", "--protected-mode", "no", "--daemonize", "no",
        "--logfile", "", "--loglevel", "notice",
    ]


def _free_port(bind: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((bind, 0))
        port: int = s.getsockname()[1]
        return port


def _pings(bind: str, port: int) -> bool:
    """One bounded PING over a raw socket (no client library needed to see it is up)."""
    try:
        with socket.create_connection((bind, port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _start(port: int, bind: str, directory: Path, log: int | None) -> tuple[subprocess.Popen[bytes], int]:
    """Start redis-server on ``port`` (0: a free one, up to 5 tries) and wait for PING, bounded.

    ``RuntimeError`` naming the port and the log when it never answers.
    """
    tries = 5 if port == 0 else 1
    for _ in range(tries):
        chosen = port or _free_port(bind)
        proc = subprocess.Popen(redis_server_argv(chosen, bind, directory), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=os.environ.copy(), preexec_fn=dies_with(os.getpid()))
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            if _pings(bind, chosen):
                return proc, chosen
            time.sleep(0.05)
        _stop(proc)
    raise RuntimeError(f"redis-server did not answer PING on {bind}:{port or 'a free port'} within "
                       f"{READY_TIMEOUT_S:g}s ({tries} tries)")


def _stop(proc: subprocess.Popen[bytes]) -> int | None:
    """TERM, a grace, KILL; the exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(STOP_GRACE_S)
    return proc.returncode


class RedisServer:
    """A redis-server on a free loopback port for a test; stopped (and its folder removed) on exit."""

    def __init__(self, bind: str = "127.0.0.1") -> None:
        self.bind = bind
        self.port = 0
        self._dir = tempfile.TemporaryDirectory(prefix="mxchaos-redis-")
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.bind}:{self.port}/0"

    @property
    def pid(self) -> int:
        assert self._proc is not None, "not started"
        return self._proc.pid

    def __enter__(self) -> RedisServer:
        log = os.open(Path(self._dir.name) / "redis.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            self._proc, self.port = _start(0, self.bind, Path(self._dir.name), log)
        except BaseException:
            self._dir.cleanup()
            raise
        finally:
            os.close(log)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        try:
            if self._proc is not None:
                os.kill(self._proc.pid, signal.SIGCONT)  # a test may have paused it
                _stop(self._proc)
        finally:
            self._dir.cleanup()


def main(argv: list[str] | None = None) -> int:
    """The ``redis`` role's process (module docstring); exits with redis-server's code."""
    parser = argparse.ArgumentParser(prog="python -m harness.subjects.redisd", description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="redis")
    parser.add_argument("--events", default=None)
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    parser.add_argument("--bind", default="127.0.0.1")
    parser.add_argument("--dir", required=True, help="redis-server's working folder")
    args = parser.parse_args(argv)
    events = EventLog(args.events, args.name, "redis")
    events.emit("started", argv=sys.argv, version=BINARY, env={}, timers={})
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    try:
        proc, port = _start(args.port, args.bind, Path(args.dir), None)
    except (RuntimeError, OSError) as exc:
        print(f"harness.subjects.redisd: {exc}", file=sys.stderr, flush=True)
        events.emit("exit", code=3, error=str(exc))
        return 3

    forward_signals(proc)
    events.emit("listening", what="redis", port=port, endpoint=f"{args.bind}:{port}")
    code = proc.wait()
    events.emit("exit", code=code)
    events.close()
    return 0 if code in (0, -signal.SIGTERM) else (code if code > 0 else 128 - code)


if __name__ == "__main__":
    sys.exit(main())
