"""A reported port found open after a run: a leak of the run's, or free again and taken by a run
beside it (another matrix lane, another test worker)? The leak scan asks who listens on it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from harness.engine.processes import _held_by_other_runs
from harness.hosts.base import LocalHost
from harness.machine import procscan

LISTEN = ("import socket, sys\n"
          "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
          "print(s.getsockname()[1], flush=True); sys.stdin.read()\n")


@contextmanager
def _listener(run_id: str | None) -> Iterator[tuple[int, int]]:
    """A process listening on a free port, tagged with ``run_id`` as a run's processes are, this
    test its live harness (an untagged harness would make it a dead run's orphan, which any
    `mxchaos cleanup` on the machine, a test beside this one's, is right to kill)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MXCHAOS_")}
    if run_id is not None:
        env[procscan.ENV_RUN_ID] = run_id
        env[procscan.ENV_HARNESS_PID] = str(os.getpid())
        env[procscan.ENV_HARNESS_START] = str(procscan.proc_start_time(os.getpid()) or "")
    with subprocess.Popen([sys.executable, "-c", LISTEN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                          text=True) as proc:
        try:
            assert proc.stdout is not None
            port = int(proc.stdout.readline())
            yield proc.pid, port
        finally:
            proc.kill()
            proc.wait(10)


def test_listeners_names_the_process_holding_a_port_v4_and_v6() -> None:
    with _listener(None) as (pid, port):
        assert procscan.listeners(port) == {pid}
    six = socket.socket(socket.AF_INET6)
    try:
        six.bind(("::1", 0))
        six.listen()
        assert procscan.listeners(six.getsockname()[1]) == {os.getpid()}
    finally:
        six.close()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    assert procscan.listeners(port) == set()


def test_a_port_another_run_took_is_no_leak_but_one_of_this_run_or_of_no_run_is() -> None:
    host = LocalHost()
    with _listener("run-beside") as (pid, port):
        assert _held_by_other_runs(host, port, "run-mine") == [{"pid": pid, "run_id": "run-beside", "proc": None}]
        assert _held_by_other_runs(host, port, "run-beside") == []  # the run's own listener: a leak
    with _listener(None) as (_pid, port):
        assert _held_by_other_runs(host, port, "run-mine") == []  # held by no run: still counted as open
