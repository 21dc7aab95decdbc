"""The ``hijack`` fault over the fake context and a fake P2pService stub: it writes the victim's
ids (its ``published`` event) to the server's gRPC port (its ``listening what=grpc`` event), moves
a republished record's endpoints, sends a forged or no owner secret, records every answer and the
record before and after, and witnesses only answers on the merits (a refused token or an
unreachable server is no effect); a target that is not a source is refused at validation."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from fixtures.fault_context import FakeContext

from harness.faults import make_fault
from harness.faults.hijack import MOVED_ENDPOINT, HijackSpec
from harness.scenario.models import ServerProcess, SourceProcess
from mxref.mx import p2p_pb2 as mx_pb2
from mxref.mx import p2p_pb2_grpc as mx_pb2_grpc
from mxref.v1 import p2p_pb2, p2p_pb2_grpc


class Refused(grpc.RpcError):  # type: ignore[misc]
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class FakeStub:
    """A server with one record; ``refuse``: the code every write is refused with (None: accepted)."""

    refuse: grpc.StatusCode | None = grpc.StatusCode.PERMISSION_DENIED
    calls: list[tuple[str, Any]] = []

    def __init__(self, channel: Any) -> None:
        self.worker = p2p_pb2.WorkerMetadata(worker_rank=0, agent_name="victim-agent", status=p2p_pb2.SOURCE_STATUS_READY,
                                             worker_grpc_endpoint="10.0.0.2:5000", metadata_endpoint="10.0.0.2:5001")

    def GetMetadata(self, request: Any, timeout: float) -> Any:
        FakeStub.calls.append(("GetMetadata", request))
        return p2p_pb2.GetMetadataResponse(found=True, worker=self.worker, mx_source_id=request.mx_source_id,
                                           worker_id=request.worker_id)

    def _write(self, method: str, request: Any, response: Any) -> Any:
        FakeStub.calls.append((method, request))
        if FakeStub.refuse is not None:
            raise Refused(FakeStub.refuse, "worker w1 of source s1: not its owner")
        return response

    def PublishMetadata(self, request: Any, timeout: float) -> Any:
        return self._write("PublishMetadata", request, p2p_pb2.PublishMetadataResponse(success=True))

    def UpdateStatus(self, request: Any, timeout: float) -> Any:
        return self._write("UpdateStatus", request, p2p_pb2.UpdateStatusResponse(success=True, message="READY"))


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> type[FakeStub]:
    FakeStub.calls, FakeStub.refuse = [], grpc.StatusCode.PERMISSION_DENIED
    monkeypatch.setattr(p2p_pb2_grpc, "P2pServiceStub", FakeStub)
    return FakeStub


@pytest.fixture
def ctx() -> FakeContext:
    ctx = FakeContext()
    ctx.add_process("victim")
    ctx.add_process("server", role="server")
    ctx.events[("victim", "published")] = {"t": 1.0, "mx_source_id": "s1", "worker_id": "w1"}
    ctx.events[("server", "listening")] = {"t": 0.5, "what": "grpc", "port": 50051}
    return ctx


def spec(write: str, **keys: Any) -> HijackSpec:
    return HijackSpec.model_validate({"kind": "hijack", "target": "victim", "server": "server", "write": write, **keys})


def test_a_refused_republish_is_recorded_with_the_moved_record_it_tried(ctx: FakeContext, stub: type[FakeStub]) -> None:
    injected = make_fault(spec("republish", times=3, every=0.1), "hijack").inject(ctx)
    record = injected.record
    assert record["accepted"] == 0 and record["refused"] == 3 and record["codes"] == ["PERMISSION_DENIED"]
    assert record["witness"]["effect"] == "seen" and record["witness"]["figures"] == {"writes": 3, "answered": 3, "accepted": 0}
    assert record["record_before"]["agent_name"] == "victim-agent"
    publishes = [r for m, r in stub.calls if m == "PublishMetadata"]
    assert len(publishes) == 3
    sent = publishes[0]
    assert sent.worker_id == "w1" and len(sent.owner_secret) == 64  # forged: the shape of a real one
    assert sent.worker.worker_grpc_endpoint == MOVED_ENDPOINT and sent.worker.metadata_endpoint == MOVED_ENDPOINT
    assert sent.worker.status == p2p_pb2.SOURCE_STATUS_STALE and sent.worker.agent_name != "victim-agent"
    assert ctx.recorded("sleep") == [(0.1,), (0.1,)]
    assert ("server", "listening", {"what": "grpc"}, 5.0) in ctx.recorded("wait")


@pytest.mark.parametrize(("write", "status"), [("heartbeat", p2p_pb2.SOURCE_STATUS_READY),
                                               ("demote", p2p_pb2.SOURCE_STATUS_STALE)])
def test_heartbeat_and_demote_send_update_status_for_the_victims_ids(ctx: FakeContext, stub: type[FakeStub],
                                                                    write: str, status: int) -> None:
    stub.refuse = None
    record = make_fault(spec(write, secret="none"), "hijack").inject(ctx).record
    [(method, sent)] = [(m, r) for m, r in stub.calls if m != "GetMetadata"]
    assert method == "UpdateStatus" and sent.status == status
    assert (sent.mx_source_id, sent.worker_id, sent.owner_secret) == ("s1", "w1", "")
    assert record["accepted"] == 1 and record["witness"]["effect"] == "seen"


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNAVAILABLE])
def test_writes_not_answered_on_their_merits_are_no_effect(ctx: FakeContext, stub: type[FakeStub],
                                                           code: grpc.StatusCode) -> None:
    stub.refuse = code
    record = make_fault(spec("demote", times=2, every=0.01), "hijack").inject(ctx).record
    assert record["witness"]["effect"] == "none" and record["codes"] == [code.name]


def test_the_target_must_be_a_source_and_the_server_a_server() -> None:
    processes = {"victim": SourceProcess(role="source"), "server": ServerProcess(role="server")}
    assert spec("demote").process_issues(processes) == ()
    swapped = HijackSpec.model_validate({"kind": "hijack", "target": "server", "server": "victim", "write": "demote"})
    issues = dict(swapped.process_issues(processes))
    assert "source" in issues["target"] and "server" in issues["server"]
    assert spec("heartbeat").running_refs() == ("server",)  # a dead victim's record is fair game


def test_a_server_without_mxref_v1_is_written_through_model_express_p2p_with_no_secret(
        ctx: FakeContext, stub: type[FakeStub], monkeypatch: pytest.MonkeyPatch) -> None:
    class V1Unimplemented(FakeStub):
        def GetMetadata(self, request: Any, timeout: float) -> Any:
            raise Refused(grpc.StatusCode.UNIMPLEMENTED, "unknown service mxref.v1.P2pService")

    monkeypatch.setattr(p2p_pb2_grpc, "P2pServiceStub", V1Unimplemented)
    monkeypatch.setattr(mx_pb2_grpc, "P2pServiceStub", FakeStub)
    stub.refuse = None
    record = make_fault(spec("demote"), "hijack").inject(ctx).record
    [sent] = [r for m, r in stub.calls if m == "UpdateStatus"]
    assert isinstance(sent, mx_pb2.UpdateStatusRequest) and sent.status == mx_pb2.SOURCE_STATUS_STALE
    assert record["wire"] == "model_express.p2p" and record["accepted"] == 1
    assert record["record_before"]["status"] == "SOURCE_STATUS_READY"
