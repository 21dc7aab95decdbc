"""The limits mxref adds (a server that trusts no client), over real loopback gRPC: each size,
count, range and enum limit refuses with INVALID_ARGUMENT naming the field, the size and the
limit, a rank past uint32 is refused rather than truncated, a client over its write rate or a
full store gets RESOURCE_EXHAUSTED, and every refusal is counted."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
from fixtures.metadata_stack import (
    P2P_STUB,
    READY,
    ManualClock,
    Stack,
    identity,
    make_stack,
    out_of_enum,
    publish,
    worker,
)
from fixtures.wire import field

from mxref.__main__ import parse_argv
from mxref.config import ServerLimits
from mxref.errors import MetadataServerError
from mxref.metadata.limits import ClientBuckets
from mxref.metadata.main import server_limits
from mxref.metadata.store import Store
from mxref.options import ServerFlags
from mxref.v1 import p2p_pb2

# --- limits: a server that trusts no client ------------------------------------------

LIMITS = ServerLimits(max_message_bytes=1 << 20, max_blob_bytes=1024, max_name_bytes=32, max_tensors=4,
                      max_worker_rank=7, publish_rate_per_s=1, publish_burst=1000, max_records=1000)


@pytest.fixture
def limited(tmp_path: Path, grpc_impl: str) -> Iterator[Stack]:
    yield from make_stack(tmp_path, limits=LIMITS, grpc_impl=grpc_impl)


@dataclass(frozen=True)
class Refusal:
    code: grpc.StatusCode | None
    details: str
    reason: str | None


def call_raw(address: str, method: str, payload: bytes) -> Refusal | None:
    """Send ``payload`` as the request of ``method``; the refusal, or None if it was served."""
    with grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 64 << 20)]) as channel:
        rpc = channel.unary_unary(f"/mxref.v1.P2pService/{method}", request_serializer=None,
                                  response_deserializer=None)
        try:
            rpc(payload, timeout=5)
        except grpc.RpcError as exc:
            call = cast("grpc.Call", exc)
            reasons = [value for key, value in (call.trailing_metadata() or ()) if key == "mxref-reject-reason"]
            return Refusal(call.code(), call.details() or "", str(reasons[0]) if reasons else None)
    return None


def good_publish(**worker_fields: Any) -> p2p_pb2.PublishMetadataRequest:
    request = p2p_pb2.PublishMetadataRequest(identity=identity(), worker=worker(), worker_id="w1")
    for name, value in worker_fields.items():
        setattr(request.worker, name, value)
    return request


def tensors(n: int) -> list[p2p_pb2.TensorDescriptor]:
    return [p2p_pb2.TensorDescriptor(name=f"t{i}", size=4, dtype="float16") for i in range(n)]


def publish_with(build: Callable[[p2p_pb2.PublishMetadataRequest], object]) -> bytes:
    request = good_publish()
    build(request)
    payload: bytes = request.SerializeToString()
    return payload


# A valid publish, then the same worker field again on the wire (protobuf merges it): the way to
# send a value no typed client can build.
RANK_PAST_UINT32 = good_publish().SerializeToString() + field(2, field(1, 2**32 + 5))

INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT
CASES: list[tuple[str, str, bytes, str, str]] = [
    # (id, method, request bytes, reason, what the message must say)
    ("blob", "PublishMetadata", good_publish(nixl_metadata=b"x" * 1025).SerializeToString(), "too_large",
     "worker.nixl_metadata is 1025 bytes, over the limit of 1024 bytes (--max-blob-bytes)"),
    ("model-name", "PublishMetadata", publish_with(lambda r: setattr(r.identity, "model_name", "m" * 33)),
     "too_large", "identity.model_name is 33 bytes, over the limit of 32 bytes (--max-name-bytes)"),
    ("worker-id", "PublishMetadata", publish_with(lambda r: setattr(r, "worker_id", "w" * 40)),
     "too_large", "worker_id is 40 bytes, over the limit of 32 bytes"),
    ("agent-name-utf8", "PublishMetadata", good_publish(agent_name="é" * 17).SerializeToString(),
     "too_large", "worker.agent_name is 34 bytes, over the limit of 32 bytes"),
    ("endpoint", "PublishMetadata", good_publish(metadata_endpoint="h" * 1025).SerializeToString(),
     "too_large", "worker.metadata_endpoint is 1025 bytes, over the limit of 1024 bytes"),
    ("tensor-source", "PublishMetadata",
     publish_with(lambda r: r.worker.tensor_source.tensors.extend(tensors(5))),
     "too_many", "worker.tensor_source.tensors has 5 entries, over the limit of 4 (--max-tensors)"),
    ("tensors", "PublishMetadata", publish_with(lambda r: r.worker.tensors.extend(tensors(5))),
     "too_many", "worker.tensors has 5 entries, over the limit of 4"),
    ("extra-parameters", "PublishMetadata",
     publish_with(lambda r: r.identity.extra_parameters.update({f"k{i}": "v" for i in range(65)})),
     "too_many", "identity.extra_parameters has 65 entries, over the limit of 64"),
    ("rank", "PublishMetadata", good_publish(worker_rank=8).SerializeToString(),
     "out_of_range", "worker.worker_rank is 8, outside the range 0..7 (--max-worker-rank)"),
    ("rank-past-uint32", "PublishMetadata", RANK_PAST_UINT32,
     "out_of_range", "worker.worker_rank is 4294967301, outside the range 0..7"),
    ("tp-past-uint32", "PublishMetadata",
     good_publish().SerializeToString() + field(1, field(5, 2**32)),
     "out_of_range", "identity.tensor_parallel_size is 4294967296, outside the range 0..4294967295"),
    ("status", "PublishMetadata", good_publish(status=out_of_enum(7)).SerializeToString(),
     "unknown_enum", "worker.status is 7, not a SourceStatus (known: 0, 1, 2, 3)"),
    ("backend", "PublishMetadata", good_publish().SerializeToString() + field(1, field(4, 9)),
     "unknown_enum", "identity.backend_framework is 9, not a BackendFramework"),
    ("malformed", "PublishMetadata", b"\xff\xff", "malformed", "PublishMetadataRequest (2 bytes) does not parse"),
    ("update-status", "UpdateStatus",
     p2p_pb2.UpdateStatusRequest(mx_source_id="s", worker_id="w1", status=out_of_enum(9)).SerializeToString(),
     "unknown_enum", "status is 9, not a SourceStatus"),
    ("update-rank-past-uint32", "UpdateStatus",
     p2p_pb2.UpdateStatusRequest(mx_source_id="s", worker_id="w1", status=READY).SerializeToString()
     + field(2, 2**32), "out_of_range", "worker_rank is 4294967296, outside the range 0..7"),
    ("list-rank", "ListSources", p2p_pb2.ListSourcesRequest(worker_rank_filter=8).SerializeToString(),
     "out_of_range", "worker_rank_filter is 8, outside the range 0..7"),
    ("list-status", "ListSources", p2p_pb2.ListSourcesRequest(status_filter=out_of_enum(5)).SerializeToString(),
     "unknown_enum", "status_filter is 5, not a SourceStatus"),
    ("list-model", "ListSources", p2p_pb2.ListSourcesRequest(model_name_filter="m" * 33).SerializeToString(),
     "too_large", "model_name_filter is 33 bytes, over the limit of 32 bytes"),
    ("get-source-id", "GetMetadata",
     p2p_pb2.GetMetadataRequest(mx_source_id="s" * 33, worker_id="w1").SerializeToString(),
     "too_large", "mx_source_id is 33 bytes, over the limit of 32 bytes"),
]


@pytest.mark.parametrize(("method", "payload", "reason", "says"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_request_over_a_limit_is_refused_naming_the_field_and_the_limit(
    limited: Stack, method: str, payload: bytes, reason: str, says: str
) -> None:
    refusal = call_raw(limited.address, method, payload)
    assert refusal is not None, f"{method} was served"
    assert refusal.code == INVALID_ARGUMENT
    assert refusal.details == f"{method}: {says}" or refusal.details.startswith(f"{method}: {says}")
    assert refusal.reason == reason
    registry = limited.metrics.registry
    assert registry.get_sample_value("mxref_server_rejected_requests_total", {"method": method, "reason": reason}) == 1
    assert registry.get_sample_value("mxref_server_rpcs_total", {"method": method, "result": "rejected"}) == 1
    assert len(limited.store) == 0
    assert limited.events("source_published") == []


def test_the_same_requests_within_the_limits_are_served(limited: Stack) -> None:
    """The control of the table above: at the limit, not over it, everything is accepted."""
    request = good_publish(nixl_metadata=b"x" * 1024, worker_rank=7, agent_name="é" * 16)
    request.identity.model_name = "m" * 32
    request.worker.tensor_source.tensors.extend(tensors(4))
    request.identity.extra_parameters.update({f"k{i}": "v" for i in range(64)})
    response = limited.raw_publish(request)
    assert response.success, response.message
    assert len(limited.store) == 1
    assert limited.client.list_sources(worker_rank=7, model_name="m" * 32)
    assert limited.metrics.registry.get_sample_value(
        "mxref_server_rejected_requests_total", {"method": "PublishMetadata", "reason": "too_large"}) is None


def test_a_negative_answer_is_counted_as_invalid(stack: Stack) -> None:
    response = stack.raw_publish(p2p_pb2.PublishMetadataRequest(worker=worker(), worker_id="w1"))
    assert not response.success
    assert stack.metrics.registry.get_sample_value(
        "mxref_server_rejected_requests_total", {"method": "PublishMetadata", "reason": "invalid"}) == 1


def test_a_message_over_the_receive_limit_never_reaches_a_handler(limited: Stack) -> None:
    """gRPC itself refuses it (RESOURCE_EXHAUSTED), before the servicer could count it."""
    refusal = call_raw(limited.address, "PublishMetadata", good_publish(nixl_metadata=b"x" * (2 << 20))
                       .SerializeToString())
    assert refusal is not None
    assert refusal.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "larger than max" in refusal.details
    assert len(limited.store) == 0


def test_a_client_over_its_write_rate_is_refused_and_others_are_not(tmp_path: Path, grpc_impl: str) -> None:
    rate_clock = ManualClock(0.0)
    limits = ServerLimits(publish_rate_per_s=1, publish_burst=3)
    stack = make_stack(tmp_path, limits=limits, rate_clock=rate_clock, grpc_impl=grpc_impl)
    s = next(stack)
    try:
        sid = publish(s, "w1")
        publish(s, "w2")
        s.client.update_status(sid, "w1", 0, READY)  # a heartbeat spends from the same bucket
        with pytest.raises(MetadataServerError) as refused:
            s.client.publish_metadata(identity(), worker(), "w3")
        assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "over the write rate of 1/s, burst 3, per client" in str(refused.value)
        with pytest.raises(MetadataServerError) as heartbeat:
            s.client.update_status(sid, "w1", 0, READY)
        assert heartbeat.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert len(s.client.list_sources()) == 2  # reads are not rate-limited
        # Another connection, another bucket (channels of one process share a connection unless told not to).
        with grpc.insecure_channel(s.address, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
            other: p2p_pb2.PublishMetadataResponse = P2P_STUB(channel).PublishMetadata(
                p2p_pb2.PublishMetadataRequest(identity=identity(), worker=worker(), worker_id="w3"), timeout=5)
            assert other.success, other.message
        rate_clock.advance(1.0)
        publish(s, "w4")
        with pytest.raises(MetadataServerError):
            s.client.publish_metadata(identity(), worker(), "w5")
        registry = s.metrics.registry
        assert registry.get_sample_value(
            "mxref_server_rejected_requests_total", {"method": "PublishMetadata", "reason": "rate_limited"}) == 2
        assert registry.get_sample_value(
            "mxref_server_rejected_requests_total", {"method": "UpdateStatus", "reason": "rate_limited"}) == 1
        assert {r.worker_id for r in s.store.snapshot()} == {"w1", "w2", "w3", "w4"}
    finally:
        stack.close()


def test_a_full_store_refuses_new_records_but_not_replacements(tmp_path: Path, grpc_impl: str) -> None:
    stack = make_stack(tmp_path, store=Store(ManualClock(), max_records=2), grpc_impl=grpc_impl)
    s = next(stack)
    try:
        publish(s, "w1")
        publish(s, "w2")
        with pytest.raises(MetadataServerError) as full:
            s.client.publish_metadata(identity(), worker(), "w3")
        assert full.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "holds 2 records, its limit (--max-records)" in str(full.value)
        publish(s, "w1", status=READY)  # a restart re-publishing its key always fits
        assert s.metrics.registry.get_sample_value(
            "mxref_server_rejected_requests_total", {"method": "PublishMetadata", "reason": "store_full"}) == 1
    finally:
        stack.close()


def test_client_buckets_refill_and_stay_bounded() -> None:
    clock = ManualClock(0.0)
    buckets = ClientBuckets(2.0, 2, clock=clock, max_clients=3)
    assert [buckets.take("a") for _ in range(3)] == [True, True, False]
    clock.advance(0.5)
    assert [buckets.take("a"), buckets.take("a")] == [True, False]
    for key in ("b", "c", "d", "e"):
        buckets.take(key)
    assert len(buckets) <= 3
    clock.advance(10)  # every bucket refilled: all prunable
    buckets.take("f")
    assert len(buckets) <= 3
    assert buckets.take("a") and buckets.take("a") and not buckets.take("a")


def test_server_limits_refuse_inconsistent_values() -> None:
    with pytest.raises(ValueError, match="max_blob_bytes=16 must be below max_message_bytes=16"):
        ServerLimits(max_message_bytes=16, max_blob_bytes=16)
    with pytest.raises(ValueError, match="publish_rate_per_s"):
        ServerLimits(publish_rate_per_s=float("nan"))
    with pytest.raises(ValueError, match="max_worker_rank"):
        ServerLimits(max_worker_rank=2**32)


def test_limit_flags_reach_the_servicer() -> None:
    args = parse_argv(["server", "--max-blob-bytes", "10", "--max-worker-rank", "3", "--publish-rate", "0.5",
                       "--publish-burst", "2", "--max-records", "9", "--max-tensors", "5",
                       "--max-name-bytes", "12", "--max-message-bytes", "1000"])
    assert isinstance(args, ServerFlags)
    assert server_limits(args) == ServerLimits(
        max_message_bytes=1000, max_blob_bytes=10, max_name_bytes=12, max_tensors=5, max_worker_rank=3,
        publish_rate_per_s=0.5, publish_burst=2, max_records=9)
    defaults = parse_argv(["server"])
    assert isinstance(defaults, ServerFlags) and server_limits(defaults) == ServerLimits()
    with pytest.raises(SystemExit):
        parse_argv(["server", "--publish-rate", "0"])
