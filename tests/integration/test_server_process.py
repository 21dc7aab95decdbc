"""The metadata server as a real process: events, gRPC, reaper, /metrics, SIGTERM.

Runs ``python -m mxref server`` with timers compressed from 90 s / 30 s / 3600 s to 2 s / 0.5 s /
4 s, and pins that a worker whose heartbeats stop is demoted to STALE by the
reaper (not earlier than the heartbeat timeout), then deleted, and that SIGTERM
ends the process with exit code 0 and an ``exit`` event.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mxref.metadata.transport import GRPC_IMPLS
from mxref.metrics import ReaderMetrics, ServerMetrics
from mxref.process import EXIT_STARTUP_FAILED
from mxref.roles.client import MxClient
from mxref.v1 import p2p_pb2

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
HEARTBEAT_TIMEOUT_S = 2.0
REAPER_INTERVAL_S = 0.5
GC_TIMEOUT_S = 4.0
START_TIMEOUT_S = 20.0
# The reaper notices at most one scan interval late; allow generous scheduling slack.
REAP_SLACK_S = REAPER_INTERVAL_S + 3.0
STOP_TIMEOUT_S = 10.0
READY = p2p_pb2.SOURCE_STATUS_READY
STALE = p2p_pb2.SOURCE_STATUS_STALE
Event = dict[str, Any]


def server_argv(*flags: str) -> list[str]:
    return [sys.executable, "-m", "mxref", "server", *flags]


class ServerProcess:
    def __init__(self, tmp_path: Path, *flags: str) -> None:
        self.events_path = tmp_path / "server.events.jsonl"
        self.log_path = tmp_path / "server.log"
        argv = server_argv("--name", "server", "--events", str(self.events_path), *flags)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)

    def events(self) -> list[Event]:
        if not self.events_path.exists():
            return []
        return [json.loads(line) for line in self.events_path.read_text().splitlines() if line.strip()]

    def wait_for(self, what: str, predicate: Callable[[Event], bool], timeout_s: float) -> Event:
        deadline = time.monotonic() + timeout_s
        while True:
            for event in self.events():
                if predicate(event):
                    return event
            if self.proc.poll() is not None and not any(predicate(e) for e in self.events()):
                pytest.fail(f"server exited ({self.proc.returncode}) before {what}:\n{self.log_path.read_text()}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} within {timeout_s}s:\n{self.log_path.read_text()}")
            time.sleep(0.05)

    def listening(self, what: str) -> int:
        event = self.wait_for(
            f"listening {what}", lambda e: e["event"] == "listening" and e["what"] == what, START_TIMEOUT_S
        )
        return int(event["port"])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    started: list[ServerProcess] = []

    def start(*flags: str) -> ServerProcess:
        server = ServerProcess(tmp_path, *flags)
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            server.kill()


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_server_metrics_are_the_server_families_only(launch: Callable[..., ServerProcess]) -> None:
    server = launch("--port", "0", "--metrics-port", "0")
    port = server.listening("metrics")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    served = {family.name for family in text_string_to_metric_families(text)}
    assert served == ServerMetrics().family_names()
    reader_and_source = ReaderMetrics(serve_after_load=True).family_names() - {"mx_build_info"}
    assert served & reader_and_source == set()
    assert "mxref_data_plane_healthy" not in served
    assert not [name for name in served if name.endswith("_created")]


@pytest.mark.parametrize("grpc_impl", GRPC_IMPLS)
def test_reaper_demotes_then_deletes_a_silent_worker_and_sigterm_exits_0(
    launch: Callable[..., ServerProcess], grpc_impl: str,
) -> None:
    server = launch(
        "--port", "0", "--metrics-port", "0", "--grpc-impl", grpc_impl,
        "--heartbeat-timeout", str(HEARTBEAT_TIMEOUT_S),
        "--reaper-interval", str(REAPER_INTERVAL_S),
        "--gc-timeout", str(GC_TIMEOUT_S),
    )
    grpc_port = server.listening("grpc")
    metrics_port = server.listening("metrics")
    identity = p2p_pb2.SourceIdentity(mx_version="0.1.0", model_name="acme/tiny", dtype="float16")
    worker = p2p_pb2.WorkerMetadata(worker_rank=0, worker_grpc_endpoint="127.0.0.1:6555", accelerator="cpu")

    with MxClient(f"127.0.0.1:{grpc_port}", timeout_s=5) as client:
        published = client.publish_metadata(identity, worker, "w1")
        assert published.success, published.message
        sid = published.mx_source_id
        for _ in range(3):  # heartbeats a little faster than the timeout keep it READY
            assert client.update_status(sid, "w1", 0, READY).success
            time.sleep(HEARTBEAT_TIMEOUT_S / 4)
        assert [r.worker_id for r in client.list_sources(identity, status_filter=READY)] == ["w1"]
        last_heartbeat = time.monotonic()
        assert client.update_status(sid, "w1", 0, READY).success

        stale = server.wait_for(
            "STALE by the reaper",
            lambda e: e["event"] == "source_status" and e["by"] == "reaper" and e["status"] == "STALE",
            HEARTBEAT_TIMEOUT_S + REAP_SLACK_S,
        )
        # Both clocks are CLOCK_MONOTONIC; 0.1 s covers the client call's own latency.
        assert stale["mono"] - last_heartbeat >= HEARTBEAT_TIMEOUT_S - 0.1
        assert (stale["worker_id"], stale["previous"]) == ("w1", "READY")
        got = client.get_metadata(sid, "w1")
        assert got.found and got.worker.status == STALE
        assert client.list_sources(identity, status_filter=READY) == []

        server.wait_for(
            "source_deleted", lambda e: e["event"] == "source_deleted" and e["worker_id"] == "w1",
            GC_TIMEOUT_S + REAP_SLACK_S,
        )
        assert client.get_metadata(sid, "w1").found is False
        assert client.update_status(sid, "w1", 0, READY).success is False

    samples = scrape(metrics_port)
    assert samples[("mxref_server_rpcs_total", (("method", "PublishMetadata"), ("result", "ok")))] == 1
    assert samples[("mxref_server_rpcs_total", (("method", "UpdateStatus"), ("result", "ok")))] == 4
    assert samples[("mxref_server_rpcs_total", (("method", "UpdateStatus"), ("result", "rejected")))] == 1
    assert samples[("mxref_server_reaper_actions_total", (("action", "mark_stale"),))] == 1
    assert samples[("mxref_server_reaper_actions_total", (("action", "delete"),))] == 1
    assert all(samples[("mxref_server_sources", (("status", s),))] == 0 for s in ("READY", "STALE"))

    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=STOP_TIMEOUT_S) == 0
    names = [e["event"] for e in server.events()]
    assert names[0] == "started"
    assert names[-3:] == ["signal", "shutdown_step", "exit"]
    assert server.events()[-1]["code"] == 0
    assert server.events()[-2]["step"] == "stop_server"
    published_events = [e for e in server.events() if e["event"] == "source_published"]
    assert [(e["worker_id"], e["status"]) for e in published_events] == [("w1", "INITIALIZING")]


@pytest.mark.parametrize("grpc_impl", GRPC_IMPLS)
def test_port_in_use_exits_3_with_an_exit_event(launch: Callable[..., ServerProcess], grpc_impl: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = launch("--port", str(port), "--metrics-port", "0", "--grpc-impl", grpc_impl)
        assert server.proc.wait(timeout=START_TIMEOUT_S) == EXIT_STARTUP_FAILED
    [exit_event] = [e for e in server.events() if e["event"] == "exit"]
    assert exit_event["code"] == EXIT_STARTUP_FAILED
    assert f"cannot bind 127.0.0.1:{port}" in exit_event["error"]


def test_bad_timer_flag_is_a_usage_error(launch: Callable[..., ServerProcess]) -> None:
    server = launch("--heartbeat-timeout", "0")
    assert server.proc.wait(timeout=START_TIMEOUT_S) == 2
    assert "not a finite duration > 0" in server.log_path.read_text()


def test_metrics_port_in_use_exits_3_with_an_exit_event(launch: Callable[..., ServerProcess]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = launch("--port", "0", "--metrics-port", str(port))
        assert server.proc.wait(timeout=START_TIMEOUT_S) == EXIT_STARTUP_FAILED
    exit_event = server.events()[-1]
    assert exit_event["event"] == "exit" and exit_event["code"] == EXIT_STARTUP_FAILED
    assert f"metrics: cannot bind 127.0.0.1:{port}" in exit_event["error"]
