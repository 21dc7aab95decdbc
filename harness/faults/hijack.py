"""Hijack: a peer holding the run's valid token writes another worker's record.

``rogue_publisher`` stops at the token: a peer without it is refused before any rule about
records applies. A hijacker has the token (a compromised or buggy worker of the same fleet) and
knows the victim's ids (``ListSources`` tells anyone who may read). It tries one of three writes
of the victim's record, ``times`` times, ``every`` apart, through the run's credentials:

- ``republish``: ``PublishMetadata`` of the victim's ``(identity, worker_id)`` with the record
  moved: its endpoints and agent name the hijacker's (a closed port), its NIXL blob not the
  victim's, its status STALE (what a reader is offered of it changes at once);
- ``heartbeat``: ``UpdateStatus`` READY for it (keeping a dead worker's record listed);
- ``demote``: ``UpdateStatus`` STALE for it (taking a live worker out of the listing).

Each sends ``secret`` as the owner secret: ``forged`` (64 random hex digits, the shape of a real
one) or ``none``. A server that answers mxref.v1 UNIMPLEMENTED (ModelExpress's own) is written
through ``model_express.p2p``, whose messages carry no owner secret at all (``wire`` is recorded). What the server must do about it (refuse it: mxref's owner secret,
``mxref.metadata.ownership``) is for the checks to judge by what the server lists afterwards;
the fault records every answer (accepted, or the gRPC code). Its witness: the writes reached
the server and were answered on their merits; none answered (the server unreachable, or the
token refused: that is a rogue, not a hijack) is no effect. Nothing to heal: a write is done.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Literal, cast

import grpc
from pydantic import Field

from harness.errors import FaultError
from harness.faults import Fault, FaultContext, FaultSpec, Injected, register
from harness.record.witness import Witness
from harness.spec import Duration, Name, Target
from mxref.mx import p2p_pb2 as mx_pb2
from mxref.mx import p2p_pb2_grpc as mx_pb2_grpc
from mxref.security import ClientCredentials
from mxref.v1 import p2p_pb2, p2p_pb2_grpc

__all__ = ["Hijack", "HijackSpec"]

HijackWrite = Literal["republish", "heartbeat", "demote"]
MOVED_ENDPOINT = "127.0.0.1:9"  # the discard port: nothing serves a reader there
MOVED_AGENT = "mxchaos-hijacker"
# answers on the merits: the call got past the token check to the record's rules
_NOT_ANSWERED = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAUTHENTICATED}


class HijackSpec(FaultSpec):
    """Write the record of source ``target`` on ``server`` with the run's token, as another peer."""

    kind: Literal["hijack"]
    target: Name  # the victim: a source process (its last `published` ids)
    server: Name  # the metadata server written to
    write: HijackWrite
    secret: Literal["forged", "none"] = "forged"
    times: int = Field(1, ge=1, le=1000)
    every: Duration = 0.2
    timeout: Duration = 5.0  # each RPC, and the wait for the victim's ids and the server's port

    def process_refs(self) -> tuple[str, ...]:
        return (self.target, self.server)

    def running_refs(self) -> tuple[Target, ...]:
        return (self.server,)  # the victim may be dead: keeping its record alive is one of the writes

    def process_issues(self, processes: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
        issues = []
        for key, name, role in (("target", self.target, "source"), ("server", self.server, "server")):
            spec = processes.get(name)
            if spec is not None and getattr(spec, "role", None) != role:
                issues.append((key, f"{name!r} is a {getattr(spec, 'role', None)} process; hijack's {key} is a {role}"))
        return tuple(issues)


@register
class Hijack(Fault[HijackSpec, None]):
    kind = "hijack"
    Spec = HijackSpec

    def inject(self, ctx: FaultContext) -> Injected[None]:
        spec = self.spec
        published = ctx.wait_event(spec.target, "published", {}, spec.timeout)
        sid, wid = str(published["mx_source_id"]), str(published["worker_id"])
        port = int(ctx.wait_event(spec.server, "listening", {"what": "grpc"}, spec.timeout)["port"])
        address = f"{ctx.locate(spec.server).address}:{port}"
        creds = ctx.credentials
        client = (ClientCredentials.from_files(ca=creds.ca_cert, token_file=creds.token)
                  if creds is not None and creds.tls else ClientCredentials())
        secret = secrets.token_hex(32) if spec.secret == "forged" else ""
        answers: list[dict[str, Any]] = []
        channel = client.channel(address)
        try:
            wire = _Wire.V1
            try:
                before = _record(wire, channel, sid, wid, spec.timeout)
            except grpc.RpcError:  # UNIMPLEMENTED: ModelExpress's own server
                wire = _Wire.MX
                before = _record(wire, channel, sid, wid, spec.timeout)
            if before is None and spec.write == "republish":
                raise FaultError(f"hijack {spec.target}: {address} has no record {sid}/{wid} to copy")
            for n in range(spec.times):
                if n:
                    ctx.sleep(spec.every)
                answers.append(_write(wire, channel, spec, sid, wid, secret, before, spec.timeout))
            try:
                after = _record(wire, channel, sid, wid, spec.timeout)
            except grpc.RpcError:
                after = None
        finally:
            channel.close()
        accepted = sum(1 for a in answers if a["accepted"])
        answered = sum(1 for a in answers if a["code"] not in {c.name for c in _NOT_ANSWERED})
        figures = {"writes": len(answers), "answered": answered, "accepted": accepted}
        codes = sorted({a["code"] for a in answers})
        if answered:
            witness = Witness.seen(f"{answered} of {len(answers)} {spec.write} writes answered by the server "
                                   f"({', '.join(codes)}; {accepted} accepted)", **figures)
        else:
            witness = Witness.none(f"no {spec.write} write was answered on its merits ({', '.join(codes)})", **figures)
        return Injected(None, {"target": spec.target, "server": address, "mx_source_id": sid, "worker_id": wid,
                               "write": spec.write, "secret": spec.secret if wire is _Wire.V1 else "not sent (model_express.p2p has none)",
                               "wire": wire.value, "accepted": accepted,
                               "refused": len(answers) - accepted, "codes": codes,
                               "first": answers[0], "record_before": _summary(before),
                               "record_after": _summary(after), "witness": witness.to_json()})


class _Wire(StrEnum):
    V1 = "mxref.v1"
    MX = "model_express.p2p"

    @property
    def pb(self) -> Any:
        """The package's messages (numbered alike; only mxref.v1 has owner_secret)."""
        return p2p_pb2 if self is _Wire.V1 else mx_pb2

    def stub(self, channel: grpc.Channel) -> Any:
        return (p2p_pb2_grpc if self is _Wire.V1 else mx_pb2_grpc).P2pServiceStub(channel)


def _record(wire: _Wire, channel: grpc.Channel, sid: str, wid: str, timeout: float) -> Any:
    """The record as the server gives it to anyone (None: not found). UNIMPLEMENTED raises (the
    wire is wrong); any other failure is None."""
    try:
        answer = wire.stub(channel).GetMetadata(wire.pb.GetMetadataRequest(mx_source_id=sid, worker_id=wid), timeout=timeout)
    except grpc.RpcError as exc:
        if cast(grpc.Call, exc).code() == grpc.StatusCode.UNIMPLEMENTED:
            raise
        return None
    return answer if answer.found else None


def _summary(record: Any) -> dict[str, Any] | None:
    if record is None:
        return None
    w = record.worker
    return {"status": w.DESCRIPTOR.fields_by_name["status"].enum_type.values_by_number[w.status].name,
            "agent_name": w.agent_name, "worker_grpc_endpoint": w.worker_grpc_endpoint,
            "metadata_endpoint": w.metadata_endpoint}


def _write(wire: _Wire, channel: grpc.Channel, spec: HijackSpec, sid: str, wid: str, secret: str, before: Any,
           timeout: float) -> dict[str, Any]:
    """One write; ``{accepted, code, message}`` (code ``OK`` when the call returned)."""
    pb, stub = wire.pb, wire.stub(channel)
    owner = {"owner_secret": secret} if wire is _Wire.V1 else {}
    try:
        if spec.write == "republish":
            assert before is not None
            worker = pb.WorkerMetadata()
            worker.CopyFrom(before.worker)
            worker.agent_name = MOVED_AGENT
            worker.status = pb.SOURCE_STATUS_STALE
            if worker.worker_grpc_endpoint:
                worker.worker_grpc_endpoint = MOVED_ENDPOINT
            if worker.metadata_endpoint:
                worker.metadata_endpoint = MOVED_ENDPOINT
            if worker.HasField("nixl_metadata"):
                worker.nixl_metadata = b"hijacked"
            answer = stub.PublishMetadata(pb.PublishMetadataRequest(
                identity=before.identity, worker=worker, worker_id=wid, **owner), timeout=timeout)
        else:
            status = pb.SOURCE_STATUS_READY if spec.write == "heartbeat" else pb.SOURCE_STATUS_STALE
            rank = before.worker.worker_rank if before is not None else 0
            answer = stub.UpdateStatus(pb.UpdateStatusRequest(
                mx_source_id=sid, worker_id=wid, worker_rank=rank, status=status, **owner), timeout=timeout)
    except grpc.RpcError as exc:
        call = cast(grpc.Call, exc)
        return {"accepted": False, "code": call.code().name, "message": str(call.details())[:300]}
    return {"accepted": bool(answer.success), "code": "OK", "message": str(answer.message)[:300]}
