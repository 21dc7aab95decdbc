"""The mxref server answers ModelExpress's ``model_express.p2p.P2pService`` over real loopback gRPC.

Requests are built, and answers read, with the published client's own message classes (from
the ``modelexpress==0.7.0`` wheel, in a descriptor pool of their own) when the wheel is at hand,
else with ours (``mxref.mx``, which ``test_mx_wire`` pins to the client's). Pins: the server
computes ``mx_source_id`` (ModelExpress's three test vectors, through the MX path), READY
freshness at query time, ``UpdateStatus`` as the heartbeat (and its ``source_load``), negative
answers as ``success=false`` / ``found=false`` / empty lists, the fields only one side knows
surviving the store, and one store behind both packages.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from harness.subjects import wire
from mxref.config import ServerTimers
from mxref.metadata.servicer import P2pServicer
from mxref.metadata.store import Store
from mxref.metadata.transport import GRPC_IMPLS, start_metadata_server
from mxref.metrics import ServerMetrics
from mxref.roles.client import MxClient
from mxref.v1 import p2p_pb2

T0 = 1_800_000_000.0
TIMERS = ServerTimers(heartbeat_timeout_s=90, reaper_scan_interval_s=30, gc_timeout_s=3600)
READY, STALE = 2, 3
SERVICE = "/model_express.p2p.P2pService/"
RESPONSES = {"PublishMetadata": "PublishMetadataResponse", "ListSources": "ListSourcesResponse",
             "GetMetadata": "GetMetadataResponse", "UpdateStatus": "UpdateStatusResponse"}


class ManualClock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def mx() -> dict[str, type[Any]]:
    return wire.client_or_our_classes()


@dataclass
class Mx:
    classes: dict[str, type[Any]]
    channel: grpc.Channel
    clock: ManualClock
    store: Store
    client: MxClient  # mxref.v1, the same server

    def call(self, method: str, **fields: Any) -> Any:
        request = self.classes[f"{method}Request"](**fields)
        return self.raw(method, request.SerializeToString())

    def raw(self, method: str, data: bytes) -> Any:
        rpc = self.channel.unary_unary(SERVICE + method, request_serializer=None,
                                       response_deserializer=self.classes[RESPONSES[method]].FromString)
        return rpc(data, timeout=5)

    def identity(self, model: str = "acme/model-a", **fields: Any) -> Any:
        return self.classes["SourceIdentity"](mx_version="0.7.0", model_name=model, backend_framework=1,
                                              tensor_parallel_size=1, dtype="float32", **fields)

    def worker(self, rank: int = 0, **fields: Any) -> Any:
        return self.classes["WorkerMetadata"](worker_rank=rank, metadata_endpoint="127.0.0.1:5555", agent_name=f"mx-{rank}",
                                              worker_grpc_endpoint="127.0.0.1:6555", accelerator="cpu", **fields)

    def publish(self, worker_id: str, identity: Any = None, worker: Any = None) -> str:
        response = self.call("PublishMetadata", identity=identity if identity is not None else self.identity(),
                             worker=worker if worker is not None else self.worker(), worker_id=worker_id)
        assert response.success, response.message
        sid: str = response.mx_source_id
        return sid

    def ready(self, sid: str, worker_id: str, rank: int = 0, **fields: Any) -> Any:
        return self.call("UpdateStatus", mx_source_id=sid, worker_id=worker_id, worker_rank=rank, status=READY, **fields)

    def list_ready(self, **fields: Any) -> list[Any]:
        return list(self.call("ListSources", identity=self.identity(), status_filter=READY, **fields).instances)


@pytest.fixture(params=GRPC_IMPLS)
def stack(mx: dict[str, type[Any]], request: pytest.FixtureRequest) -> Iterator[Mx]:
    """On each gRPC implementation (grpcio, native): ModelExpress's package is answered the same."""
    clock = ManualClock()
    store = Store(clock)
    servicer = P2pServicer(store, TIMERS, metrics=ServerMetrics().server)
    server, port = start_metadata_server(servicer, "127.0.0.1", 0, grpc_impl=request.param)
    client = MxClient(f"127.0.0.1:{port}", timeout_s=5)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield Mx(mx, channel, clock, store, client)
    finally:
        client.close()
        server.stop(0).wait(5)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({}, "5a5f555570065064"),
        ({"revision": "abc123def4567890"}, "d0c184b2a9a34c82"),
        ({"extra_parameters": {"Foo": "a", "foo": "b"}}, "bf71fb9340cd940a"),
    ],
    ids=["base", "revision", "extra-case-collision"],
)
def test_the_server_computes_modelexpress_source_ids(stack: Mx, extra: dict[str, Any], expected: str) -> None:
    identity = stack.classes["SourceIdentity"](
        mx_version="0.5.0", mx_source_type=0, model_name="deepseek-ai/DeepSeek-V3", backend_framework=1,
        tensor_parallel_size=8, pipeline_parallel_size=1, expert_parallel_size=0, dtype="bfloat16", **extra,
    )
    assert stack.publish("w1", identity=identity) == expected


def test_ready_comes_from_the_heartbeat_and_goes_with_its_silence(stack: Mx) -> None:
    sid = stack.publish("w1")
    assert stack.list_ready() == [], "a record the worker never marked READY was listed as READY"
    assert stack.ready(sid, "w1").success
    refs = stack.list_ready()
    assert [(r.mx_source_id, r.worker_id, r.updated_at) for r in refs] == [(sid, "w1", int(T0 * 1000))]
    stack.clock.now += TIMERS.heartbeat_timeout_s + 1
    assert stack.list_ready() == [], "a READY record past the heartbeat timeout was listed"
    got = stack.call("GetMetadata", mx_source_id=sid, worker_id="w1")
    assert got.found and got.worker.status == READY, "GetMetadata must still return a silent record"
    assert stack.ready(sid, "w1").success  # the next heartbeat makes it fresh again
    assert len(stack.list_ready()) == 1


def test_negative_answers_are_not_errors(stack: Mx) -> None:
    refused = stack.call("PublishMetadata", identity=stack.identity(model=""), worker=stack.worker(), worker_id="w1")
    assert not refused.success and "model_name" in refused.message
    no_worker_id = stack.call("PublishMetadata", identity=stack.identity(), worker=stack.worker(), worker_id="")
    assert not no_worker_id.success and "worker_id" in no_worker_id.message
    unknown = stack.call("UpdateStatus", mx_source_id="0" * 16, worker_id="nobody", worker_rank=0, status=READY)
    assert not unknown.success and "nobody" in unknown.message
    assert not stack.call("GetMetadata", mx_source_id="", worker_id="").found
    assert not stack.call("GetMetadata", mx_source_id="0" * 16, worker_id="nobody").found
    assert stack.list_ready() == []


def test_listing_carries_what_modelexpress_lifts(stack: Mx) -> None:
    identity = stack.identity(extra_parameters={"training_step": "42", "layout_signature": "sig-a"})
    sid = stack.publish("w1", identity=identity, worker=stack.worker(topology={"rack": "r1", "node": "n7"}))
    assert stack.ready(sid, "w1", source_load=0.25).success
    (ref,) = stack.call("ListSources", identity=identity, status_filter=READY).instances
    assert ref.training_step == 42 and ref.layout_signature == "sig-a"
    assert dict(ref.topology) == {"rack": "r1", "node": "n7"}
    assert ref.HasField("source_load") and ref.source_load == pytest.approx(0.25)
    stack.clock.now += 1.5  # a listing answers from what it built before only while nothing changed
    assert stack.ready(sid, "w1", source_load=0.75).success
    (ref,) = stack.call("ListSources", identity=identity, status_filter=READY).instances
    assert ref.source_load == pytest.approx(0.75) and ref.updated_at == int(stack.clock.now * 1000)
    refused = stack.ready(sid, "w1", rank=3, source_load=0.5)  # refused: the reading is forgotten
    assert not refused.success
    (ref,) = stack.call("ListSources", identity=identity, status_filter=READY).instances
    assert not ref.HasField("source_load")
    assert stack.ready(sid, "w1", source_load=0.25).success
    assert stack.ready(sid, "w1").success  # a heartbeat without a reading clears it
    (ref,) = stack.call("ListSources", identity=identity, status_filter=READY).instances
    assert not ref.HasField("source_load")


def test_version_is_a_training_step_too_and_filters_before_the_limit(stack: Mx) -> None:
    sids = {}
    for step, key in ((5, "version"), (9, "training_step"), (12, "training_step")):
        identity = stack.identity(extra_parameters={key: str(step)})
        sids[step] = stack.publish(f"w{step}", identity=identity)
        stack.clock.now += 1  # the newest is listed first
        assert stack.ready(sids[step], f"w{step}").success
    plain = stack.publish("plain")
    stack.clock.now += 1
    assert stack.ready(plain, "plain").success
    everything = stack.call("ListSources", identity=stack.identity(model=""), status_filter=READY).instances
    assert len(everything) == 4
    at_least_9 = stack.call("ListSources", identity=stack.identity(model=""), status_filter=READY, min_training_step=9)
    assert [r.training_step for r in at_least_9.instances] == [12, 9]
    one = stack.call("ListSources", identity=stack.identity(model=""), status_filter=READY, min_training_step=6, limit=1)
    assert [r.training_step for r in one.instances] == [12]
    newest_two = stack.call("ListSources", identity=stack.identity(model=""), status_filter=READY, limit=2)
    assert [r.worker_id for r in newest_two.instances] == ["plain", "w12"]
    since = stack.call("ListSources", identity=stack.identity(model=""), min_updated_at=int((T0 + 3) * 1000))
    assert sorted(r.worker_id for r in since.instances) == ["plain", "w12"]


def test_fields_only_one_side_knows_survive_the_store(stack: Mx) -> None:
    tensors = [stack.classes["TensorDescriptor"](name="w.0", addr=4096, size=64, device_id=0, dtype="torch.float32")]
    worker = stack.worker(topology={"rack": "r1"}, tensor_source=stack.classes["TensorSourceMetadata"](tensors=tensors))
    worker.tensors.extend(tensors)
    sid = stack.publish("w1", worker=worker)
    got = stack.call("GetMetadata", mx_source_id=sid, worker_id="w1").worker
    assert dict(got.topology) == {"rack": "r1"}
    assert list(got.tensor_source.tensors) == tensors and list(got.tensors) == tensors
    assert got.WhichOneof("source_payload") == "tensor_source"


def test_one_store_behind_both_packages(stack: Mx) -> None:
    """An MX worker is listed to an mxref reader, and an mxref worker to an MX reader, under one id."""
    mx_sid = stack.publish("mx-worker")
    assert stack.ready(mx_sid, "mx-worker").success
    ours = p2p_pb2.SourceIdentity(mx_version="0.7.0", model_name="acme/model-a", backend_framework=p2p_pb2.VLLM,
                                  tensor_parallel_size=1, dtype="float32")
    published = stack.client.publish_metadata(ours, p2p_pb2.WorkerMetadata(worker_rank=0, agent_name="ref"), "ref-worker")
    assert published.success and published.mx_source_id == mx_sid
    assert stack.client.update_status(mx_sid, "ref-worker", 0, p2p_pb2.SOURCE_STATUS_READY).success
    seen_by_mx = sorted(r.worker_id for r in stack.list_ready())
    seen_by_ref = sorted(r.worker_id for r in stack.client.list_sources(ours, status_filter=p2p_pb2.SOURCE_STATUS_READY))
    assert seen_by_mx == seen_by_ref == ["mx-worker", "ref-worker"]


def test_a_request_that_does_not_parse_is_invalid_argument(stack: Mx) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        stack.raw("ListSources", b"\x0a\xff\xff")  # field 1, a length running past the end
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "ListSources" in (caught.value.details() or "")
