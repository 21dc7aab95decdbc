"""The harness's client view (``harness.engine.observer``) against a real mxref server, on both wires.

A real server and a real source: the observer's own ListSources and GetMetadata offer the source
(with its metadata) over ``mxref.v1`` and over ``model_express.p2p`` (which the mxref server also
serves); once the source is SIGKILLed and its heartbeat timeout has passed, neither offers it.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from procs import Cluster

from harness.engine.observer import WIRES, ListingObserver
from harness.record.timeline import Timeline

pytestmark = [pytest.mark.integration]


def _observe(observer: ListingObserver, server: Any, port: int, wire: str) -> dict[str, Any]:
    address = f"127.0.0.1:{port}"
    channel = observer._channels.get(address, (observer._channel(address), wire))[0]
    observer._channels[address] = (channel, wire)
    observer.observe_one(server, port)
    entry = observer.timeline.entries()[-1]
    assert entry.f == "observed" and entry.actor == "server"
    return dict(entry.value)


def test_the_observer_is_offered_what_a_reader_is_on_both_wires(tmp_path: Path) -> None:
    with Cluster(tmp_path / "cluster") as c:
        c.start_server(heartbeat_timeout=2.0, reaper_interval=30.0)
        source = c.start_source("source-1")
        port = int(str(c.server_address).rsplit(":", 1)[1])
        server = SimpleNamespace(name="server", role="server", host=SimpleNamespace(address="127.0.0.1"),
                                 ports={"grpc": port})
        observer = ListingObserver(cast(Any, SimpleNamespace(live=lambda: [server])), Timeline())
        try:
            for wire in WIRES:
                seen = _observe(observer, server, port, wire)
                assert seen["ok"] and seen["wire"] == wire, seen
                assert [(o["worker_id"], o["metadata"]) for o in seen["offered"]] == [(source.info["worker_id"], True)]
            c.kill(source)
            time.sleep(2.5)  # past the heartbeat timeout; the reaper scans only every 30 s
            for wire in WIRES:
                seen = _observe(observer, server, port, wire)
                assert seen["ok"] and seen["offered"] == [], seen
        finally:
            observer.stop()
