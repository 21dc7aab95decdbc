"""``mxref reader --load-loop`` (mxref.roles.load_loop) with a stand-in reader: a load per ``load``
line, each result printed with its count and given back before the next; an unknown command is
answered, not fatal; ``quit``, the end of input or a stop end it; a planted leak leaks once per load
with that load's agent (mxref.debug_hooks.PlantedLeak)."""

from __future__ import annotations

import io
import json
import os
import threading
from typing import Any

import pytest

from mxref.debug_hooks import PlantedLeak
from mxref.roles.load_loop import load_loop
from mxref.roles.reader import LoadResult


class FakeManager:
    def __init__(self, n: int) -> None:
        self.agent = f"agent-{n}"


class FakeReader:
    def __init__(self) -> None:
        self.loads = 0
        self.dropped = 0
        self.manager: FakeManager | None = None
        self.settled: list[float] = []
        self.calls: list[str] = []  # load / drop / prepare, in order

    def load(self) -> LoadResult:
        self.calls.append("load")
        self.loads += 1
        self.manager = FakeManager(self.loads)
        return LoadResult(path="rdma", ok=True, integrity="verified", bytes=1024)

    def settle(self, seconds: float, stop: threading.Event) -> None:
        self.settled.append(seconds)

    def drop_load(self) -> None:
        assert self.manager is not None, "given back twice"
        self.calls.append("drop")
        self.dropped += 1
        self.manager = None

    def prepare_next(self) -> None:
        self.calls.append("prepare")

    def await_prepared(self) -> float:
        self.calls.append("await")
        return 0.0


def lines_of(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_a_load_per_line_each_given_back_and_quit_ends_it() -> None:
    reader, out = FakeReader(), io.StringIO()
    n = load_loop(reader, ["load\n", "bogus\n", "load\n", "quit\n", "load\n"], out, threading.Event())  # type: ignore[arg-type]
    assert (n, reader.loads, reader.dropped) == (2, 2, 2)
    docs = lines_of(out)
    assert docs[0] == {"ready": {"loop": True, "idle": True}}
    assert "unknown command 'bogus'" in docs[3]["error"]
    assert [d["n"] for d in docs if "result" in d] == [1, 2] and docs[1]["result"]["ok"] is True
    # each load given back, the next one's target made ahead (as a fresh reader's during its start-up),
    # and only then "idle": a sample after it sees the reader as it will start its next load
    assert reader.calls == ["load", "drop", "prepare", "await", "load", "drop", "prepare", "await"]
    assert [d["idle"]["n"] for d in docs if "idle" in d] == [1, 2]
    assert [next(iter(d)) for d in docs] == ["ready", "result", "idle", "error", "result", "idle"]


def test_a_stop_ends_it_before_the_next_load() -> None:
    reader, stop = FakeReader(), threading.Event()
    stop.set()
    assert load_loop(reader, ["load\n"], io.StringIO(), stop) == 0 and reader.loads == 0  # type: ignore[arg-type]


class RecordingAgent:
    def __init__(self) -> None:
        self.registered: list[tuple[Any, str]] = []

    def register_memory(self, descs: Any, mem_type: str) -> str:
        self.registered.append((descs, mem_type))
        return "reg"


def test_a_planted_leak_leaks_once_per_load() -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    leak = PlantedLeak("fd", lambda name, **fields: events.append((name, fields)))
    before = len(os.listdir("/proc/self/fd"))
    reader = FakeReader()
    load_loop(reader, ["load\n"] * 3, io.StringIO(), threading.Event(), leak=leak)  # type: ignore[arg-type]
    try:
        assert len(os.listdir("/proc/self/fd")) - before == 3
        assert events == [("debug_leak", {"kind": "fd", "leaked": k}) for k in (1, 2, 3)]
    finally:
        for fd in leak._kept:
            os.close(fd)


def test_a_registration_leak_registers_a_page_with_the_load_s_agent() -> None:
    agent = RecordingAgent()
    leak = PlantedLeak("registration", lambda *_a, **_k: None)
    leak.leak(agent)
    leak.leak(None)  # a load without an agent (from disk): nothing to register with
    [(descs, mem_type)] = agent.registered
    assert mem_type == "DRAM" and int(descs[0][1]) == PlantedLeak.PAGE


def test_an_unknown_leak_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="--debug-leak 'socket'"):
        PlantedLeak("socket", lambda *_a, **_k: None)
