"""The fleet bench's heartbeat processes: a child that cannot start is reported as such (its own
error), and nothing is joined or left behind for it."""

from __future__ import annotations

import argparse
import multiprocessing.context
import threading

import pytest

from mxref.bench import fleet as bench_fleet


def test_a_client_process_that_cannot_start_raises_its_own_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: multiprocessing.process.BaseProcess) -> None:
        raise OSError("no process for you")

    monkeypatch.setattr(multiprocessing.context.SpawnProcess, "start", refuse)
    stop = threading.Event()
    args = argparse.Namespace(client_processes=2, seconds=1.0)
    with pytest.raises(OSError, match="no process for you"):
        bench_fleet.heartbeat_processes("127.0.0.1:1", [("s", "w", 0)] * 4, args, stop)
    assert stop.is_set()
