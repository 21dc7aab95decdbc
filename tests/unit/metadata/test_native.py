"""The metadata server's native gRPC (``mxref.metadata.native`` over ``mxref_native``), over real
loopback gRPC: what it does differently from grpcio, by design. (Everything else runs on both
implementations in ``metadata/test_servicer.py`` and ``metadata/test_modelexpress.py``.)"""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from mxref import config, pki, security
from mxref.config import ServerLimits, ServerTimers
from mxref.errors import LocalError
from mxref.metadata import modelexpress as modelexpress_module
from mxref.metadata import native as native_grpc
from mxref.metadata import servicer as servicer_module
from mxref.metadata.limits import RejectReason
from mxref.metadata.modelexpress import MX_SERVICE_NAME
from mxref.metadata.servicer import P2pServicer
from mxref.metadata.store import Store
from mxref.metadata.transport import GRPC_IMPLS, start_metadata_server
from mxref.metrics import ServerMetrics
from mxref.rpc import REASON_METADATA_KEY
from mxref.v1 import p2p_pb2

TIMERS = ServerTimers(heartbeat_timeout_s=90, reaper_scan_interval_s=30, gc_timeout_s=3600)
IDENTITY = p2p_pb2.SourceIdentity(mx_version="0.1.0", model_name="acme/tiny", dtype="float16")
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
    assert held_count > len(native_grpc.LANES)
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


def test_a_method_added_to_the_python_table_is_served_without_a_rust_change(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rust routes what ``method_table`` lists: a method added to ``RPCS`` (and its handler) is
    answered by the same compiled module, in both packages, and what is not listed stays UNIMPLEMENTED."""
    monkeypatch.setitem(servicer_module.RPCS, "Echo", servicer_module._Rpc(
        p2p_pb2.GetMetadataRequest, p2p_pb2.GetMetadataResponse, writes=False))
    monkeypatch.setattr(modelexpress_module, "MX_METHODS", (*modelexpress_module.MX_METHODS, "Echo"))
    monkeypatch.setattr(native_grpc, "MX_METHODS", modelexpress_module.MX_METHODS)
    assert ("mxref.v1.P2pService", "Echo", True) in native_grpc.method_table()
    servicer = P2pServicer(Store(), TIMERS, metrics=ServerMetrics().server)

    def echo(request: p2p_pb2.GetMetadataRequest, _call: Any) -> tuple[Any, servicer_module.Outcome]:
        return p2p_pb2.GetMetadataResponse(found=True, worker_id=f"echo:{request.worker_id}"), servicer_module.Outcome.OK

    servicer._handlers["Echo"] = echo
    server, port = start_metadata_server(servicer, "127.0.0.1", 0, grpc_impl="native")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            raw = call(channel, "Echo", p2p_pb2.GetMetadataRequest(mx_source_id="s", worker_id="w").SerializeToString())
            assert p2p_pb2.GetMetadataResponse.FromString(raw.result()).worker_id == "echo:w"
            exc = call(channel, "Echo2", b"").exception()
            assert isinstance(exc, grpc.Call) and exc.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        assert server.stop(1).wait(5)


def test_the_native_server_refuses_an_empty_or_malformed_method_table() -> None:
    import mxref_native

    for methods, words in (([], "at least one"), ([("a/b", "M", True)], "not a service and a method name")):
        with pytest.raises(ValueError, match=words):
            mxref_native.Server("127.0.0.1", 0, methods=methods, authorization_key="authorization",
                                max_concurrent_streams=8, max_message_bytes=1 << 20,
                                front_door=native_grpc.FRONT_DOOR)


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


def test_a_port_in_use_and_an_unusable_certificate_are_refused_naming_them() -> None:
    servicer = P2pServicer(Store(), TIMERS, metrics=ServerMetrics().server)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(LocalError, match=f"cannot bind 127.0.0.1:{port}"):
            start_metadata_server(servicer, "127.0.0.1", port, grpc_impl="native")
    tls = security.ServerCredentials(cert_pem=b"cert", key_pem=b"key")
    with pytest.raises(LocalError, match=r"native.*TLS certificate and key"):
        start_metadata_server(servicer, "127.0.0.1", 0, credentials=tls, grpc_impl="native")
    with pytest.raises(LocalError, match="must be one of grpcio, native"):
        start_metadata_server(servicer, "127.0.0.1", 0, grpc_impl="h2o")


def test_a_listing_is_taken_before_the_heartbeats_queued_ahead_of_it() -> None:
    """On the native queue, reads (ListSources, GetMetadata) go before writes: a reader's listing
    does not wait behind a fleet's heartbeats. (No workers here: the test takes the calls.)"""
    import mxref_native

    server = mxref_native.Server("127.0.0.1", 0, **native_grpc.routing(), max_concurrent_streams=16, max_message_bytes=1 << 20,
                                 front_door=native_grpc.FRONT_DOOR)
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


def _spin(seconds: float) -> None:
    """Hold the GIL for ``seconds`` of pure Python (a call's servicer cost, scaled up)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class _Slow:
    """A servicer whose ``slow`` method spins ``SPIN_S`` holding the GIL, its first call held
    until ``gate`` is set (so that the others queue behind it); every call answered is logged
    in order (``log``) by its method."""

    SPIN_S = 0.005

    def __init__(self, slow: str) -> None:
        self.log: list[str] = []
        self.gate = threading.Event()
        self.servicer = P2pServicer(Store(), TIMERS, metrics=ServerMetrics().server, limits=ServerLimits(
            publish_rate_per_s=1e9, publish_burst=10**9, peer_publish_rate_per_s=1e9, peer_publish_burst=10**9))
        for method in ("ListSources", "UpdateStatus"):
            handler = self.servicer._handlers[method]
            self.servicer._handlers[method] = self._logged(method, handler, method == slow)

    def _logged(self, method: str, handler: Any, slow: bool) -> Any:
        def serve(request: Any, call: Any) -> Any:
            if slow:
                self.gate.wait(10)
                _spin(self.SPIN_S)
            answer = handler(request, call) if method == "ListSources" else (
                p2p_pb2.UpdateStatusResponse(success=True), servicer_module.Outcome.OK)
            self.log.append(method)
            return answer
        return serve

    def after(self, count: int, method: str) -> int:
        """How many calls were answered after the first ``count`` and before ``method``'s first after them."""
        return self.log[count:].index(method)


def _saturate(native: native_grpc.NativeMetadataServer, slow: _Slow, method: str, request: bytes,
              calls: int, queued: int) -> tuple[list[grpc.Channel], list[grpc.Future]]:
    """``calls`` of ``method`` from connections of their own; the gate is opened once ``queued``
    of them wait in its queue (its worker held by the first)."""
    address = f"127.0.0.1:{native.port}"
    per = config.MAX_STREAMS_PER_CONNECTION
    channels = [own_channel(address) for _ in range(-(-calls // per))]
    futures = [call(channels[i // per], method, request) for i in range(calls)]
    lane = 0 if method == "ListSources" else 1
    deadline = time.monotonic() + 10
    while native._server.queued()[lane] < queued and time.monotonic() < deadline:
        time.sleep(0.001)
    assert native._server.queued()[lane] >= queued, native._server.queued()
    slow.gate.set()
    return channels, futures


def test_a_listing_is_answered_while_heartbeats_saturate_the_write_path() -> None:
    """Reads have a worker of their own and the writer yields the GIL to them: with heartbeats
    that each hold the GIL queued ahead of it, a listing is answered after at most the few
    heartbeats already under way, not after a batch of them (``TAKE_MOST``)."""
    slow = _Slow("UpdateStatus")
    native = native_grpc.NativeMetadataServer(slow.servicer, "127.0.0.1", 0)
    address = f"127.0.0.1:{native.port}"
    update = p2p_pb2.UpdateStatusRequest(mx_source_id="s", worker_id="w", status=p2p_pb2.SOURCE_STATUS_READY)
    try:
        channels, heartbeats = _saturate(native, slow, "UpdateStatus", update.SerializeToString(), 48, 24)
        with own_channel(address) as reader:
            before = len(slow.log)
            assert call(reader, "ListSources", b"").result() == b""
        assert slow.after(before, "ListSources") <= 3, slow.log
        assert native._server.queued()[1] > 0, "every heartbeat was answered before the listing"
        assert all(p2p_pb2.UpdateStatusResponse.FromString(f.result()).success for f in heartbeats)
        for channel in channels:
            channel.close()
    finally:
        assert native.stop(1).wait(5)


def test_heartbeats_are_answered_while_listings_flood_the_read_path() -> None:
    """The writer's yield is bounded: with listings that each hold the GIL queued ahead of it, a
    heartbeat is answered after at most one yield's worth of them (``TAKE_MOST``), not after the
    flood."""
    slow = _Slow("ListSources")
    native = native_grpc.NativeMetadataServer(slow.servicer, "127.0.0.1", 0)
    address = f"127.0.0.1:{native.port}"
    try:
        channels, listings = _saturate(native, slow, "ListSources", b"", 64, 40)
        update = p2p_pb2.UpdateStatusRequest(mx_source_id="s", worker_id="w", status=p2p_pb2.SOURCE_STATUS_READY)
        with own_channel(address) as writer:
            before = len(slow.log)
            assert p2p_pb2.UpdateStatusResponse.FromString(call(writer, "UpdateStatus", update.SerializeToString())
                                                           .result()).success
        assert slow.after(before, "UpdateStatus") <= native_grpc.TAKE_MOST + 2, slow.log
        assert all(f.result() == b"" for f in listings)
        for channel in channels:
            channel.close()
    finally:
        assert native.stop(1).wait(5)


def test_a_worker_takes_only_its_lane() -> None:
    """``take(lane=...)`` takes one queue's calls; a lane that is not one is refused, naming it;
    ``reads_open`` counts a read from its queuing to its answer."""
    import mxref_native

    server = mxref_native.Server("127.0.0.1", 0, **native_grpc.routing(), max_concurrent_streams=16, max_message_bytes=1 << 20,
                                 front_door=native_grpc.FRONT_DOOR)
    try:
        with own_channel(f"127.0.0.1:{server.port}") as channel:
            write = call(channel, "UpdateStatus", b"")
            read = call(channel, "ListSources", b"")
            deadline = time.monotonic() + 10
            while server.queued() != (1, 1) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert server.reads_open() == 1
            assert [c.method for c in server.take(16, 1.0, native_grpc.WRITES)] == ["UpdateStatus"]
            (taken,) = server.take(16, 1.0, native_grpc.READS)
            assert taken.method == "ListSources" and server.reads_open() == 1
            assert server.take(16, 0.01, native_grpc.READS) == []
            with pytest.raises(ValueError, match='lane "both"'):
                server.take(1, 0.0, "both")
            assert taken.answer(0, "", [], b"")
            assert server.reads_open() == 0 and not server.yield_to_reads(16, 1.0)
            assert read.result() == b""
            write.cancel()
    finally:
        assert server.stop(1)


def test_stop_refuses_the_calls_left_unanswered() -> None:
    """A call nobody takes (no workers here) does not hold the stop: after the grace it is
    dropped, and its caller is told UNAVAILABLE instead of waiting for its deadline."""
    import mxref_native

    server = mxref_native.Server("127.0.0.1", 0, **native_grpc.routing(), max_concurrent_streams=8, max_message_bytes=1 << 20,
                                 front_door=native_grpc.FRONT_DOOR)
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


def test_stop_wakes_the_workers_waiting_for_a_call() -> None:
    """An idle worker waits in ``take`` (and the refusal reporter in ``refusals``) up to its
    timeout for something to do; a stop wakes both at once, so a stopping server does not wait
    out their waits (an exiting metadata server spent 0.06-0.49 s there). 30 s waits here: were
    they waited out, the joins would time out."""
    import mxref_native

    server = mxref_native.Server("127.0.0.1", 0, **native_grpc.routing(), max_concurrent_streams=8, max_message_bytes=1 << 20,
                                 front_door=native_grpc.FRONT_DOOR)
    got: dict[str, Any] = {}
    waiters = [threading.Thread(target=lambda: got.update(take=server.take(16, 30.0, "reads")), daemon=True),
               threading.Thread(target=lambda: got.update(refusals=server.refusals(30.0)), daemon=True)]
    for waiter in waiters:
        waiter.start()
    time.sleep(0.2)  # both waiting
    assert got == {}
    assert server.stop(1.0)
    for waiter in waiters:
        waiter.join(10)
        assert not waiter.is_alive()
    assert got == {"take": None, "refusals": []}
    assert server.take(16, 30.0, None) is None  # and later ones return at once


def test_a_store_that_waits_on_io_gets_as_many_workers_as_grpcio_has_threads() -> None:
    from mxref.metadata.redis_store import RedisStore
    from mxref.metadata.servicer import SERVER_THREADS

    memory = P2pServicer(Store(), TIMERS)
    assert native_grpc.lanes_for(memory) == (native_grpc.READS, native_grpc.WRITES)
    redis = P2pServicer(RedisStore("redis://127.0.0.1:1/0", timeout_s=0.1), TIMERS)  # never connected here
    assert native_grpc.lanes_for(redis) == (None,) * SERVER_THREADS


def test_the_compiled_load_counts_failures_by_grpcs_code_names() -> None:
    """``bench_fleet.native_heartbeat_load`` reports refusals under the names grpcio's load uses."""
    from mxref.bench.fleet import FleetFlags, build_parser, native_heartbeat_load
    from mxref.options import parse

    servicer = P2pServicer(Store(), TIMERS, metrics=ServerMetrics().server,
                           limits=ServerLimits(publish_rate_per_s=1, publish_burst=1), rate_limit_delay_s=0.01)
    server, port = start_metadata_server(servicer, "127.0.0.1", 0, grpc_impl="native")
    try:
        args = parse(build_parser(), ["--clients", "1", "--window", "2", "--seconds", "0.5", "--rate", "0"], FleetFlags)
        got = native_heartbeat_load(f"127.0.0.1:{port}", [("s", "w", 0)], args)
    finally:
        assert server.stop(1).wait(5)
    assert got["RESOURCE_EXHAUSTED"] > 0, got  # over the write rate
    assert got["ok"] == 0 and got["rejected"] == 1, got  # the burst's one call: an unknown worker, success=false
    assert not [k for k in got if k.startswith("status:")], got


@pytest.mark.parametrize("grpc_impl", GRPC_IMPLS)
def test_tls_and_the_token_refuse_alike_on_both_implementations(tmp_path: Path, grpc_impl: str) -> None:
    """The same certificate, key and token files on either gRPC: a plaintext client cannot
    reach it, one trusting another CA neither; a call without the token or with a wrong one,
    on either package, is UNAUTHENTICATED with the same details, reported once each (method,
    reason, caller), and changes nothing; one with the CA and the token is served."""
    creds = pki.generate(tmp_path, tls=True, token=True)
    other = pki.generate(tmp_path / "other", tls=True, token=False)
    assert creds.server_cert and creds.server_key and creds.token and creds.wrong_token
    refusals: list[security.Refusal] = []
    servicer = P2pServicer(Store(), TIMERS, metrics=ServerMetrics().server)
    server, port = start_metadata_server(
        servicer, "127.0.0.1", 0, grpc_impl=grpc_impl, on_refused=refusals.append,
        credentials=security.ServerCredentials.from_files(creds.server_cert, creds.server_key, creds.token))
    address = f"127.0.0.1:{port}"
    publish = p2p_pb2.PublishMetadataRequest(identity=IDENTITY, worker=p2p_pb2.WorkerMetadata(worker_rank=0),
                                             worker_id="w-1")

    def call(credentials: security.ClientCredentials, method: str, request: Any,
             service: str = "mxref.v1.P2pService") -> tuple[grpc.StatusCode, str]:
        with credentials.channel(address) as channel:
            unary = channel.unary_unary(f"/{service}/{method}", request_serializer=lambda m: m.SerializeToString(),
                                        response_deserializer=lambda b: b)
            try:
                unary(request, timeout=5)
            except grpc.RpcError as exc:
                return exc.code(), exc.details() or ""
        return grpc.StatusCode.OK, ""

    try:
        assert call(security.ClientCredentials(), "PublishMetadata", publish)[0] == grpc.StatusCode.UNAVAILABLE
        foreign = security.ClientCredentials.from_files(other.ca_cert, creds.token)
        assert call(foreign, "PublishMetadata", publish)[0] == grpc.StatusCode.UNAVAILABLE
        assert refusals == []  # refused by the handshake, before any call
        missing = security.ClientCredentials.from_files(creds.ca_cert)
        wrong = security.ClientCredentials.from_files(creds.ca_cert, creds.wrong_token)
        assert call(missing, "PublishMetadata", publish) == (
            grpc.StatusCode.UNAUTHENTICATED, security.refusal_details(security.RefusalReason.MISSING_TOKEN))
        assert call(wrong, "ListSources", p2p_pb2.ListSourcesRequest()) == (
            grpc.StatusCode.UNAUTHENTICATED, security.refusal_details(security.RefusalReason.WRONG_TOKEN))
        assert call(wrong, "ListSources", p2p_pb2.ListSourcesRequest(), MX_SERVICE_NAME)[0] == grpc.StatusCode.UNAUTHENTICATED
        deadline = time.monotonic() + 10  # the native server reports its refusals from a thread of their own
        while sum(r.count for r in refusals) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted((r.method, r.reason, r.count) for r in refusals) == sorted([
            ("/mxref.v1.P2pService/PublishMetadata", security.RefusalReason.MISSING_TOKEN, 1),
            ("/mxref.v1.P2pService/ListSources", security.RefusalReason.WRONG_TOKEN, 1),
            (f"/{MX_SERVICE_NAME}/ListSources", security.RefusalReason.WRONG_TOKEN, 1),
        ])
        assert all(r.peer.startswith("ipv4:127.0.0.1") for r in refusals)  # native: the address, counted per it
        honest = security.ClientCredentials.from_files(creds.ca_cert, creds.token)
        assert call(honest, "ListSources", p2p_pb2.ListSourcesRequest())[0] == grpc.StatusCode.OK
        assert not servicer.store.snapshot()  # the refused publish never landed
        assert call(honest, "PublishMetadata", publish)[0] == grpc.StatusCode.OK
        assert [r.worker_id for r in servicer.store.snapshot()] == ["w-1"]
        assert len(refusals) == 3
    finally:
        server.stop(None).wait(5)


def test_without_the_compiled_module_the_default_server_says_how_to_build_it_or_use_grpcio(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The native gRPC is the default: where ``mxref_native`` was never built, the server does not
    start on something else unasked; it names both ways out."""
    monkeypatch.setitem(sys.modules, "mxref_native", None)  # import raises ImportError
    servicer = P2pServicer(Store(), TIMERS, metrics=ServerMetrics().server)
    with pytest.raises(LocalError, match=r"mxref_native is not installed.*pip install ./mxref/native.*--grpc-impl grpcio"):
        start_metadata_server(servicer, "127.0.0.1", 0)
    server, _port = start_metadata_server(servicer, "127.0.0.1", 0, grpc_impl="grpcio")
    server.stop(None).wait(5)


@pytest.mark.parametrize("grpc_impl", GRPC_IMPLS)
def test_a_server_process_spreads_its_full_collections_and_a_hosting_process_keeps_its_own(
        grpc_impl: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``python -m mxref server`` sets its full collections to ``FULL_COLLECTION_EVERY`` young
    ones, the young thresholds kept (a fleet's heartbeats otherwise meet one every few seconds);
    ``start_metadata_server`` alone changes nothing (a test process hosting a server keeps its own)."""
    import gc

    from mxref import __main__ as mxref_main
    from mxref.metadata import main as metadata_main
    from mxref.metadata.transport import FULL_COLLECTION_EVERY

    before = gc.get_threshold()
    gc.set_threshold(before[0], before[1], 10)
    try:
        server, _ = start_metadata_server(P2pServicer(Store(), TIMERS), "127.0.0.1", 0, grpc_impl=grpc_impl)
        try:
            assert gc.get_threshold() == (before[0], before[1], 10)
        finally:
            assert server.stop(1).wait(5)
        seen: list[tuple[int, int, int]] = []

        def run_server(args: object) -> int:
            seen.append(gc.get_threshold())
            return 0

        monkeypatch.setattr(metadata_main, "run_server", run_server)
        assert mxref_main.main(["server", "--grpc-impl", grpc_impl]) == 0
        assert seen == [(before[0], before[1], FULL_COLLECTION_EVERY)]
    finally:
        gc.set_threshold(*before)
