"""The fleet bench's heartbeat processes: a child that cannot start is reported as such (its own
error), and nothing is joined or left behind for it."""

from __future__ import annotations

import multiprocessing.context
import threading

import pytest

from mxref.bench import fleet as bench_fleet
from mxref.options import parse


def test_a_client_process_that_cannot_start_raises_its_own_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: multiprocessing.process.BaseProcess) -> None:
        raise OSError("no process for you")

    monkeypatch.setattr(multiprocessing.context.SpawnProcess, "start", refuse)
    stop = threading.Event()
    args = parse(bench_fleet.build_parser(), ["--client-processes", "2", "--seconds", "1"], bench_fleet.FleetFlags)
    with pytest.raises(OSError, match="no process for you"):
        bench_fleet.heartbeat_processes("127.0.0.1:1", [("s", "w", 0)] * 4, args, stop)
    assert stop.is_set()
