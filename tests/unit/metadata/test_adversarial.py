"""The metadata server against callers who mean harm, on both gRPC implementations.

Each test pins one defence (docs/security.md): a record belongs to its publisher (a hijack
by a caller that knows its ids is refused, the victim's record untouched); a reader's token
cannot write; byte budgets per record and for the whole store, unknown fields refused, and a
write rate per peer address that new connections do not reset; ModelExpress's own fields
checked like ours, and a record that does not encode left out of a listing (counted) rather
than failing it; the worker id ``__attributes__`` refused; a source refusing ``--token-file``
without TLS; and a bounded Hypothesis fuzz of every RPC of both packages after which the
server still answers.
"""

from __future__ import annotations

import contextlib
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from fixtures.wire import field, varint
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from mxref import pki, security
from mxref.__main__ import parse_argv
from mxref.config import ServerLimits, ServerTimers
from mxref.errors import MetadataServerError
from mxref.identity import mx_source_id
from mxref.metadata.modelexpress import MX_SERVICE_NAME
from mxref.metadata.ownership import MxWrites, OwnerBook, WriteGate
from mxref.metadata.reaper import Reaper
from mxref.metadata.servicer import P2pServicer
from mxref.metadata.store import Store
from mxref.metadata.transport import GRPC_IMPLS, start_metadata_server
from mxref.metrics import ServerMetrics
from mxref.mx import p2p_pb2 as mx_pb2
from mxref.options import ReaderFlags, ServerFlags, SourceFlags
from mxref.roles.client import MxClient
from mxref.v1 import p2p_pb2

T0 = 1_800_000_000.0
TIMERS = ServerTimers(heartbeat_timeout_s=90, reaper_scan_interval_s=30, gc_timeout_s=3600)
READY = p2p_pb2.SOURCE_STATUS_READY
STALE = p2p_pb2.SOURCE_STATUS_STALE
OURS = "mxref.v1.P2pService"
FUZZ_EXAMPLES = 200
"""Fuzz cases per gRPC implementation (docs/security.md gives the cases and seconds measured)."""
FUZZ_CALL_TIMEOUT_S = 5.0


class ManualClock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@dataclass
class Server:
    address: str
    servicer: P2pServicer
    store: Store
    metrics: ServerMetrics
    reaper: Reaper
    clock: ManualClock

    def channel(self) -> grpc.Channel:
        """A connection of its own (channels of one process share one unless told not to)."""
        return grpc.insecure_channel(self.address, options=[("grpc.use_local_subchannel_pool", 1),
                                                           ("grpc.max_send_message_length", 64 << 20)])

    def raw(self, service: str, method: str, payload: bytes, channel: grpc.Channel | None = None,
            timeout_s: float = 5.0) -> tuple[grpc.StatusCode, bytes | str]:
        """One call with ``payload`` as its bytes: (OK, the answer's bytes) or (code, details)."""
        own = channel is None
        chan = self.channel() if channel is None else channel
        try:
            rpc = chan.unary_unary(f"/{service}/{method}", request_serializer=None, response_deserializer=None)
            try:
                answer: bytes = rpc(payload, timeout=timeout_s)
            except grpc.RpcError as exc:
                return exc.code(), exc.details() or ""
            return grpc.StatusCode.OK, answer
        finally:
            if own:
                chan.close()

    def sample(self, name: str, **labels: str) -> float:
        port = self.metrics.serve(0)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                text = response.read().decode()
        finally:
            self.metrics.close()
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    return float(s.value)
        return 0.0


@contextlib.contextmanager
def serve(grpc_impl: str, *, limits: ServerLimits | None = None, owners: OwnerBook | None = None,
          credentials: security.ServerCredentials | None = None,
          write_gate: WriteGate | None = None) -> Iterator[Server]:
    clock = ManualClock()
    store = Store(clock)
    metrics = ServerMetrics()
    servicer = P2pServicer(store, TIMERS, metrics=metrics.server, limits=limits, owners=owners, write_gate=write_gate)
    reaper = Reaper(store, TIMERS, metrics=metrics.server, on_deleted=servicer.forget)
    server, port = start_metadata_server(servicer, "127.0.0.1", 0, grpc_impl=grpc_impl, credentials=credentials)
    try:
        yield Server(f"127.0.0.1:{port}", servicer, store, metrics, reaper, clock)
    finally:
        server.stop(0).wait(5)


@pytest.fixture(params=GRPC_IMPLS)
def grpc_impl(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def server(grpc_impl: str) -> Iterator[Server]:
    with serve(grpc_impl) as srv:
        yield srv


def identity(model: str = "acme/model-a") -> p2p_pb2.SourceIdentity:
    return p2p_pb2.SourceIdentity(mx_version="0.7.0", model_name=model, backend_framework=p2p_pb2.VLLM,
                                  tensor_parallel_size=1, dtype="float16")


def worker(endpoint: str = "10.0.0.1", rank: int = 0, blob: bytes = b"") -> p2p_pb2.WorkerMetadata:
    w = p2p_pb2.WorkerMetadata(worker_rank=rank, metadata_endpoint=f"{endpoint}:5555", agent_name=f"agent-{endpoint}",
                               worker_grpc_endpoint=f"{endpoint}:6555", accelerator="cpu")
    if blob:
        w.nixl_metadata = blob
    return w


def refused(call: Callable[[], Any]) -> MetadataServerError:
    with pytest.raises(MetadataServerError) as caught:
        call()
    return caught.value


# --- item 4: a record belongs to its publisher ---------------------------------------


def test_a_hijack_is_refused_and_the_victim_keeps_its_record(server: Server) -> None:
    """A second caller that knows the victim's ids (any listing shows them) can neither
    republish them with its own endpoints nor heartbeat or demote them, with no secret or a
    made-up one; the victim's record, endpoints and status are untouched and it goes on."""
    with MxClient(server.address, timeout_s=5) as victim, MxClient(server.address, timeout_s=5) as thief:
        published = victim.publish_metadata(identity(), worker("10.0.0.1"), "w1")
        assert published.success and len(published.owner_secret) == 64
        sid = published.mx_source_id
        assert victim.update_status(sid, "w1", 0, READY).success

        hijack = refused(lambda: thief.publish_metadata(identity(), worker("10.6.6.6"), "w1"))
        assert hijack.code == grpc.StatusCode.PERMISSION_DENIED and "owner_secret" in str(hijack)
        assert refused(lambda: thief.update_status(sid, "w1", 0, STALE)).code == grpc.StatusCode.PERMISSION_DENIED
        forged = p2p_pb2.PublishMetadataRequest(identity=identity(), worker=worker("10.6.6.6"), worker_id="w1",
                                                owner_secret="0" * 64)
        code, _ = server.raw(OURS, "PublishMetadata", forged.SerializeToString())
        assert code == grpc.StatusCode.PERMISSION_DENIED
        # ModelExpress's package sends no secret: it cannot take an mxref publisher's record either
        mx_hijack = mx_pb2.PublishMetadataRequest.FromString(forged.SerializeToString())
        mx_hijack.ClearField("worker_id")
        mx_hijack.worker_id = "w1"
        code, _ = server.raw(MX_SERVICE_NAME, "PublishMetadata",
                             mx_pb2.PublishMetadataRequest(identity=mx_hijack.identity, worker=mx_hijack.worker,
                                                           worker_id="w1").SerializeToString())
        assert code == grpc.StatusCode.PERMISSION_DENIED

        got = victim.get_metadata(sid, "w1")
        assert got.found and got.worker.metadata_endpoint == "10.0.0.1:5555" and got.worker.status == READY
        assert got.worker.worker_grpc_endpoint == "10.0.0.1:6555"
        assert victim.update_status(sid, "w1", 0, READY).success  # the owner goes on
        assert victim.publish_metadata(identity(), worker("10.0.0.2"), "w1").success  # and may move itself
        assert server.sample("mxref_server_rejected_requests_total", method="PublishMetadata", reason="not_owner") == 3
        assert server.sample("mxref_server_rejected_requests_total", method="UpdateStatus", reason="not_owner") == 1


def test_a_reaped_record_may_be_published_afresh(server: Server) -> None:
    with MxClient(server.address, timeout_s=5) as first, MxClient(server.address, timeout_s=5) as second:
        sid = first.publish_metadata(identity(), worker(), "w1").mx_source_id
        server.clock.now += TIMERS.heartbeat_timeout_s + 1
        server.reaper.scan_once()  # STALE
        server.clock.now += TIMERS.gc_timeout_s + 1
        server.reaper.scan_once()  # deleted: its owner and bytes go with it
        assert server.store.get(sid, "w1") is None and len(server.servicer.claims.owners) == 0
        assert server.servicer.claims.store_bytes == 0
        assert second.publish_metadata(identity(), worker("10.0.0.9"), "w1").success


def test_an_owner_dropped_from_the_book_is_read_back_from_the_store(grpc_impl: str) -> None:
    """The book holds 2 entries; a third record pushes the first one's out. Its owner is kept with
    the record, so a caller that knows its ids still cannot take it (before: the first writer after
    the eviction owned it, and one address could evict honest owners by publishing records)."""
    with serve(grpc_impl, owners=OwnerBook(max_entries=2)) as srv, MxClient(srv.address, timeout_s=5) as victim, \
            MxClient(srv.address, timeout_s=5) as thief:
        sid = victim.publish_metadata(identity(), worker("10.0.0.1"), "w0").mx_source_id
        for i in (1, 2):
            assert thief.publish_metadata(identity(), worker("10.6.6.6"), f"w{i}").success
        assert len(srv.servicer.claims.owners) == 2  # w0's entry is out of the book
        assert refused(lambda: thief.publish_metadata(identity(), worker("10.6.6.6"), "w0")).code == \
            grpc.StatusCode.PERMISSION_DENIED
        assert refused(lambda: thief.update_status(sid, "w0", 0, STALE)).code == grpc.StatusCode.PERMISSION_DENIED
        assert victim.update_status(sid, "w0", 0, READY).success
        assert srv.store.get(sid, "w0").worker.metadata_endpoint == "10.0.0.1:5555"  # type: ignore[union-attr]


def test_a_late_forget_does_not_free_a_record_published_again(grpc_impl: str) -> None:
    """The reaper deletes a record, its source publishes it again (a new owner secret), and only
    then does the reaper's ``forget`` run: the record is held, so its owner stays (before: the
    owner entry went, and the next writer of the live record owned it)."""
    with serve(grpc_impl) as srv, MxClient(srv.address, timeout_s=5) as source, \
            MxClient(srv.address, timeout_s=5) as thief:
        sid = source.publish_metadata(identity(), worker("10.0.0.1"), "w1").mx_source_id
        srv.servicer.forget((sid, "w1"))  # as the reaper's callback would, racing a republish
        assert len(srv.servicer.claims.owners) == 1 and srv.servicer.claims.store_bytes > 0
        assert refused(lambda: thief.publish_metadata(identity(), worker("10.6.6.6"), "w1")).code == \
            grpc.StatusCode.PERMISSION_DENIED
        assert source.update_status(sid, "w1", 0, READY).success


@pytest.mark.parametrize("mode", list(MxWrites))
def test_modelexpress_writes_follow_the_flag(grpc_impl: str, mode: MxWrites) -> None:
    """trusted: ModelExpress's package publishes and heartbeats its own records (first come);
    refused: PERMISSION_DENIED for its writes, its reads still served."""
    with serve(grpc_impl, owners=OwnerBook(mode)) as srv:
        request = mx_pb2.PublishMetadataRequest(
            identity=mx_pb2.SourceIdentity(mx_version="0.7.0", model_name="acme/m", dtype="float32"),
            worker=mx_pb2.WorkerMetadata(worker_rank=0, agent_name="a"), worker_id="mx-1")
        code, answer = srv.raw(MX_SERVICE_NAME, "PublishMetadata", request.SerializeToString())
        if mode is MxWrites.REFUSED:
            assert code == grpc.StatusCode.PERMISSION_DENIED and "--mx-writes refused" in str(answer)
        else:
            assert code == grpc.StatusCode.OK and mx_pb2.PublishMetadataResponse.FromString(answer).success
            sid = mx_source_id(p2p_pb2.SourceIdentity(mx_version="0.7.0", model_name="acme/m", dtype="float32"))
            beat = mx_pb2.UpdateStatusRequest(mx_source_id=sid, worker_id="mx-1", worker_rank=0,
                                           status=mx_pb2.SOURCE_STATUS_READY)
            code, answer = srv.raw(MX_SERVICE_NAME, "UpdateStatus", beat.SerializeToString())
            assert code == grpc.StatusCode.OK and mx_pb2.UpdateStatusResponse.FromString(answer).success
            code, _ = srv.raw(MX_SERVICE_NAME, "PublishMetadata", request.SerializeToString())  # republish
            assert code == grpc.StatusCode.OK
        code, _ = srv.raw(MX_SERVICE_NAME, "ListSources", mx_pb2.ListSourcesRequest().SerializeToString())
        assert code == grpc.StatusCode.OK


def test_a_reader_token_lists_but_cannot_write(tmp_path: Path, grpc_impl: str) -> None:
    creds = pki.generate(tmp_path, tls=True, token=True)
    assert creds.server_cert and creds.server_key and creds.token and creds.ca_cert
    reader_token = tmp_path / "reader.token"
    reader_token.write_text("reader-token-0123456789")
    credentials = security.ServerCredentials.from_files(creds.server_cert, creds.server_key, creds.token, reader_token)
    with serve(grpc_impl, credentials=credentials, write_gate=WriteGate(credentials.reader_token)) as srv:
        source_creds = security.ClientCredentials.from_files(creds.ca_cert, creds.token)
        reader_creds = security.ClientCredentials.from_files(creds.ca_cert, reader_token)
        with MxClient(srv.address, timeout_s=5, credentials=source_creds) as source, \
                MxClient(srv.address, timeout_s=5, credentials=reader_creds) as reader:
            sid = source.publish_metadata(identity(), worker(), "w1").mx_source_id
            assert source.update_status(sid, "w1", 0, READY).success
            assert [r.worker_id for r in reader.list_sources()] == ["w1"]
            assert reader.get_metadata(sid, "w1").found
            denied = refused(lambda: reader.publish_metadata(identity(), worker(), "w2"))
            assert denied.code == grpc.StatusCode.PERMISSION_DENIED and "reader token" in str(denied)
            assert refused(lambda: reader.update_status(sid, "w1", 0, STALE)).code == grpc.StatusCode.PERMISSION_DENIED
            assert [r.worker_id for r in reader.list_sources()] == ["w1"]
        assert srv.sample("mxref_server_rejected_requests_total", method="PublishMetadata", reason="forbidden") == 1


def test_a_reader_token_needs_the_source_token_and_must_differ() -> None:
    with pytest.raises(security.SecurityError, match="needs the source token"):
        security.ServerCredentials(cert_pem=b"c", key_pem=b"k", reader_token="r")
    with pytest.raises(security.SecurityError, match="the same"):
        security.ServerCredentials(cert_pem=b"c", key_pem=b"k", token="t", reader_token="t")


# --- item 3: budgets in bytes and per peer ------------------------------------------


def test_byte_budgets_per_record_and_for_the_store(grpc_impl: str) -> None:
    limits = ServerLimits(max_record_bytes=64 * 1024, max_store_bytes=150 * 1024, publish_burst=1000,
                          publish_rate_per_s=1000, peer_share=1.0, new_peer_headroom=0.0)  # the budget alone
    with serve(grpc_impl, limits=limits) as srv, MxClient(srv.address, timeout_s=5) as honest, \
            MxClient(srv.address, timeout_s=5) as flood:
        assert honest.publish_metadata(identity(), worker(blob=b"h" * 40_000), "honest").success
        big = refused(lambda: flood.publish_metadata(identity(), worker(blob=b"x" * 70_000), "big"))
        assert big.code == grpc.StatusCode.INVALID_ARGUMENT and "--max-record-bytes" in str(big)
        accepted = 0
        for i in range(10):
            try:
                flood.publish_metadata(identity(), worker(blob=b"f" * 40_000), f"flood-{i}")
                accepted += 1
            except MetadataServerError as exc:
                assert exc.code == grpc.StatusCode.RESOURCE_EXHAUSTED and "--max-store-bytes" in str(exc)
        assert accepted == 2  # 3 x ~40 KB fit in 150 KiB, a fourth does not
        assert srv.servicer.claims.store_bytes <= limits.max_store_bytes
        # the honest source's republish (the same size, replacing its own) still fits
        assert honest.publish_metadata(identity(), worker("10.0.0.2", blob=b"h" * 40_000), "honest").success


def test_unknown_fields_are_refused_in_our_package(server: Server) -> None:
    request = p2p_pb2.PublishMetadataRequest(identity=identity(), worker=worker(), worker_id="w1")
    tensor = p2p_pb2.TensorDescriptor(name="t", size=1).SerializeToString() + field(99, b"u" * 100_000)
    payload = request.SerializeToString() + field(2, field(3, tensor))  # merged into worker.tensors[0]
    code, details = server.raw(OURS, "PublishMetadata", payload)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "does not define" in str(details)
    assert server.store.snapshot() == []


def test_the_write_rate_holds_per_peer_address_across_new_connections(grpc_impl: str) -> None:
    limits = ServerLimits(publish_rate_per_s=100, publish_burst=100, peer_publish_rate_per_s=0.01,
                          peer_publish_burst=5)
    with serve(grpc_impl, limits=limits) as srv:
        beat = p2p_pb2.UpdateStatusRequest(mx_source_id="s" * 16, worker_id="w", status=READY).SerializeToString()
        codes = []
        for _ in range(8):  # each on a new connection: a per-connection bucket alone would pass them all
            code, _ = srv.raw(OURS, "UpdateStatus", beat)
            codes.append(code)
        assert codes[:5] == [grpc.StatusCode.OK] * 5
        assert set(codes[5:]) == {grpc.StatusCode.RESOURCE_EXHAUSTED}


# --- item 5: ModelExpress's own fields, and listings that never fail ----------------


def _mx_publish(worker_id: str, worker_extra: bytes = b"") -> bytes:
    request = mx_pb2.PublishMetadataRequest(
        identity=mx_pb2.SourceIdentity(mx_version="0.7.0", model_name="acme/m", dtype="float32"), worker_id=worker_id)
    worker_bytes: bytes = mx_pb2.WorkerMetadata(worker_rank=0, agent_name=worker_id).SerializeToString() + worker_extra
    head: bytes = request.SerializeToString()
    return head + field(2, worker_bytes)


def _mx_listing(srv: Server) -> list[str]:
    code, answer = srv.raw(MX_SERVICE_NAME, "ListSources", mx_pb2.ListSourcesRequest().SerializeToString())
    assert code == grpc.StatusCode.OK, answer
    assert isinstance(answer, bytes)
    return sorted(r.worker_id for r in mx_pb2.ListSourcesResponse.FromString(answer).instances)


def test_a_poisoned_modelexpress_field_is_refused_and_listings_answer(server: Server) -> None:
    assert server.raw(MX_SERVICE_NAME, "PublishMetadata", _mx_publish("honest"))[0] == grpc.StatusCode.OK
    not_utf8 = field(11, field(1, b"rack") + field(2, b"\xff\xfe"))  # topology {"rack": <not UTF-8>}
    code, details = server.raw(MX_SERVICE_NAME, "PublishMetadata", _mx_publish("bad", not_utf8))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    huge = field(11, field(1, b"k") + field(2, b"v" * (15 << 20)))  # 15 MiB of topology
    code, details = server.raw(MX_SERVICE_NAME, "PublishMetadata", _mx_publish("huge", huge))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    many = b"".join(field(11, field(1, f"k{i}".encode()) + field(2, b"v")) for i in range(40))
    code, details = server.raw(MX_SERVICE_NAME, "PublishMetadata", _mx_publish("many", many))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "topology" in str(details)
    assert _mx_listing(server) == ["honest"]


def test_a_record_that_does_not_encode_is_left_out_and_counted(server: Server) -> None:
    """As a shared Redis may hand back: a record whose ModelExpress fields are not UTF-8. Both
    packages' listings answer with the good records, and the skip is counted."""
    bad_worker = p2p_pb2.WorkerMetadata.FromString(
        worker().SerializeToString() + field(11, field(1, b"rack") + field(2, b"\xff")))
    server.store.publish(identity(), bad_worker, "bad", READY)  # behind the servicer's back
    server.store.publish(identity(), worker(), "good", READY)
    assert _mx_listing(server) == ["good"]
    with MxClient(server.address, timeout_s=5) as client:
        assert sorted(r.worker_id for r in client.list_sources()) == ["bad", "good"]  # ours lists no topology
    assert server.sample("mxref_server_listing_skipped_total", package=MX_SERVICE_NAME) == 1


# --- smaller: a reserved worker id; a source's token without TLS --------------------


def test_the_worker_id_attributes_is_refused(server: Server) -> None:
    with MxClient(server.address, timeout_s=5) as client:
        answer = client.publish_metadata(identity(), worker(), "__attributes__")
        assert not answer.success and "reserved" in answer.message
        assert server.store.snapshot() == []


def test_a_redis_store_keeps_the_identity_from_a_worker_named_attributes(tmp_path: Path) -> None:
    from harness.subjects.redisd import RedisServer, redis_available
    from mxref.metadata.records import UpdateRejected
    from mxref.metadata.redis_store import RedisStore

    if redis_available() is None:
        pytest.skip("redis-server is not installed (.ci/bootstrap installs it)")
    with RedisServer() as redis_server:
        store = RedisStore(redis_server.url, ManualClock())
        try:
            honest = store.publish(identity(), worker(), "w1", READY)
            with pytest.raises(UpdateRejected, match="reserved"):
                store.publish(identity("evil/other"), worker(), "__attributes__", READY)
            with pytest.raises(UpdateRejected, match="reserved"):
                store.update_status(honest.mx_source_id, "__attributes__", 0, READY)
            got = store.get(honest.mx_source_id, "w1")
            assert got is not None and got.identity.model_name == "acme/model-a"
        finally:
            store.close()


def test_a_source_refuses_a_token_without_tls(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from mxref.__main__ import install_credentials

    token = tmp_path / "token"
    token.write_text("t0ken")
    for argv in (["source"], ["reader", "--serve-after-load"]):
        args = parse_argv([*argv, "--tls-ca", str(token), "--token-file", str(token)])
        assert isinstance(args, SourceFlags | ReaderFlags)
        assert install_credentials(args) is False
        assert "--token-file needs --tls-cert" in capsys.readouterr().err


# --- item 7: a bounded fuzz of every RPC of both packages ---------------------------

_FIELD = st.one_of(st.integers(min_value=1, max_value=11), st.integers(min_value=1, max_value=30))
"""Field numbers, the schemas' own (1-11: topology is 11) twice as likely as any."""


def _fields(depth: int) -> st.SearchStrategy[bytes]:
    """Protobuf-shaped bytes: fields of every wire type with random numbers, strings of any
    bytes (not UTF-8 too), nested messages; sometimes plain garbage."""
    scalar = st.one_of(
        st.tuples(_FIELD, st.integers(min_value=0, max_value=2**64 - 1)).map(lambda t: varint(t[0] << 3) + varint(t[1])),
        st.tuples(_FIELD, st.binary(max_size=300)).map(lambda t: field(t[0], t[1])),
        st.tuples(_FIELD, st.binary(min_size=4, max_size=4)).map(lambda t: varint(t[0] << 3 | 5) + t[1]),
        st.tuples(_FIELD, st.binary(min_size=8, max_size=8)).map(lambda t: varint(t[0] << 3 | 1) + t[1]),
    )
    if depth == 0:
        return st.lists(scalar, max_size=6).map(b"".join)
    nested = st.tuples(_FIELD, _fields(depth - 1)).map(lambda t: field(t[0], t[1]))
    return st.lists(st.one_of(scalar, nested), max_size=6).map(b"".join)


_RPCS = [(service, method) for service in (OURS, MX_SERVICE_NAME)
         for method in ("PublishMetadata", "ListSources", "GetMetadata", "UpdateStatus")]
_WORKER = mx_pb2.WorkerMetadata(worker_rank=0, agent_name="fuzz", metadata_endpoint="10.0.0.1:5555").SerializeToString()


@st.composite
def _payloads(draw: st.DrawFn, rpc: tuple[str, str]) -> bytes:
    """A request for ``rpc``: plain garbage, protobuf-shaped fields, or a valid request with fields
    of any number and wire type merged in at the top and (a publish) inside its worker, where
    ModelExpress's topology (11) and our tensors (3) live."""
    kind = draw(st.sampled_from(["garbage", "fields", "valid+fields", "worker+fields"]))
    if kind == "garbage":
        return draw(st.binary(max_size=512))
    if kind == "fields":
        return draw(_fields(3))
    valid = _mx_publish(f"fuzz-{draw(st.integers(0, 9))}") if rpc[1] == "PublishMetadata" else b""
    if kind == "valid+fields" or rpc[1] != "PublishMetadata":
        return valid + draw(_fields(2))
    entries = st.lists(st.tuples(st.binary(max_size=40), st.binary(max_size=40)).map(
        lambda kv: field(11, field(1, kv[0]) + field(2, kv[1]))), max_size=4).map(b"".join)  # topology
    return valid + field(2, _WORKER + draw(st.one_of(_fields(2), entries)))
_ANSWERS = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED,
            grpc.StatusCode.PERMISSION_DENIED}


def test_fuzz_every_rpc_of_both_packages(grpc_impl: str) -> None:
    """No crash, no hang, no INTERNAL/UNKNOWN: every answer is served or a named refusal, and
    afterwards both packages list and an honest source publishes."""
    with serve(grpc_impl, limits=ServerLimits(publish_rate_per_s=1e6, publish_burst=10**6,
                                              peer_publish_rate_per_s=1e6, peer_publish_burst=10**6)) as srv:
        channel = srv.channel()
        seen: list[grpc.StatusCode] = []
        started = time.monotonic()

        @settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(data=st.data())
        def one(data: st.DataObject) -> None:
            rpc = data.draw(st.sampled_from(_RPCS))
            payload = data.draw(_payloads(rpc))
            code, details = srv.raw(*rpc, payload, channel=channel, timeout_s=FUZZ_CALL_TIMEOUT_S)
            assert code in _ANSWERS, (rpc, payload[:64], code, details)
            seen.append(code)
            if rpc[1] == "PublishMetadata" and code == grpc.StatusCode.OK:  # what it stored lists, both packages
                for service in (OURS, MX_SERVICE_NAME):
                    listed, answer = srv.raw(service, "ListSources", b"", channel=channel)
                    assert listed == grpc.StatusCode.OK, (rpc, payload[:64], service, answer)

        try:
            one()
        finally:
            channel.close()
        elapsed = time.monotonic() - started
        print(f"fuzz {grpc_impl}: {len(seen)} calls in {elapsed:.1f} s: "
              f"{ {c.name: seen.count(c) for c in set(seen)} }")
        assert len(seen) >= FUZZ_EXAMPLES
        assert _mx_listing(srv) is not None
        with MxClient(srv.address, timeout_s=5) as client:
            assert client.publish_metadata(identity("after/fuzz"), worker(), "after").success
            assert "after" in [r.worker_id for r in client.list_sources()]


def test_the_budget_and_ownership_flags_parse() -> None:
    from mxref.metadata.main import server_limits

    args = parse_argv(["server", "--max-record-bytes", "1000", "--max-store-bytes", "5000",
                       "--peer-publish-rate", "3.5", "--peer-publish-burst", "7",
                       "--mx-writes", "refused", "--reader-token-file", "/r"])
    assert isinstance(args, ServerFlags)
    limits = server_limits(args)
    assert (limits.max_record_bytes, limits.max_store_bytes) == (1000, 5000)
    assert (limits.peer_publish_rate_per_s, limits.peer_publish_burst) == (3.5, 7)
    assert MxWrites(args.mx_writes) is MxWrites.REFUSED and args.reader_token_file == "/r"
    with pytest.raises(ValueError, match="max_record_bytes"):
        ServerLimits(max_record_bytes=10, max_store_bytes=5)
    defaults_flags = parse_argv(["server"])
    assert isinstance(defaults_flags, ServerFlags)
    defaults = server_limits(defaults_flags)
    assert defaults.max_record_bytes == 8 << 20 and defaults.max_store_bytes == 2 << 30
    assert defaults_flags.mx_writes == "trusted"
