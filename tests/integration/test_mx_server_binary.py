"""The real ModelExpress server (``modelexpress-server`` 0.7.0, built by ``.ci/bootstrap``) on a
real redis-server, through its role process ``harness.subjects.mx_serverd``, with mxref's client
speaking ``model_express.p2p`` to it.

Pins: it starts on the Redis backend and reports ``listening`` (gRPC, metrics); mxref's client
switches to ModelExpress's package on its own; the server computes the same ``mx_source_id`` as
mxref (ModelExpress's canonical hash); publish, READY, listing and lookup work; its log becomes
``source_published``, ``source_status READY by=rpc``, then, once the heartbeats stop,
``STALE by=reaper`` and ``source_deleted by=reaper`` (GC); a refused heartbeat names the missing
rank; SIGTERM ends it (exit 0 from the role process). Skips naming what is missing.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.subjects.mx_server import server_binary
from harness.subjects.redisd import RedisServer, redis_available
from mxref.identity import mx_source_id
from mxref.roles.client import MxClient
from mxref.v1 import p2p_pb2

WAIT_S = 30.0

pytestmark = [
    pytest.mark.skipif(server_binary() is None, reason="modelexpress-server is not built (.ci/bootstrap builds it)"),
    pytest.mark.skipif(redis_available() is None, reason="redis-server is not installed"),
]


def events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_event(path: Path, event: str, **where: Any) -> dict[str, Any]:
    """The first ``event`` matching ``where`` (bounded: WAIT_S)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        for record in events(path):
            if record["event"] == event and all(record.get(k) == v for k, v in where.items()):
                return record
        time.sleep(0.1)
    raise AssertionError(f"no {event} {where} within {WAIT_S:g}s; events: {events(path)}")


class Served:
    def __init__(self, proc: subprocess.Popen[bytes], events_path: Path, log: Path) -> None:
        self.proc, self.events_path, self.log = proc, events_path, log


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    events_path, log = tmp_path / "server.events.jsonl", tmp_path / "server.log"
    with RedisServer() as store, open(log, "wb") as out:
        binary = server_binary()
        assert binary is not None
        proc = subprocess.Popen(
            [sys.executable, "-m", "harness.subjects.mx_serverd", "--name", "server", "--events", str(events_path),
             "--binary", str(binary), "--version", "0.7.0", "--redis-url", store.url, "--dir", str(tmp_path / "mx"),
             "--heartbeat-timeout-s", "2", "--reaper-interval-s", "1", "--gc-timeout-s", "2"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            yield Served(proc, events_path, log)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)


def identity() -> p2p_pb2.SourceIdentity:
    return p2p_pb2.SourceIdentity(mx_version="0.1.0", model_name="acme/model-a", backend_framework=p2p_pb2.VLLM,
                                  tensor_parallel_size=1, pipeline_parallel_size=1, dtype="float16")


def test_real_server_lifecycle_in_events(served: Served) -> None:
    grpc_port = wait_event(served.events_path, "listening", what="grpc")["port"]
    metrics_port = wait_event(served.events_path, "listening", what="metrics")["port"]
    started = wait_event(served.events_path, "started")
    assert started["env"]["MX_HEARTBEAT_TIMEOUT_SECS"] == "2" and started["env"]["MX_METADATA_BACKEND"] == "redis"
    with MxClient(f"127.0.0.1:{grpc_port}", timeout_s=5) as client:
        worker = p2p_pb2.WorkerMetadata(worker_rank=0, agent_name="agent-w1", metadata_endpoint="127.0.0.1:5555",
                                        worker_grpc_endpoint="127.0.0.1:6555", accelerator="cpu",
                                        status=p2p_pb2.SOURCE_STATUS_INITIALIZING,
                                        tensors=[p2p_pb2.TensorDescriptor(name="w", addr=4096, size=64, dtype="float16")])
        published = client.publish_metadata(identity(), worker, "w1")
        assert published.success, published.message
        assert client.wire == "model_express.p2p"  # mxref.v1 was UNIMPLEMENTED there
        sid = published.mx_source_id
        assert sid == mx_source_id(identity())  # ModelExpress's canonical hash, computed by both
        assert client.update_status(sid, "w1", 0, p2p_pb2.SOURCE_STATUS_READY).success
        listed = client.list_sources(identity=identity(), status_filter=p2p_pb2.SOURCE_STATUS_READY)
        assert [(r.worker_id, r.status) for r in listed] == [("w1", p2p_pb2.SOURCE_STATUS_READY)]
        found = client.get_metadata(sid, "w1")
        assert found.found and found.worker.agent_name == "agent-w1"
        refused = client.update_status(sid, "nobody", 0, p2p_pb2.SOURCE_STATUS_READY)
        assert not refused.success and "not found" in refused.message
    assert wait_event(served.events_path, "source_published", worker_id="w1")["status"] == "INITIALIZING"
    wait_event(served.events_path, "source_status", worker_id="w1", status="READY", by="rpc")
    # no more heartbeats: the reaper marks it STALE after the heartbeat timeout, then collects it
    wait_event(served.events_path, "source_status", worker_id="w1", status="STALE", by="reaper")
    wait_event(served.events_path, "source_deleted", worker_id="w1", by="reaper")
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
        text = response.read().decode()
    assert 'mx_grpc_requests_total{method="P2pService/PublishMetadata",outcome="ok"} 1' in text
    served.proc.send_signal(signal.SIGTERM)
    assert served.proc.wait(15) == 0
    assert events(served.events_path)[-1]["event"] == "exit"
