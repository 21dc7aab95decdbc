"""The metadata server's native gRPC (``mxref.native_grpc`` over ``mxref_native``), over real
loopback gRPC: what it does differently from grpcio, by design. (Everything else runs on both
implementations in ``test_server.py`` and ``test_mx_service.py``.)"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest

from mxref import config, native_grpc, security
from mxref.config import ServerLimits, ServerTimers
from mxref.errors import LocalError
from mxref.metrics import ServerMetrics
from mxref.request_limits import RejectReason
from mxref.server import P2pServicer, Store, start_metadata_server
from mxref.v1 import p2p_pb2
from mxref.worker_server import REASON_METADATA_KEY

TIMERS = ServerTimers(heartbeat_timeout_s=90, reaper_scan_interval_s=30, gc_timeout_s=3600)
HOLD_S = 2.0  # long against a listing on an idle loopback server (a few ms), so the order is certain


@dataclass
class Native:
    server: native_grpc.NativeMetadataServer
    address: str


@pytest.fixture
def native() -> Iterator[Native]:
    servicer = P2pServicer(Store(), TIMERS, metrics=ServerMetrics().server,
                           limits=ServerLimits(publish_rate_per_s=1, publish_burst=1), rate_limit_delay_s=HOLD_S)
    server, port = start_metadata_server(servicer, "127.0.0.1", 0, grpc_impl="native")
    assert isinstance(server, native_grpc.NativeMetadataServer)
    try:
        yield Native(server, f"127.0.0.1:{port}")
    finally:
        assert server.stop(1).wait(5)


def own_channel(address: str) -> grpc.Channel:
    """A channel on a connection of its own (a process's channels otherwise share one)."""
    return grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])


def call(channel: grpc.Channel, method: str, request: bytes, service: str = "mxref.v1.P2pService") -> grpc.Future:
    rpc = channel.unary_unary(f"/{service}/{method}", request_serializer=None, response_deserializer=None)
    return rpc.future(request, timeout=HOLD_S + 10)


def test_held_back_writes_hold_their_streams_not_the_workers(native: Native) -> None:
    """More over-rate writes than there are workers are all held back at once, each answered
    RESOURCE_EXHAUSTED with its reason after the delay; meanwhile a listing is answered."""
    update = p2p_pb2.UpdateStatusRequest(mx_source_id="s", worker_id="w", worker_rank=0,
                                         status=p2p_pb2.SOURCE_STATUS_READY).SerializeToString()
    held_count = config.MAX_STREAMS_PER_CONNECTION  # all of the writer connection's streams
    assert held_count > native_grpc.WORKERS
    with own_channel(native.address) as writer, own_channel(native.address) as reader:
        assert call(writer, "UpdateStatus", update).result()  # the burst of 1: answered at once
        started = time.monotonic()
        held = [call(writer, "UpdateStatus", update) for _ in range(held_count)]
        listing = call(reader, "ListSources", p2p_pb2.ListSourcesRequest().SerializeToString())
        listing.result()
        assert not [f for f in held if f.done()], "a held-back write was answered before the listing"
        for future in held:
            exc = future.exception(timeout=HOLD_S + 10)
            assert isinstance(exc, grpc.Call) and exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert dict(exc.trailing_metadata() or ())[REASON_METADATA_KEY] == RejectReason.RATE_LIMITED.value
        assert time.monotonic() - started >= HOLD_S


def test_an_unknown_method_is_unimplemented(native: Native) -> None:
    with grpc.insecure_channel(native.address) as channel:
        for service, method in (("mxref.v1.P2pService", "Nope"), ("model_express.p2p.P2pService", "Nope"),
                                ("other.Service", "ListSources")):
            exc = call(channel, method, b"", service=service).exception()
            assert isinstance(exc, grpc.Call) and exc.code() == grpc.StatusCode.UNIMPLEMENTED, (service, method)


def test_stop_frees_the_port_and_refuses_later_calls() -> None:
    servicer = P2pServicer(Store(), TIMERS, metrics=ServerMetrics().server)
    server, port = start_metadata_server(servicer, "127.0.0.1", 0, grpc_impl="native")
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        assert call(channel, "ListSources", b"").result() == b""
        assert server.stop(1).wait(5)
        exc = call(channel, "ListSources", b"").exception()
        assert isinstance(exc, grpc.Call) and exc.code() == grpc.StatusCode.UNAVAILABLE
    with socket.socket() as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past the closed calls' TIME_WAIT
        again.bind(("127.0.0.1", port))  # no listener left on it
        again.listen()


def test_a_port_in_use_and_tls_are_refused_naming_them() -> None:
    servicer = P2pServicer(Store(), TIMERS, metrics=ServerMetrics().server)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(LocalError, match=f"cannot bind 127.0.0.1:{port}"):
            start_metadata_server(servicer, "127.0.0.1", port, grpc_impl="native")
    tls = security.ServerCredentials(cert_pem=b"cert", key_pem=b"key")
    with pytest.raises(LocalError, match="plaintext only"):
        start_metadata_server(servicer, "127.0.0.1", 0, credentials=tls, grpc_impl="native")
    with pytest.raises(LocalError, match="must be one of grpcio, native"):
        start_metadata_server(servicer, "127.0.0.1", 0, grpc_impl="h2o")


def test_a_listing_is_taken_before_the_heartbeats_queued_ahead_of_it() -> None:
    """On the native queue, reads (ListSources, GetMetadata) go before writes: a reader's listing
    does not wait behind a fleet's heartbeats. (No workers here: the test takes the calls.)"""
    import mxref_native

    server = mxref_native.Server("127.0.0.1", 0, max_concurrent_streams=16, max_message_bytes=1 << 20)
    try:
        with own_channel(f"127.0.0.1:{server.port}") as channel:
            writes = [call(channel, "UpdateStatus", b"") for _ in range(5)]
            read = call(channel, "ListSources", b"")
            deadline = time.monotonic() + 10
            while server.queued() != (1, 5) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert server.queued() == (1, 5)
            (first,) = server.take(1, 1.0)
            assert first.method == "ListSources"
            rest = server.take(16, 1.0)
            assert [c.method for c in rest] == ["UpdateStatus"] * 5
            for taken in [first, *rest]:
                assert taken.answer(0, "", [], b"\x08\x01")
            assert read.result() == b"\x08\x01" and all(w.result() == b"\x08\x01" for w in writes)
    finally:
        assert server.stop(1)


def test_stop_refuses_the_calls_left_unanswered() -> None:
    """A call nobody takes (no workers here) does not hold the stop: after the grace it is
    dropped, and its caller is told UNAVAILABLE instead of waiting for its deadline."""
    import mxref_native

    server = mxref_native.Server("127.0.0.1", 0, max_concurrent_streams=8, max_message_bytes=1 << 20)
    with own_channel(f"127.0.0.1:{server.port}") as channel:
        waiting = call(channel, "ListSources", b"")
        deadline = time.monotonic() + 10
        while server.queued() != (1, 0) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.queued() == (1, 0)
        assert server.stop(0.2)
        exc = waiting.exception(timeout=10)
        assert isinstance(exc, grpc.Call) and exc.code() == grpc.StatusCode.UNAVAILABLE
        assert "stopped before answering" in (exc.details() or "")
    assert server.stop(0.2)  # a second stop: already stopped


def test_a_store_that_waits_on_io_gets_as_many_workers_as_grpcio_has_threads() -> None:
    from mxref.redis_store import RedisStore
    from mxref.server import SERVER_THREADS

    memory = P2pServicer(Store(), TIMERS)
    assert native_grpc.workers_for(memory) == native_grpc.WORKERS
    redis = P2pServicer(RedisStore("redis://127.0.0.1:1/0", timeout_s=0.1), TIMERS)  # never connected here
    assert native_grpc.workers_for(redis) == SERVER_THREADS > native_grpc.WORKERS


def test_the_compiled_load_counts_failures_by_grpcs_code_names() -> None:
    """``bench_fleet.native_heartbeat_load`` reports refusals under the names grpcio's load uses."""
    import argparse

    from mxref.bench_fleet import native_heartbeat_load

    servicer = P2pServicer(Store(), TIMERS, metrics=ServerMetrics().server,
                           limits=ServerLimits(publish_rate_per_s=1, publish_burst=1), rate_limit_delay_s=0.01)
    server, port = start_metadata_server(servicer, "127.0.0.1", 0, grpc_impl="native")
    try:
        args = argparse.Namespace(clients=1, window=2, seconds=0.5, rate=0.0)
        got = native_heartbeat_load(f"127.0.0.1:{port}", [("s", "w", 0)], args)
    finally:
        assert server.stop(1).wait(5)
    assert got["RESOURCE_EXHAUSTED"] > 0, got  # over the write rate
    assert got["ok"] == 0 and got["rejected"] == 1, got  # the burst's one call: an unknown worker, success=false
    assert not [k for k in got if k.startswith("status:")], got
