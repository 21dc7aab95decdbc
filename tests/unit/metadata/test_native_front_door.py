"""The native server's front door (``mxref_native.Server``, ``mxref.metadata.native``), over real
loopback connections: refusals before any queue, bounded queues, reads and writes taken in
turn, connection caps, the TLS handshake and idle timeouts, and a server that stops serving
making the process exit non-zero."""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from mxref import pki, security
from mxref.__main__ import parse_argv
from mxref.config import ServerTimers
from mxref.metadata import native as native_grpc
from mxref.metadata.main import run_server
from mxref.metadata.servicer import P2pServicer
from mxref.metadata.store import Store
from mxref.metadata.transport import start_metadata_server
from mxref.metrics import ServerMetrics
from mxref.options import ServerFlags
from mxref.process import EXIT_SERVING_ENDED

TIMERS = ServerTimers(heartbeat_timeout_s=90, reaper_scan_interval_s=30, gc_timeout_s=3600)
LIST = "ListSources"


def own_channel(address: str, credentials: grpc.ChannelCredentials | None = None) -> grpc.Channel:
    options = [("grpc.use_local_subchannel_pool", 1)]
    if credentials is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, credentials, options=options)


def call(channel: grpc.Channel, method: str, request: bytes = b"", timeout: float = 10,
         metadata: tuple[tuple[str, str], ...] = ()) -> grpc.Future:
    rpc = channel.unary_unary(f"/mxref.v1.P2pService/{method}", request_serializer=None, response_deserializer=None)
    return rpc.future(request, timeout=timeout, metadata=metadata)


def until(check: Callable[[], bool], within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture
def creds(tmp_path: Path) -> pki.RunCredentials:
    return pki.generate(tmp_path, tls=True, token=True)


def tls_server(creds: pki.RunCredentials, **kwargs: Any) -> tuple[native_grpc.NativeMetadataServer, list[Any]]:
    refusals: list[security.Refusal] = []
    assert creds.server_cert and creds.server_key and creds.token
    server = native_grpc.NativeMetadataServer(
        P2pServicer(Store(), TIMERS, metrics=ServerMetrics().server), "127.0.0.1", 0, on_refused=refusals.append,
        credentials=security.ServerCredentials.from_files(creds.server_cert, creds.server_key, creds.token), **kwargs)
    return server, refusals


def tls(creds: pki.RunCredentials) -> grpc.ChannelCredentials:
    assert creds.ca_cert
    return grpc.ssl_channel_credentials(root_certificates=creds.ca_cert.read_bytes())


def test_a_call_without_the_token_is_refused_before_any_queue_and_reported_with_its_count(
        creds: pki.RunCredentials) -> None:
    """No worker takes calls here: a refused call is answered all the same (Rust refused it, it
    was never queued), with grpcio's code and details, and reported once, counted; a call with
    the token is queued for Python."""
    server, refusals = tls_server(creds, lanes=())
    assert creds.token and creds.wrong_token
    token = creds.token.read_text().strip()
    try:
        with own_channel(f"127.0.0.1:{server.port}", tls(creds)) as channel:
            for _ in range(5):
                exc = call(channel, LIST).exception()
                assert isinstance(exc, grpc.Call) and exc.code() == grpc.StatusCode.UNAUTHENTICATED
                assert exc.details() == security.refusal_details(security.RefusalReason.MISSING_TOKEN)
            wrong = call(channel, LIST, metadata=(("authorization", f"Bearer {creds.wrong_token.read_text().strip()}"),))
            assert wrong.exception().details() == security.refusal_details(security.RefusalReason.WRONG_TOKEN)
            assert server._server.queued() == (0, 0)
            honest = call(channel, LIST, timeout=30, metadata=(("authorization", f"Bearer {token}"),))
            assert until(lambda: server._server.queued() == (1, 0))
            assert until(lambda: sum(r.count for r in refusals) == 6)
            assert {(r.method, r.peer) for r in refusals} == {("/mxref.v1.P2pService/ListSources", "ipv4:127.0.0.1")}
            assert sum(r.count for r in refusals if r.reason == security.RefusalReason.MISSING_TOKEN) == 5
            assert sum(r.count for r in refusals if r.reason == security.RefusalReason.WRONG_TOKEN) == 1
            honest.cancel()
    finally:
        server.stop(0.2)


def test_a_full_queue_answers_resource_exhausted_at_once() -> None:
    import mxref_native

    server = mxref_native.Server("127.0.0.1", 0, **native_grpc.routing(), max_concurrent_streams=64, max_message_bytes=1 << 20,
                                 front_door=native_grpc.FRONT_DOOR, max_queued_calls=4)
    try:
        got = mxref_native.unary_load(f"127.0.0.1:{server.port}", f"/mxref.v1.P2pService/{LIST}", [b""],
                                      connections=1, window=16, seconds=0.5, timeout_s=1.0)
        assert got.get("status:8", 0) >= 12, got  # RESOURCE_EXHAUSTED: 4 wait (nobody takes them), the rest refused
        assert server.queued() == (4, 0)
        assert server.stats()["queue_full"] >= 12
    finally:
        assert server.stop(0.2)


def test_reads_and_writes_are_taken_in_turn_so_a_read_flood_cannot_starve_heartbeats() -> None:
    import mxref_native

    server = mxref_native.Server("127.0.0.1", 0, **native_grpc.routing(), max_concurrent_streams=64, max_message_bytes=1 << 20,
                                 front_door=native_grpc.FRONT_DOOR)
    try:
        with own_channel(f"127.0.0.1:{server.port}") as channel:
            reads = [call(channel, LIST) for _ in range(20)]
            assert until(lambda: server.queued() == (20, 0))
            writes = [call(channel, "UpdateStatus") for _ in range(3)]
            assert until(lambda: server.queued() == (20, 3))
            batch = server.take(16, 1.0)
            assert [c.method for c in batch[:7]] == [LIST, "UpdateStatus"] * 3 + [LIST]
            assert len(batch) == 16
            for taken in [*batch, *server.take(16, 1.0)]:
                taken.answer(0, "", [], b"")
            assert all(f.result() == b"" for f in [*reads, *writes])
    finally:
        assert server.stop(0.2)


def test_connections_over_the_per_peer_cap_are_closed_and_the_server_serves_after() -> None:
    servicer = P2pServicer(Store(), TIMERS, metrics=ServerMetrics().server)
    server = native_grpc.NativeMetadataServer(servicer, "127.0.0.1", 0, front_door={"max_connections_per_peer": 3})
    address = f"127.0.0.1:{server.port}"
    held = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(3)]
    try:
        assert until(lambda: server.stats()["open"] == 3)
        with own_channel(address) as channel:
            exc = call(channel, LIST, timeout=2).exception()
            assert isinstance(exc, grpc.Call) and exc.code() in (grpc.StatusCode.UNAVAILABLE,
                                                                 grpc.StatusCode.DEADLINE_EXCEEDED)
        assert server.stats()["over_cap"] >= 1
    finally:
        for s in held:
            s.close()
    try:
        assert until(lambda: server.stats()["open"] == 0)
        with own_channel(address) as channel:
            assert call(channel, LIST).result() == b""
    finally:
        server.stop(0.2)


def test_a_tls_peer_that_never_finishes_its_handshake_is_dropped(creds: pki.RunCredentials) -> None:
    server, _ = tls_server(creds, front_door={"handshake_timeout_s": 0.3})
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as silent:
            started = time.monotonic()
            assert silent.recv(1) == b""  # closed by the server
            assert time.monotonic() - started < 8
        assert until(lambda: server.stats()["handshake_failures"] == 1)
    finally:
        server.stop(0.2)


def test_an_idle_connection_is_closed_and_its_client_reconnects() -> None:
    servicer = P2pServicer(Store(), TIMERS, metrics=ServerMetrics().server)
    server = native_grpc.NativeMetadataServer(servicer, "127.0.0.1", 0, front_door={"idle_timeout_s": 0.3})
    try:
        with own_channel(f"127.0.0.1:{server.port}") as channel:
            assert call(channel, LIST).result() == b""
            assert until(lambda: server.stats()["closed_idle"] >= 1)
            assert call(channel, LIST).result() == b""
    finally:
        server.stop(0.2)


class _Ended:
    """A started server whose serving ended by itself (what ``NativeMetadataServer.failure`` reports)."""

    port = 0

    def failure(self) -> str:
        return "the accept loop ended without being asked to"

    def stop(self, grace: float | None) -> Any:
        return argparse.Namespace(wait=lambda timeout=None: True)


def test_a_server_that_stops_serving_makes_the_process_say_so_and_exit_non_zero(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("mxref.metadata.main.start_metadata_server", lambda *a, **k: (_Ended(), 1))
    events = tmp_path / "events.jsonl"
    args = parse_argv(["server", "--port", "0", "--metrics-port", "0", "--events", str(events)])
    assert isinstance(args, ServerFlags)
    stop = threading.Event()
    give_up = threading.Timer(30, stop.set)  # without the check, the run loop would wait for a signal forever
    give_up.start()
    try:
        assert run_server(args, stop) == EXIT_SERVING_ENDED
    finally:
        give_up.cancel()
    (exit_event,) = [e for e in map(json.loads, events.read_text().splitlines()) if e["event"] == "exit"]
    assert exit_event["code"] == EXIT_SERVING_ENDED and "without being asked" in exit_event["error"]


def test_a_stopped_native_server_reports_no_failure() -> None:
    servicer = P2pServicer(Store(), TIMERS, metrics=ServerMetrics().server)
    server, _ = start_metadata_server(servicer, "127.0.0.1", 0, grpc_impl="native")
    assert isinstance(server, native_grpc.NativeMetadataServer)
    assert server.failure() is None
    assert server.stop(0.2).wait(5)
    assert server.failure() is None
    assert server._server.ended(0) == "stopped"


# --- issue 36: a door a few addresses cannot shut, bytes in flight counted -------------------


def native(**front_door: float) -> native_grpc.NativeMetadataServer:
    servicer = P2pServicer(Store(), TIMERS, metrics=ServerMetrics().server)
    return native_grpc.NativeMetadataServer(servicer, "127.0.0.1", 0, front_door=front_door)


def closed_by_server(sock: socket.socket, within_s: float = 5.0) -> bool:
    sock.settimeout(within_s)
    try:
        while sock.recv(65536):
            pass  # the server's SETTINGS and GOAWAY, if any, then the end
    except TimeoutError:
        return False
    except OSError:
        return True
    return True


def test_a_peer_that_sends_no_call_is_dropped_after_the_first_request_deadline() -> None:
    server = native(first_request_timeout_s=0.3)
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as silent:
            started = time.monotonic()
            assert closed_by_server(silent)
            assert time.monotonic() - started < 4
        assert until(lambda: server.stats()["closed_silent"] == 1)
        with own_channel(f"127.0.0.1:{server.port}") as channel:  # an honest client calls at once
            assert call(channel, LIST).result() == b""
    finally:
        server.stop(0.2)


def test_an_address_block_has_a_cap_of_its_own() -> None:
    server = native(max_connections_per_block=3)
    held = [socket.create_connection(("127.0.0.1", server.port), timeout=5, source_address=(ip, 0))
            for ip in ("127.0.0.2", "127.0.0.2", "127.0.0.3")]
    try:
        assert until(lambda: server.stats()["open"] == 3)
        with socket.create_connection(("127.0.0.1", server.port), timeout=5, source_address=("127.0.0.4", 0)) as s:
            assert closed_by_server(s)  # a fourth address of 127.0.0.0/24
        assert server.stats()["over_cap"] == 1
        with socket.create_connection(("127.0.0.1", server.port), timeout=5, source_address=("127.0.1.4", 0)):
            assert until(lambda: server.stats()["open"] == 4)  # another /24 is let in
    finally:
        for s in held:
            s.close()
        server.stop(0.2)


def test_at_the_cap_the_oldest_silent_connection_makes_room() -> None:
    server = native(max_connections=3)
    held = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(3)]
    try:
        assert until(lambda: server.stats()["open"] == 3)
        with own_channel(f"127.0.0.1:{server.port}") as channel:
            assert call(channel, LIST).result() == b""  # before: UNAVAILABLE while the three were held
            assert server.stats()["evicted"] >= 1
            assert closed_by_server(held[0])  # the oldest went
            assert call(channel, LIST).result() == b""
    finally:
        for s in held:
            s.close()
        server.stop(0.2)


def test_at_the_cap_a_connection_idle_longest_makes_room_when_none_is_silent() -> None:
    """Three connections that each made a call and went idle hold the cap (a server without a token
    lets anyone call): a newcomer still gets in, in place of the one idle longest."""
    server = native(max_connections=3)
    address = f"127.0.0.1:{server.port}"
    holders = [own_channel(address) for _ in range(3)]
    try:
        for channel in holders:
            assert call(channel, LIST).result() == b""
        assert until(lambda: server.stats()["open"] == 3)
        time.sleep(1.2)  # idle a second at least: the ones that may be dropped
        with own_channel(address) as channel:
            assert call(channel, LIST, timeout=5).result() == b""
        assert server.stats()["evicted"] >= 1
    finally:
        for channel in holders:
            channel.close()
        server.stop(0.2)


def test_a_body_that_does_not_arrive_in_time_gives_its_bytes_back() -> None:
    from fixtures.h2raw import RawH2, grpc_message

    server = native(body_timeout_s=2.0, min_body_bytes_per_s=1 << 30)
    peer = RawH2(server.port)
    try:
        peer.data(peer.open("/mxref.v1.P2pService/PublishMetadata"), grpc_message(b"\x0a" * 100_000, declared=1 << 20))
        assert until(lambda: server.stats()["received_bytes"] == 100_005, within_s=1.8)  # counted as it came
        assert until(lambda: server.stats()["body_timeouts"] == 1)
        assert server.stats()["received_bytes"] == 0
        with own_channel(f"127.0.0.1:{server.port}") as channel:
            assert call(channel, LIST).result() == b""
    finally:
        peer.close()
        server.stop(0.2)


def test_a_message_declared_over_the_limit_is_refused_before_its_body() -> None:
    from fixtures.h2raw import RawH2, grpc_message

    server = native()
    peer = RawH2(server.port)
    try:
        peer.data(peer.open("/mxref.v1.P2pService/PublishMetadata"), grpc_message(b"\x0a" * 10, declared=1 << 30))
        time.sleep(0.3)
        assert server.stats()["received_bytes"] == 0  # not a byte of it kept
    finally:
        peer.close()
        server.stop(0.2)


def test_answers_nobody_reads_are_capped_and_their_connection_dropped() -> None:
    import mxref_native
    from fixtures.h2raw import RawH2, grpc_message

    limits = {**native_grpc.FRONT_DOOR, "max_unsent_bytes_per_connection": 100_000, "send_stall_timeout_s": 0.5}
    server = mxref_native.Server("127.0.0.1", 0, **native_grpc.routing(), max_concurrent_streams=8,
                                 max_message_bytes=1 << 20, front_door=limits)
    peer = RawH2(server.port, window=0)
    try:
        for _ in range(3):
            peer.data(peer.open(f"/mxref.v1.P2pService/{LIST}"), grpc_message(b""), end=True)
        assert until(lambda: server.queued() == (3, 0))
        for taken in server.take(8, 1.0) or []:
            taken.answer(0, "", [], b"x" * 60_000)
        assert until(lambda: server.stats()["unsent_full"] == 2)  # 60 kB fit, a second would pass 100 kB
        assert server.stats()["unsent_bytes"] > 0
        assert until(lambda: server.stats()["closed_stalled"] == 1)  # none read for 0.5 s: dropped
        assert until(lambda: server.stats()["unsent_bytes"] == 0)
    finally:
        peer.close()
        server.stop(0.2)


def test_the_front_door_limits_come_from_python_each_named() -> None:
    import mxref_native

    limits = dict(native_grpc.FRONT_DOOR)
    del limits["first_request_timeout_s"]
    limits["max_silence"] = 1.0
    with pytest.raises(ValueError, match=r"first_request_timeout_s is missing.*max_silence is not a front-door limit"):
        mxref_native.Server("127.0.0.1", 0, **native_grpc.routing(), max_concurrent_streams=8,
                            max_message_bytes=1 << 20, front_door=limits)
